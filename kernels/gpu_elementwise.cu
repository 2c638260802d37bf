// GPU launchers for kernels/ops_elementwise.inc: one __global__ instantiation per body (kernels/grid.cuh).
// Split by family so that each nvcc compile stays short. Never run on this machine (no GPU).
#include <cuda_runtime.h>

#include "kernels/bodies/elementwise.cuh"
#include "kernels/bodies/reduce.cuh"
#include "kernels/gpu_launch.cuh"

namespace mpq::cuda::gpu {

#include "kernels/ops_elementwise.inc"

}  // namespace mpq::cuda::gpu
