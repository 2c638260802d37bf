// The test models through the CUDA graph runner with the GPU launchers and cudaMalloc memory,
// against mpq's CPU executor (model_cases.h). Skipped, with the reason, without a GPU. Passed
// on an H100 (docs/gpu.md).
#include "gpu_support.h"
#include "model_cases.h"

using namespace mpq;

TEST_CASE("test models run through the CUDA graph runner on the GPU launchers", "[cuda][gpu][runner]") {
  MPQ_REQUIRE_GPU();
  test::CudaMemory mem;
  test::run_model_cases(mpq::cuda::gpu_ops_table(), mem);
  test::run_low_precision_model_cases(mpq::cuda::gpu_ops_table(), mem, 5e-3);  // not yet run on a GPU
  // The cases run on the default stream: its cuDNN handle is released here, as an executor's
  // context does for its own stream (compute-sanitizer's leak check counts it otherwise).
  mpq::cuda::gpu_ops_table().release_stream(nullptr);
}
