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

// The bits of a float and back (memcpy on the host, the intrinsics on the device).
MPQ_HD inline uint32_t hd_float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}
MPQ_HD inline float hd_bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

// FP16 and BF16 conversions with the same rounding as the CPU's (core/half.h): round to nearest
// even, FP16 overflow to inf, NaN kept (quiet), subnormals exact.
MPQ_HD inline uint16_t hd_float_to_half_bits(float f) {
  const uint32_t x = hd_float_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u)  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0u));
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {                                               // below the smallest normal half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);          // under half the smallest subnormal
    const uint32_t exp = absx >> 23;
    const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;
    uint32_t result = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half_point = 1u << (shift - 1);
    if (rem > half_point || (rem == half_point && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t result = (absx - 0x38000000u) >> 13;
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}
MPQ_HD inline float hd_half_bits_to_float(uint16_t h) {
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return hd_bits_float(sign);
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;  // mant * 2^-24
    return sign ? -v : v;
  }
  if (exp == 31) return hd_bits_float(sign | 0x7f800000u | (mant << 13));
  return hd_bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}
MPQ_HD inline uint16_t hd_float_to_bf16_bits(float f) {
  const uint32_t x = hd_float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
MPQ_HD inline float hd_bf16_bits_to_float(uint16_t b) { return hd_bits_float(static_cast<uint32_t>(b) << 16); }

}  // namespace mpq::cuda
