// GPU launchers for kernels/ops_linalg.inc (the direct matrix-product and convolution bodies that
// back cuBLASLt / cuDNN up). Never run on this machine (no GPU).
#include <cuda_runtime.h>

#include "kernels/bodies/linalg.cuh"
#include "kernels/gpu_launch.cuh"

namespace mpq::cuda::gpu {

#include "kernels/ops_linalg.inc"

}  // namespace mpq::cuda::gpu
