#pragma once
// Shared host/device building blocks for the CUDA kernel bodies (kernels/bodies/*.cuh).
//
// Every kernel body is a functor whose operator()(const Thread&) does the work of one CUDA thread
// over a grid-stride loop. On the GPU a thin __global__ launcher (body_kernel, kernels/grid.cuh)
// builds the Thread from blockIdx/threadIdx; on the host, the harness (kernels/host_harness.cu,
// compiled by nvcc) calls the same functor for every (block, thread) pair of the same launch
// shape, so tails, odd sizes and the index arithmetic are exercised by the host tests exactly as
// on the device. MPQ_HD is empty for g++ (no __CUDACC__); g++ files include only kernels/params.h.
#include <cmath>
#include <cstdint>

#include "kernels/params.h"

#if defined(__CUDACC__)
#define MPQ_HD __host__ __device__
#else
#define MPQ_HD
#endif

namespace mpq::cuda {

// One thread's coordinates in a 1-D launch.
struct Thread {
  int64_t block = 0, thread = 0, block_dim = 1, grid_dim = 1;
  MPQ_HD int64_t global() const { return block * block_dim + thread; }
  MPQ_HD int64_t stride() const { return block_dim * grid_dim; }
};

// Plain math that compiles for both sides (no <cmath> std:: calls in device code).
MPQ_HD inline float hd_max(float a, float b) { return a > b ? a : b; }
MPQ_HD inline float hd_min(float a, float b) { return a < b ? a : b; }
MPQ_HD inline bool hd_isnan(float x) { return x != x; }
MPQ_HD inline bool hd_isfinite(float x) { return x - x == 0.0f; }

// Nearest integer, ties to even, independent of the FPU rounding mode: the same algorithm as
// calib::round_half_to_even (quant_ref.cpp), so Q/DQ bodies agree with the reference bit for bit.
MPQ_HD inline float hd_round_half_even(float x) {
  if (!hd_isfinite(x)) return x;
  float r = roundf(x);  // ties away from zero
  if (fabsf(r - x) == 0.5f) r = 2.0f * roundf(x * 0.5f);
  return r;
}

}  // namespace mpq::cuda
