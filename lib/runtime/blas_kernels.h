#pragma once
// Which of OpenBLAS's kernel sets the process runs.
//
// Debian's OpenBLAS (0.3.21, built DYNAMIC_ARCH) picks its kernels once, when it is loaded, from the
// CPU's family and model numbers. A model it does not know falls back to the Prescott kernels,
// written for SSE3. This happens on the AVX-512 Xeon these benchmarks run on (family 6, model 207,
// newer than the release): every sgemm then ran at a fraction of the speed the CPU's AVX-512 gives.
// ensure_blas_kernels() repairs exactly that case: where OpenBLAS fell back to Prescott on a CPU
// that has AVX2 or AVX-512 (so its model is simply newer than the table), it selects the kernel set
// the CPU's features allow (SkylakeX, Haswell or Sandybridge), as OPENBLAS_CORETYPE would at load
// time. Any other pick, an OPENBLAS_CORETYPE the user set, or a build without run-time kernel
// selection is left alone; OPENBLAS_CORETYPE=Prescott keeps the old kernels.
#include <string>

namespace mpq::rt {

struct BlasKernels {
  std::string detected;  // what OpenBLAS picked when it was loaded ("" if it cannot say)
  std::string active;    // what runs now
  std::string reason;    // why they differ, or why nothing was changed
};

// Idempotent and cheap after the first call; the first call must come before any other thread
// calls BLAS (ThreadPool's constructor and mpq's main call it).
const BlasKernels& ensure_blas_kernels();

// The kernel set the CPU's features allow ("SkylakeX", "Haswell", "Sandybridge"), or "" when it has
// no AVX. Exposed for the test.
std::string blas_kernels_for_this_cpu();

}  // namespace mpq::rt
