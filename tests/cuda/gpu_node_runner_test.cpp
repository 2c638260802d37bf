// The node cases of node_cases.h on a GPU: plan_node -> run_planned_node with the __global__
// launchers (gpu_ops_table) and real device memory (cudaMalloc/cudaMemcpy), compared with mpq's CPU
// kernels. Skipped, with the reason, without a GPU.
#include "gpu_support.h"
#include "node_cases.h"

using namespace mpq;
using namespace mpq::test;


TEST_CASE("nodes run through plan + runner + GPU launchers match the CPU kernels", "[cuda][gpu][runner]") {
  MPQ_REQUIRE_GPU();
  test::CudaMemory mem;
  run_node_cases(mpq::cuda::gpu_ops_table(), mem);
  // The cases run on the default stream: its cuDNN handle is released here, as an executor's
  // context does for its own stream (compute-sanitizer's leak check counts it otherwise).
  mpq::cuda::gpu_ops_table().release_stream(nullptr);
}
