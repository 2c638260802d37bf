#include "runtime/blas_kernels.h"

#include <spdlog/spdlog.h>
#include <strings.h>

#include <cstdlib>
#include <mutex>

// OpenBLAS's run-time kernel selection (DYNAMIC_ARCH builds only). Declared weak so that a build
// linked against an OpenBLAS built without DYNAMIC_ARCH still links; then nothing is changed.
extern "C" {
char* openblas_get_corename(void) __attribute__((weak));
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
}

namespace mpq::rt {

std::string blas_kernels_for_this_cpu() {
  __builtin_cpu_init();
  // OpenBLAS's SkylakeX kernels use AVX-512 F, CD, BW, DQ and VL (the Skylake server set); GCC's
  // checks include the operating system's support for the wider register state. Not Cooperlake:
  // in 0.3.21 it adds only bfloat16 GEMMs (its sgemm is SkylakeX's), and OPENBLAS_CORETYPE cannot
  // name it there (force_coretype stops one entry short of it).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  if (__builtin_cpu_supports("avx")) return "Sandybridge";
  return "";
}

namespace {

std::string current_corename() {
  if (openblas_get_corename == nullptr) return "";
  const char* name = openblas_get_corename();
  return name == nullptr ? "" : name;
}

bool runtime_selection() {
  return openblas_get_corename != nullptr && gotoblas_dynamic_init != nullptr && gotoblas_dynamic_quit != nullptr;
}

}  // namespace

std::string switch_blas_kernels(const std::string& name) {
  if (!runtime_selection()) return "";
  // gotoblas_dynamic_init() does nothing while a kernel set is selected, and reads
  // OPENBLAS_CORETYPE as it does at load time. The variable is set back as it was (removed, or
  // the user's value) so that child processes select for themselves.
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const std::string previous = user ? user : "";
  const bool had_previous = user != nullptr;
  setenv("OPENBLAS_CORETYPE", name.c_str(), 1);
  gotoblas_dynamic_quit();
  gotoblas_dynamic_init();
  if (had_previous) {
    setenv("OPENBLAS_CORETYPE", previous.c_str(), 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
  return current_corename();
}

BlasKernels select_blas_kernels() {
  BlasKernels k;
  k.detected = current_corename();
  k.active = k.detected;
  if (!runtime_selection()) {
    k.reason = "this BLAS does not choose its kernels at run time";
    return k;
  }
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    k.reason = "OPENBLAS_CORETYPE is set";
    return k;
  }
  // Prescott is OpenBLAS's fall-back for a CPU model missing from its table. On a CPU with AVX
  // (anything since 2011) it cannot be the right pick; anything else OpenBLAS chose is kept.
  if (strcasecmp(k.detected.c_str(), "Prescott") != 0) {
    k.reason = "OpenBLAS recognised this CPU";
    return k;
  }
  const std::string wanted = blas_kernels_for_this_cpu();
  if (wanted.empty()) {
    k.reason = "this CPU has no AVX";
    return k;
  }
  k.active = switch_blas_kernels(wanted);
  k.reason = "OpenBLAS did not know this CPU model and fell back to its SSE3 (Prescott) kernels";
  if (strcasecmp(k.active.c_str(), wanted.c_str()) != 0) {
    k.reason = "OpenBLAS fell back to its SSE3 (Prescott) kernels; asked for " + wanted + ", it kept " + k.active;
    spdlog::warn("OpenBLAS: asked for its {} kernels, runs {}", wanted, k.active);
  }
  return k;
}

bool blas_kernels_below_cpu() {
  static const bool cpu_has_avx512 = blas_kernels_for_this_cpu() == "SkylakeX";
  if (!cpu_has_avx512 || openblas_get_corename == nullptr) return false;
  // OpenBLAS 0.3.21's kernel sets with an AVX-512 sgemm (Cooperlake reuses SkylakeX's; later
  // releases add SapphireRapids).
  const char* name = openblas_get_corename();
  if (name == nullptr) return false;
  for (const char* avx512 : {"SkylakeX", "Cooperlake", "SapphireRapids"})
    if (strcasecmp(name, avx512) == 0) return false;
  return true;
}

const BlasKernels& ensure_blas_kernels() {
  static std::once_flag once;
  static BlasKernels kernels;
  std::call_once(once, [] { kernels = select_blas_kernels(); });
  return kernels;
}

}  // namespace mpq::rt
