// Squeeze-and-excitation on tensors in a convolution layout (passes/block_conv_layout): the
// global average pool and the per-channel scale that read a convolution's output, as mpq nodes that
// take the tensor in its channel-blocked or channels-last layout (attribute x_block, as
// mpq::FusedConv's), so that the tensor stays in oneDNN's layout from one convolution, through the
// block, to the next instead of being converted to NCHW and back:
//   * mpq::GlobalAveragePool(X) -> Y [N, C, 1, 1]: GlobalAveragePool's bits (each channel summed in
//     the plain kernel's order: eight partial sums over the positions i mod 8, added in order, then
//     the leftover positions, then one division);
//   * mpq::ScaleChannels(X, S) -> Y, X's shape and layout: Y = X * S with S [1 or N, C, 1, 1] plain,
//     Mul's bits (one product per element).
// Float32, rank 4 only, as the pass rewrites them. The plain GlobalAveragePool and Mul kernels are
// the ground truth: layout_ops_test converts their inputs and compares bits.
#include <algorithm>
#include <vector>

#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/math_util.h"
#include "runtime/cpu/register_all.h"
#include "runtime/thread_pool.h"

namespace mpq::rt::cpu {

namespace {

// The layout in x_block as [N, groups, S, width] rows: NCHW is C groups of width 1, channel blocks
// C / b groups of width b, channels-last one group of width C.
struct Rows {
  int64_t groups = 0, width = 0;
};

Rows rows_of(KernelContext& ctx, const Tensor& x, int64_t block) {
  if (x.dtype() != DType::Float32) ctx.fail("X must be float32, got {}", dtype_name(x.dtype()));
  if (x.rank() != 4) ctx.fail("X must have rank 4 (N, C, H, W), got shape {}", shape_str(x.shape()));
  const int64_t c = x.dim(1);
  if (!valid_channel_block(block) || !fits_channel_block(block, c))
    ctx.fail("x_block {} is not a layout for {} channels (0, 8, 16 or {} for channels-last)", block, c, kChannelsLast);
  if (block == 0) return {c, 1};
  if (block == kChannelsLast) return {1, c};
  return {c / block, block};
}

// The loop bodies, compiled for AVX-512, AVX2 and the baseline (the build's SSE2 alone vectorises
// them four lanes wide: the 120-channel pool at 7 x 7 took 0.8 us). Sums and products in the same
// order in every build: the same bits.
constexpr int64_t kPartials = 8;  // GlobalAveragePool's partial sums (pool.cpp)

// One group's [S, width] values into out[0, width): eight partial sums over the positions i mod 8,
// added in order, the leftover positions, one division. part: 8 * width floats, acc: width.
__attribute__((always_inline)) inline void pool_group(const float* __restrict rows, int64_t s, int64_t width,
                                                      float* __restrict part, float* __restrict acc,
                                                      float* __restrict out) {
  const int64_t s8 = s / kPartials * kPartials;
  std::fill(part, part + kPartials * width, 0.0f);
  for (int64_t i = 0; i < s8; i += kPartials)
    for (int64_t j = 0; j < kPartials; ++j) {
      const float* row = rows + (i + j) * width;
      float* pj = part + j * width;
      for (int64_t k = 0; k < width; ++k) pj[k] += row[k];
    }
  std::fill(acc, acc + width, 0.0f);
  for (int64_t j = 0; j < kPartials; ++j)
    for (int64_t k = 0; k < width; ++k) acc[k] += part[j * width + k];
  for (int64_t i = s8; i < s; ++i)
    for (int64_t k = 0; k < width; ++k) acc[k] += rows[i * width + k];
  for (int64_t k = 0; k < width; ++k) out[k] = s > 0 ? acc[k] / static_cast<float>(s) : 0.0f;
}

// One group's [S, width] values times its width scales.
// x and y may be the same buffer (each value is read before it is written), so not __restrict.
__attribute__((always_inline)) inline void scale_group(const float* x, const float* __restrict scale, int64_t s,
                                                       int64_t width, float* y) {
  if (width == 1) {
    const float f = scale[0];
    for (int64_t i = 0; i < s; ++i) y[i] = x[i] * f;
    return;
  }
  for (int64_t i = 0; i < s; ++i)
    for (int64_t k = 0; k < width; ++k) y[i * width + k] = x[i * width + k] * scale[k];
}

using PoolGroupFn = void (*)(const float*, int64_t, int64_t, float*, float*, float*);
using ScaleGroupFn = void (*)(const float*, const float*, int64_t, int64_t, float*);

__attribute__((target("avx512f"))) void pool_group_avx512(const float* rows, int64_t s, int64_t width, float* part,
                                                          float* acc, float* out) {
  pool_group(rows, s, width, part, acc, out);
}
__attribute__((target("avx2"))) void pool_group_avx2(const float* rows, int64_t s, int64_t width, float* part,
                                                     float* acc, float* out) {
  pool_group(rows, s, width, part, acc, out);
}
void pool_group_base(const float* rows, int64_t s, int64_t width, float* part, float* acc, float* out) {
  pool_group(rows, s, width, part, acc, out);
}
__attribute__((target("avx512f"))) void scale_group_avx512(const float* x, const float* scale, int64_t s,
                                                           int64_t width, float* y) {
  scale_group(x, scale, s, width, y);
}
__attribute__((target("avx2"))) void scale_group_avx2(const float* x, const float* scale, int64_t s, int64_t width,
                                                      float* y) {
  scale_group(x, scale, s, width, y);
}
void scale_group_base(const float* x, const float* scale, int64_t s, int64_t width, float* y) {
  scale_group(x, scale, s, width, y);
}

PoolGroupFn pool_group_fn() {
  static const PoolGroupFn fn = __builtin_cpu_supports("avx512f") ? pool_group_avx512
                                : __builtin_cpu_supports("avx2")  ? pool_group_avx2
                                                                  : pool_group_base;
  return fn;
}
ScaleGroupFn scale_group_fn() {
  static const ScaleGroupFn fn = __builtin_cpu_supports("avx512f") ? scale_group_avx512
                                 : __builtin_cpu_supports("avx2")  ? scale_group_avx2
                                                                   : scale_group_base;
  return fn;
}

void global_average_pool_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Rows r = rows_of(ctx, x, ctx.node().attr_int("x_block", 0));
  const int64_t n = x.dim(0), c = x.dim(1), s = x.dim(2) * x.dim(3);
  Tensor& y = ctx.alloc_output(0, DType::Float32, Shape{n, c, 1, 1});
  const float* xp = x.data<float>();
  float* yp = y.data<float>();
  const PoolGroupFn pool_one = pool_group_fn();
  ctx.pool().parallel_for(n * r.groups, math::grain_for(s * r.width, 16384), [&](int64_t lo, int64_t hi) {
    // The partial sums of one group, kept per thread between calls (no allocation per run).
    thread_local std::vector<float> scratch;
    const auto need = static_cast<size_t>((kPartials + 1) * r.width);
    if (scratch.size() < need) scratch.resize(need);
    // Group g of image g / groups holds channels (g % groups) * width + k.
    for (int64_t g = lo; g < hi; ++g)
      pool_one(xp + g * s * r.width, s, r.width, scratch.data(), scratch.data() + kPartials * r.width,
               yp + (g / r.groups) * c + (g % r.groups) * r.width);
  });
}

void scale_channels_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& scale = ctx.input(1);
  const Rows r = rows_of(ctx, x, ctx.node().attr_int("x_block", 0));
  const int64_t n = x.dim(0), c = x.dim(1), s = x.dim(2) * x.dim(3);
  if (scale.dtype() != DType::Float32 || scale.rank() != 4 || (scale.dim(0) != 1 && scale.dim(0) != n) ||
      scale.dim(1) != c || scale.dim(2) != 1 || scale.dim(3) != 1)
    ctx.fail("S must be float32 [1 or {}, {}, 1, 1] to scale X {}, got {} {}", n, c, shape_str(x.shape()),
             dtype_name(scale.dtype()), shape_str(scale.shape()));
  Tensor& y = ctx.alloc_output(0, DType::Float32, x.shape());
  const float* xp = x.data<float>();
  const float* sp = scale.data<float>();
  float* yp = y.data<float>();
  const bool per_image = scale.dim(0) == n && n > 1;
  // One task per (image, group): its S x width values and the width scales they take. In place
  // (Y in X's buffer) is fine: each value is read once, before it is written.
  const ScaleGroupFn scale_one = scale_group_fn();
  ctx.pool().parallel_for(n * r.groups, math::grain_for(s * r.width, 16384), [&](int64_t lo, int64_t hi) {
    for (int64_t g = lo; g < hi; ++g)
      scale_one(xp + g * s * r.width, sp + (per_image ? (g / r.groups) * c : 0) + (g % r.groups) * r.width, s,
                r.width, yp + g * s * r.width);
  });
}

}  // namespace

void register_layout_ops(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  r.add_fn("mpq", "GlobalAveragePool", 1, 1, cpu, global_average_pool_kernel);
  r.add_fn("mpq", "ScaleChannels", 1, 1, cpu, scale_channels_kernel);
}

}  // namespace mpq::rt::cpu
