// GPU launchers for kernels/ops_train.inc (backward, loss-scale and optimizer bodies). Never run
// on this machine (no GPU).
#include <cuda_runtime.h>

#include "kernels/bodies/train.cuh"
#include "kernels/gpu_launch.cuh"

namespace mpq::cuda::gpu {

#include "kernels/ops_train.inc"

}  // namespace mpq::cuda::gpu
