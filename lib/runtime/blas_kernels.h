#pragma once
// Which of OpenBLAS's kernel sets the process runs.
//
// Debian's OpenBLAS (0.3.21, built DYNAMIC_ARCH) picks its kernels once, when it is loaded, from the
// CPU's family and model numbers. A model it does not know falls back to the Prescott kernels,
// written for SSE3. This happens on the AVX-512 Xeon these benchmarks run on (family 6, model 207,
// newer than the release): every sgemm then ran at a fraction of the speed the CPU's AVX-512 gives.
// OpenBLAS reaches Prescott from the family-6 branch of its model table, before its own
// feature-based fall-back (SkylakeX, Haswell, ...) is ever consulted; so Prescott on a CPU with AVX
// can only mean "model unknown". ensure_blas_kernels() repairs exactly that case: it selects the
// kernel set the CPU's features allow (SkylakeX, Haswell or Sandybridge), as OPENBLAS_CORETYPE
// would at load time. Any other pick, an OPENBLAS_CORETYPE the user set, or an OpenBLAS built
// without run-time kernel selection is left alone; OPENBLAS_CORETYPE=Prescott keeps the old
// kernels. An OpenBLAS that knows the model makes all of this a no-op.
#include <string>

namespace mpq::rt {

struct BlasKernels {
  std::string detected;  // what OpenBLAS picked when it was loaded ("" if it cannot say)
  std::string active;    // what runs now
  std::string reason;    // why they differ, or why nothing was changed
};

// Idempotent and cheap after the first call. The first call swaps OpenBLAS's kernel table (for a
// moment there is none) and sets an environment variable and puts it back, so it must come before any
// other thread calls BLAS or reads the environment: mpq's main calls it first thing, and
// ThreadPool's constructor, before any GEMM, for programs that use the library directly.
const BlasKernels& ensure_blas_kernels();

// The selection itself, uncached: the test simulates the fall-back (switch_blas_kernels("Prescott"))
// and checks that this repairs it. Same contract.
BlasKernels select_blas_kernels();

// Selects OpenBLAS's kernel set `name` as OPENBLAS_CORETYPE would at load time (an unknown name
// gives OpenBLAS's own fall-back) and returns what runs now; "" without run-time selection, where
// nothing changes. Same contract as ensure_blas_kernels().
std::string switch_blas_kernels(const std::string& name);

// The kernel set the CPU's features allow ("SkylakeX", "Haswell", "Sandybridge"), or "" when it has
// no AVX. Exposed for the test.
std::string blas_kernels_for_this_cpu();

// Whether OpenBLAS runs a kernel set without AVX-512 on a CPU that has the AVX-512 its SkylakeX
// kernels use: an OPENBLAS_CORETYPE such as Haswell in the environment, which mpq leaves alone (an
// AMD Zen 5 development machine sets it for every process). Then OpenBLAS's sgemm runs at about
// half the speed the CPU allows, while oneDNN picks its kernels from the CPU itself, and mpq sends
// more of its GEMMs to oneDNN (runtime/cpu/matmul_onednn.cpp). Also true for an OpenBLAS built for
// one older target only, which names it. False when the BLAS cannot say which kernels run (no
// openblas_get_corename). Cheap: call it per GEMM.
bool blas_kernels_below_cpu();

}  // namespace mpq::rt
