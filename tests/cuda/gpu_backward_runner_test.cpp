// The backward cases of backward_cases.h on a GPU: run_backward_node with the __global__ launchers,
// cuDNN's backward-data / backward-filter and cuBLASLt (gpu_ops_table) and real device memory,
// compared with mpq's CPU backward kernels (a looser tolerance than the host run: the libraries sum
// in other orders). Written after the H100 session: not yet run on a GPU. Skipped, with the reason,
// without a GPU.
#include "backward_cases.h"
#include "gpu_support.h"

using namespace mpq;
using namespace mpq::test;

TEST_CASE("backward runner on the GPU matches the CPU backward kernels", "[cuda][gpu][train]") {
  MPQ_REQUIRE_GPU();
  test::CudaMemory mem;
  run_backward_cases(mpq::cuda::gpu_ops_table(), mem, 1e-3, 1e-4);
  // The cases run on the default stream: release its cuDNN handle (compute-sanitizer's leak check).
  mpq::cuda::gpu_ops_table().release_stream(nullptr);
}
