// Conv and ConvTranspose (1-D, 2-D, 3-D; groups, strides, dilations, pads, auto_pad, bias).
//
// Conv picks one of four strategies:
//   * float32 1-D/2-D where oneDNN is built in: oneDNN's direct kernels, with the FusedConv
//     epilogue as post-ops (conv_onednn.cpp);
//   * depthwise (one input channel per group, float32, 1-D/2-D): direct kernel, conv_depthwise.cpp;
//   * pointwise (1x1 kernel, stride 1, no padding): one GEMM per (image, group) straight on X;
//   * otherwise im2col + GEMM per (image, group), in cache-sized tiles of output rows.
// The output is pre-filled with the bias and the GEMM accumulates onto it (beta = 1), so the bias
// costs no extra pass; in the pointwise case each GEMM, or each piece of a split one, fills its own
// part just before it (blas_gemm_split_bias). GEMMs large enough for OpenBLAS to thread run one at
// a time on its threads; (image, group) tasks whose GEMM OpenBLAS would run single-threaded
// anyway are spread over the kernel pool instead. ConvTranspose is GEMM (W^T X) + col2im per
// (image, group).
// More than three spatial dimensions fall back to the scalar reference implementation.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/cpu/gemm_small.h"
#include "runtime/cpu/quant_internal.h"
#include "runtime/cpu/math_util.h"
#include "runtime/cpu/matmul_onednn.h"
#include "runtime/cpu/reference.h"
#include "runtime/cpu/register_all.h"

namespace mpq::rt::cpu {

namespace {

// im2col works in tiles of output rows of about this many bytes, so that the column buffer is
// still in cache when the GEMM packs it (measured ~10-20% faster than one full-size buffer on a
// 3x3 64->64 conv at 56x56), but of at least kMinTileCols columns to keep the GEMM efficient.
constexpr int64_t kColTileBytes = int64_t{1} << 20;
constexpr int64_t kMinTileCols = 256;

void check_float_inputs(const KernelContext& ctx, const Tensor& x, const Tensor& w, const Tensor* b) {
  if (x.dtype() != DType::Float32 && x.dtype() != DType::Float64)
    ctx.fail("X must be a floating-point tensor, got {}", dtype_name(x.dtype()));
  if (w.dtype() != x.dtype()) ctx.fail("W has type {} but X has type {}", dtype_name(w.dtype()), dtype_name(x.dtype()));
  if (b && b->dtype() != x.dtype()) ctx.fail("B has type {} but X has type {}", dtype_name(b->dtype()), dtype_name(x.dtype()));
  if (x.rank() < 3) ctx.fail("X must have rank 3 or more (N, C, spatial...), got shape {}", shape_str(x.shape()));
  if (w.rank() != x.rank())
    ctx.fail("W {} must have the same rank as X {}", shape_str(w.shape()), shape_str(x.shape()));
}

std::vector<int64_t> spatial(const Tensor& t) { return Shape(t.shape().begin() + 2, t.shape().end()); }

void check_kernel_shape_attr(const KernelContext& ctx, const std::vector<int64_t>& kernel) {
  std::vector<int64_t> ks = ctx.node().attr_ints("kernel_shape", {});
  if (!ks.empty() && ks != kernel)
    ctx.fail("kernel_shape {} does not match the weight's spatial shape {}", shape_str(ks), shape_str(kernel));
}

// Fill each of `rows` rows of `len` elements with bias[row % channels] (or zeros).
template <typename T>
void prefill_bias(ThreadPool& pool, T* y, int64_t rows, int64_t len, int64_t channels, const T* bias) {
  pool.parallel_for(rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(len, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) std::fill(y + r * len, y + (r + 1) * len, bias ? bias[r % channels] : T(0));
  });
}

// What mpq::FusedConv (passes/fuse_conv_activation) adds after the convolution:
// Y = activation(Conv(X, W, B) + Z), applied while a block of Y is still in cache.
struct Epilogue {
  enum class Act { None, Relu, LeakyRelu, Clip, Sigmoid, HardSigmoid, Tanh, HardSwish };
  Act act = Act::None;
  float p0 = 0.0f, p1 = 0.0f;
  const void* z = nullptr;  // same type and shape as Y
  // Then fake quantization with one scale (passes/fuse_conv_fake_quant, the FakeQuant of a QDQ
  // model's activation): quant::fake_quantize_value(v, fq_scale, fq_lo, fq_hi). Float32 only.
  enum class Quant { None, Narrow, Wide };  // Wide: fake_quant_wide(fq_lo, fq_hi)
  Quant quant = Quant::None;
  float fq_scale = 1.0f, fq_lo = 0.0f, fq_hi = 0.0f;
  // mpq::FusedConv's int8_scales (passes/int8_conv): oneDNN may run the convolution in integers.
  // mpq's kernels ignore it: the same products in float.
  const Int8ConvScales* int8 = nullptr;
  bool active() const { return act != Act::None || z != nullptr || quant != Quant::None; }
};

// Branch-free (math::sel) so the row loops vectorise; compare-and-branch code mispredicts on
// activations of both signs.
template <Epilogue::Act A, typename T>
inline T activate(T v, T a, T b) {
  using Act = Epilogue::Act;
  using math::sel;
  if constexpr (A == Act::Relu) return sel(v < T(0), T(0), v);
  if constexpr (A == Act::LeakyRelu) return sel(v < T(0), a * v, v);
  if constexpr (A == Act::Clip) {
    v = sel(v < a, a, v);
    return sel(v > b, b, v);
  }
  if constexpr (A == Act::HardSigmoid || A == Act::HardSwish) {
    T g = A == Act::HardSigmoid ? a * v + b : v * static_cast<T>(1.0 / 6.0) + T(0.5);
    g = sel(g < T(0), T(0), g);
    g = sel(g > T(1), T(1), g);
    return A == Act::HardSigmoid ? g : v * g;
  }
  if constexpr (A == Act::Sigmoid) {
    if constexpr (std::is_same_v<T, float>) return math::fast_sigmoid(v);
    else return T(1) / (T(1) + std::exp(-v));
  }
  if constexpr (A == Act::Tanh) {
    if constexpr (std::is_same_v<T, float>) return math::fast_tanh(v);
    else return std::tanh(v);
  }
  return v;
}

// The fused fake quantization's parameters, as the row loops take them.
struct RowQuant {
  float s = 1.0f, lo = 0.0f, hi = 0.0f;
};

// dst[i] = fq(act(src[i] + bias + z[i])) over one row, in a single pass (dst may be src).
template <Epilogue::Act A, bool kHasZ, Epilogue::Quant Q, typename T>
void epilogue_row(const T* src, T bias, const T* z, T* dst, int64_t n, T a, T b, RowQuant q) {
  for (int64_t i = 0; i < n; ++i) {
    T v = src[i] + bias;
    if constexpr (kHasZ) v += z[i];
    v = activate<A>(v, a, b);
    if constexpr (Q != Epilogue::Quant::None) {
      static_assert(std::is_same_v<T, float>, "fused fake quantization is float32 only");
      v = quant::fake_quantize_value<Q == Epilogue::Quant::Wide>(v, q.s, q.lo, q.hi);
    }
    dst[i] = v;
  }
}

// Calls fn(row) once, with row(src, bias, z, dst, n) specialised for e's activation, Z and fake
// quantization, so the choice is made per convolution rather than per element.
template <typename T, typename F>
void with_epilogue(const Epilogue& e, F&& fn) {
  using Act = Epilogue::Act;
  using Quant = Epilogue::Quant;
  const T a = static_cast<T>(e.p0), b = static_cast<T>(e.p1);
  const RowQuant rq{e.fq_scale, e.fq_lo, e.fq_hi};
  auto pick_quant = [&](auto act, auto quant) {
    constexpr Act A = decltype(act)::value;
    constexpr Quant Q = decltype(quant)::value;
    if (e.z) {
      fn([a, b, rq](const T* src, T bias, const T* z, T* dst, int64_t n) {
        epilogue_row<A, true, Q, T>(src, bias, z, dst, n, a, b, rq);
      });
    } else {
      fn([a, b, rq](const T* src, T bias, const T*, T* dst, int64_t n) {
        epilogue_row<A, false, Q, T>(src, bias, nullptr, dst, n, a, b, rq);
      });
    }
  };
  auto pick = [&](auto act) {
    if constexpr (std::is_same_v<T, float>) {
      if (e.quant == Quant::Narrow) return pick_quant(act, std::integral_constant<Quant, Quant::Narrow>{});
      if (e.quant == Quant::Wide) return pick_quant(act, std::integral_constant<Quant, Quant::Wide>{});
    }
    pick_quant(act, std::integral_constant<Quant, Quant::None>{});
  };
  switch (e.act) {
    case Act::None: return pick(std::integral_constant<Act, Act::None>{});
    case Act::Relu: return pick(std::integral_constant<Act, Act::Relu>{});
    case Act::LeakyRelu: return pick(std::integral_constant<Act, Act::LeakyRelu>{});
    case Act::Clip: return pick(std::integral_constant<Act, Act::Clip>{});
    case Act::Sigmoid: return pick(std::integral_constant<Act, Act::Sigmoid>{});
    case Act::HardSigmoid: return pick(std::integral_constant<Act, Act::HardSigmoid>{});
    case Act::Tanh: return pick(std::integral_constant<Act, Act::Tanh>{});
    case Act::HardSwish: return pick(std::integral_constant<Act, Act::HardSwish>{});
  }
}

// The epilogue as a separate pass over all of Y, for the convolution strategies that do not apply
// it block by block.
template <typename T>
void apply_epilogue_all(ThreadPool& pool, const Epilogue& e, T* y, int64_t n) {
  if (!e.active()) return;
  const T* z = static_cast<const T*>(e.z);
  with_epilogue<T>(e, [&](auto row) {
    pool.parallel_for(n, 16384, [&](int64_t lo, int64_t hi) { row(y + lo, T(0), z ? z + lo : nullptr, y + lo, hi - lo); });
  });
}

// Copies n floats; rows here are a few dozen elements, where a memcpy call costs as much as the copy.
inline void copy_row(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(dst + i, _mm_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
}
inline void copy_row(const double* src, double* dst, int64_t n) { std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(double)); }

// col[(c, kd, kh, kw), (p - p0) * OW + ow] = X[c, od*s + kd*d - pad, oh*s + kh*d - pad, ow*s + kw*d - pad]
// for output rows p = od * OH + oh in [p0, p1); zero where the window is in the padding.
// Small feature maps make every copied row short, so the per-row work is kept free of divisions.
template <typename T>
void im2col(ThreadPool& pool, const T* x, int64_t channels, const Window3& g, int64_t p0, int64_t p1, T* col) {
  const int64_t OW = g.out[2], OH = g.out[1];
  const int64_t ld = (p1 - p0) * OW;
  const int64_t K = g.k_size();
  const int64_t in_plane = g.in_size();
  const int64_t od0 = p0 / OH, oh0 = p0 % OH;
  pool.parallel_for(channels * K, std::max<int64_t>(1, 32768 / std::max<int64_t>(ld, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t c = r / K, kk = r % K;
      const int64_t kw = kk % g.k[2], kh = (kk / g.k[2]) % g.k[1], kd = kk / (g.k[2] * g.k[1]);
      const T* xc = x + c * in_plane;
      T* dst = col + r * ld;
      const int64_t woff = kw * g.d[2] - g.pb[2];
      const int64_t hoff = kh * g.d[1] - g.pb[1];
      const int64_t doff = kd * g.d[0] - g.pb[0];
      const int64_t ow_lo = std::clamp<int64_t>(ceil_div(-woff, g.s[2]), 0, OW);
      const int64_t ow_hi = std::clamp<int64_t>(floor_div(g.in[2] - 1 - woff, g.s[2]) + 1, ow_lo, OW);
      const int64_t run = ow_hi - ow_lo;
      int64_t od = od0, oh = oh0;
      for (int64_t p = p0; p < p1; ++p, dst += OW) {
        const int64_t id = od * g.s[0] + doff;
        const int64_t ih = oh * g.s[1] + hoff;
        if (++oh == OH) {
          oh = 0;
          ++od;
        }
        if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
          for (int64_t ow = 0; ow < OW; ++ow) dst[ow] = T(0);
          continue;
        }
        const T* src = xc + (id * g.in[1] + ih) * g.in[2] + woff;
        for (int64_t ow = 0; ow < ow_lo; ++ow) dst[ow] = T(0);
        if (g.s[2] == 1) {
          copy_row(src + ow_lo, dst + ow_lo, run);
        } else if (std::is_same_v<T, float> && g.s[2] == 2) {
          if constexpr (std::is_same_v<T, float>) gather_stride2(src + 2 * ow_lo, dst + ow_lo, run);
        } else {
          const int64_t s = g.s[2];
          for (int64_t ow = ow_lo; ow < ow_hi; ++ow) dst[ow] = src[ow * s];
        }
        for (int64_t ow = ow_hi; ow < OW; ++ow) dst[ow] = T(0);
      }
    }
  });
}

// Runs fn(task) for every task: spread over the pool when each task's GEMM is single-threaded in
// OpenBLAS anyway, otherwise one after the other (each GEMM then uses OpenBLAS's threads).
template <typename F>
void run_tasks(ThreadPool& pool, int64_t tasks, bool spread, F fn) {
  if (spread && tasks > 1) {
    pool.parallel_for(tasks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) fn(t);
    });
  } else {
    for (int64_t t = 0; t < tasks; ++t) fn(t);
  }
}

// 2-D convolution without per-element im2col. The input of one (image, group) is copied once into
// zero-padded planes, split by stride phase: plane (py, px) of channel c holds the padded input at
// rows py, py + sy, ... and columns px, px + sx, ..., Wq = ceil(Wp / sx) wide. The window tap
// (kh, kw) then reads, for every output position, the element at a fixed offset from it in one
// such plane: phase (kh*dy % sy, kw*dx % sx), shift (kh*dy / sy) rows and (kw*dx / sx) columns. In
// a flattened plane that shift is a constant, so each (c, kh, kw) row of the column matrix is one
// contiguous slice, copied whole. (On small feature maps the plain im2col copies rows of a few
// dozen elements whose loop overhead and mispredicted variable-length tails cost as much as the
// GEMM.) The price: the GEMM also computes the Wq - OW columns per output row that straddle the
// padding, dropped when the result is copied (with the bias) into Y; taken only while those are at
// most kMaxWastedColumnShare of the useful ones.
constexpr double kMaxWastedColumnShare = 0.3;

struct PhasePlanes {
  int64_t Hp, Wp;   // padded input
  int64_t Hq, Wq;   // one phase plane
  int64_t phases;   // sy * sx
  int64_t plane;    // Hq * Wq
  int64_t channel;  // phases * plane
  int64_t slack;    // the last tap reads this far past the last plane
  std::array<bool, 16> used{};  // phases some window tap reads (a 1x1 stride-2 kernel reads one of four)
};

PhasePlanes phase_planes(const Window3& g) {
  PhasePlanes p{};
  p.Hp = g.pb[1] + g.in[1] + g.pe[1];
  p.Wp = g.pb[2] + g.in[2] + g.pe[2];
  p.Hq = ceil_div(p.Hp, g.s[1]);
  p.Wq = ceil_div(p.Wp, g.s[2]);
  p.phases = g.s[1] * g.s[2];
  p.plane = p.Hq * p.Wq;
  p.channel = p.phases * p.plane;
  p.slack = (g.k[2] - 1) * g.d[2] / g.s[2];
  for (int64_t kh = 0; kh < g.k[1]; ++kh)
    for (int64_t kw = 0; kw < g.k[2]; ++kw)
      p.used[static_cast<size_t>((kh * g.d[1] % g.s[1]) * g.s[2] + kw * g.d[2] % g.s[2])] = true;
  return p;
}

bool phase_planes_apply(const Window3& g) {
  if (g.in[0] != 1 || g.k[0] != 1 || g.pb[0] != 0 || g.pe[0] != 0) return false;
  if (g.s[1] > 4 || g.s[2] > 4) return false;  // phase planes would mostly hold skipped input
  const PhasePlanes p = phase_planes(g);
  return static_cast<double>(p.Wq - g.out[2]) <= kMaxWastedColumnShare * static_cast<double>(g.out[2]);
}

template <typename T>
struct PhasePlanesScratch {
  std::vector<T> planes, col, out;
};

template <typename T>
PhasePlanesScratch<T>& phase_planes_scratch() {
  // Kept per thread between calls for the same reason as the im2col buffer below.
  thread_local PhasePlanesScratch<T> s;
  return s;
}

// Writes the phase planes of input channels [c_lo, c_hi) (H x W planes at x) to dst.
template <typename T>
void fill_phase_planes(const T* x, int64_t c_lo, int64_t c_hi, const Window3& g, const PhasePlanes& p, T* dst) {
  const int64_t H = g.in[1], W = g.in[2], sy = g.s[1], sx = g.s[2], Wq = p.Wq;
  // Plane column q of phase px holds input column q*sx + px - pad; [q_lo, q_hi) of them are inside.
  std::array<int64_t, 4> q_lo{}, q_hi{};
  for (int64_t px = 0; px < sx; ++px) {
    q_lo[px] = std::clamp<int64_t>(ceil_div(g.pb[2] - px, sx), 0, Wq);
    q_hi[px] = std::clamp<int64_t>(floor_div(W - 1 + g.pb[2] - px, sx) + 1, q_lo[px], Wq);
  }
  for (int64_t c = c_lo; c < c_hi; ++c) {
    T* ch = dst + c * p.channel;
    const T* xc = x + c * H * W;
    for (int64_t py = 0; py < sy; ++py) {
      for (int64_t px = 0; px < sx; ++px) {
        if (!p.used[static_cast<size_t>(py * sx + px)]) continue;
        T* row = ch + (py * sx + px) * p.plane;
        const int64_t lo = q_lo[px], hi = q_hi[px];
        for (int64_t qy = 0, ih = py - g.pb[1]; qy < p.Hq; ++qy, ih += sy, row += Wq) {
          if (ih < 0 || ih >= H) {
            std::memset(row, 0, static_cast<size_t>(Wq) * sizeof(T));
            continue;
          }
          const T* s0 = xc + ih * W + lo * sx + px - g.pb[2];
          for (int64_t q = 0; q < lo; ++q) row[q] = T(0);
          if (sx == 1) {
            copy_row(s0, row + lo, hi - lo);
          } else if (std::is_same_v<T, float> && sx == 2) {
            if constexpr (std::is_same_v<T, float>) gather_stride2(s0, row + lo, hi - lo);
          } else {
            for (int64_t q = lo; q < hi; ++q) row[q] = s0[(q - lo) * sx];
          }
          for (int64_t q = hi; q < Wq; ++q) row[q] = T(0);
        }
      }
    }
  }
}

template <typename T>
void conv_phase_planes(ThreadPool& pool, const T* xp, const T* wp, const T* bp, T* yp, int64_t N, int64_t G, int64_t C,
                       int64_t M, const Window3& g, bool spread, const Epilogue& epi) {
  const int64_t Cg = C / G, Mg = M / G;
  const int64_t OH = g.out[1], OW = g.out[2], S = OH * OW, Sin = g.in[1] * g.in[2];
  const int64_t KW = g.k[2], K = g.k[1] * KW, CgK = Cg * K;
  const PhasePlanes pp = phase_planes(g);
  const int64_t Wq = pp.Wq;
  const int64_t tile = std::clamp<int64_t>(
      std::max(kColTileBytes / std::max<int64_t>(CgK * Wq * static_cast<int64_t>(sizeof(T)), 1), ceil_div(kMinTileCols, Wq)),
      1, OH);
  // One GEMM per (image, group). Letting several small images share one GEMM (weights packed once)
  // was ~5% faster on 28x28 maps, but the changed summation order flipped enough round-half ties
  // in a uint8 QDQ U-Net's requantization to push its agreement with ONNX Runtime past 1e-3 rel-L2.
  auto one_task = [&](int64_t t, ThreadPool* inner) {
    const int64_t n = t / G, gi = t % G;
    const T* xg = xp + (n * C + gi * Cg) * Sin;
    const T* wg = wp + gi * Mg * CgK;
    const T* bg = bp ? bp + gi * Mg : nullptr;
    T* yg = yp + (n * M + gi * Mg) * S;
    const T* zg = epi.z ? static_cast<const T*>(epi.z) + (n * M + gi * Mg) * S : nullptr;
    const int64_t image_planes = Cg * pp.channel;
    PhasePlanesScratch<T>& s = phase_planes_scratch<T>();
    auto reserve = [](std::vector<T>& v, int64_t n_elems) {
      if (v.size() < static_cast<size_t>(n_elems)) v.resize(static_cast<size_t>(n_elems));
      return v.data();
    };
    T* planes = reserve(s.planes, image_planes + pp.slack);
    T* col = reserve(s.col, CgK * tile * Wq);
    T* out = reserve(s.out, Mg * tile * Wq);
    auto for_range = [&](int64_t count, int64_t grain, auto fn) {
      if (inner) {
        inner->parallel_for(count, grain, fn);
      } else {
        fn(int64_t{0}, count);
      }
    };
    for_range(Cg, std::max<int64_t>(1, 16384 / pp.channel),
              [&](int64_t lo, int64_t hi) { fill_phase_planes(xg, lo, hi, g, pp, planes); });
    // Windows of the last channel read up to `slack` past it, into dropped columns.
    std::fill(planes + image_planes, planes + image_planes + pp.slack, T(0));
    for (int64_t p0 = 0; p0 < OH; p0 += tile) {
      const int64_t p1 = std::min(OH, p0 + tile);
      const int64_t len = (p1 - p0) * Wq;
      for_range(CgK, std::max<int64_t>(1, 32768 / len), [&](int64_t lo, int64_t hi) {
        for (int64_t r = lo; r < hi; ++r) {
          const int64_t c = r / K, ty = (r % K) / KW * g.d[1], tx = r % KW * g.d[2];
          const int64_t phase = (ty % g.s[1]) * g.s[2] + tx % g.s[2];
          const T* src = planes + c * pp.channel + phase * pp.plane + (p0 + ty / g.s[1]) * Wq + tx / g.s[2];
          std::memcpy(col + r * len, src, static_cast<size_t>(len) * sizeof(T));
        }
      });
      // Inside the spread loop (inner null) this is one call on this thread.
      blas_gemm_split(pool, false, false, Mg, len, CgK, T(1), wg, CgK, col, len, T(0), out, len);
      with_epilogue<T>(epi, [&](auto row) {
        for_range(Mg, std::max<int64_t>(1, 32768 / len), [&](int64_t lo, int64_t hi) {
          for (int64_t m = lo; m < hi; ++m) {
            const T b = bg ? bg[m] : T(0);
            for (int64_t oh = p0; oh < p1; ++oh)
              row(out + m * len + (oh - p0) * Wq, b, zg ? zg + m * S + oh * OW : nullptr, yg + m * S + oh * OW, OW);
          }
        });
      });
    }
  };
  const int64_t tasks = N * G;
  if (spread && tasks > 1) {
    pool.parallel_for(tasks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) one_task(t, nullptr);
    });
  } else {
    for (int64_t t = 0; t < tasks; ++t) one_task(t, &pool);
  }
}

// The oneDNN description of a 1-D/2-D convolution (g in its rank-3 form, leading dimension 1).
DnnlConvShape dnnl_shape(int64_t N, int64_t C, int64_t M, int64_t G, const Window3& g, bool bias, const Epilogue& e) {
  DnnlConvShape s = dnnl_conv_shape(N, C, M, G, g);
  s.bias = bias;
  s.residual = e.z != nullptr;
  using A = Epilogue::Act;
  switch (e.act) {
    case A::None: s.act = DnnlAct::None; break;
    case A::Relu: s.act = DnnlAct::Relu; break;
    case A::LeakyRelu: s.act = DnnlAct::LeakyRelu; break;
    case A::Clip: s.act = DnnlAct::Clip; break;
    case A::Sigmoid: s.act = DnnlAct::Sigmoid; break;
    case A::HardSigmoid: s.act = DnnlAct::HardSigmoid; break;
    case A::Tanh: s.act = DnnlAct::Tanh; break;
    case A::HardSwish: s.act = DnnlAct::HardSwish; break;
  }
  s.p0 = e.p0;
  s.p1 = e.p1;
  s.int8 = e.int8;
  if (e.quant != Epilogue::Quant::None) {
    s.fake_quant = true;
    s.fq_scale = e.fq_scale;
    s.fq_lo = e.fq_lo;
    s.fq_hi = e.fq_hi;
  }
  return s;
}

// Computes Y; returns whether the epilogue was applied on the way (otherwise the caller applies it).
template <typename T>
bool conv_typed(KernelContext& ctx, const Tensor& x, const Tensor& w, const Tensor* b, int64_t G, const Window& win,
                const Epilogue& epi, Tensor& y, OnednnConvState* constant_weights = nullptr) {
  ThreadPool& pool = ctx.pool();
  const Window3 g = to_window3(win);
  const int64_t N = x.dim(0), C = x.dim(1), M = w.dim(0);
  const int64_t Cg = C / G, Mg = M / G;
  const int64_t S = g.out_size(), Sin = g.in_size(), K = g.k_size(), CgK = Cg * K;
  const T* xp = x.data<T>();
  const T* wp = w.data<T>();
  const T* bp = b ? b->data<T>() : nullptr;
  T* yp = y.data<T>();
  if (N == 0 || M == 0 || S == 0) return true;

  if constexpr (std::is_same_v<T, float>) {
    if (win.rank() <= 2 && Cg > 0) {
      const DnnlConvShape ds = dnnl_shape(N, C, M, G, g, bp != nullptr, epi);
      if (onednn_conv_forward(pool, ds, xp, wp, bp, static_cast<const float*>(epi.z), yp, constant_weights)) return true;
    }
    if (Cg == 1 && G > 1 && win.rank() <= 2) {
      depthwise_conv2d(pool, xp, wp, bp, yp, N, C, Mg, g);
      return false;
    }
  }

  const int64_t tasks = N * G;
  const bool spread = blas_runs_single_threaded(Mg, S, CgK);
  bool pointwise = true;
  for (int d = 0; d < 3; ++d)
    if (g.k[d] != 1 || g.s[d] != 1 || g.pb[d] != 0 || g.pe[d] != 0) pointwise = false;
  if (!pointwise && CgK > 0 && phase_planes_apply(g)) {
    conv_phase_planes(pool, xp, wp, bp, yp, N, G, C, M, g, spread, epi);
    return true;
  }

  if (pointwise && CgK > 0) {
    // Each GEMM (or each piece of a split one) sets its part of Y to the bias itself (see
    // blas_gemm_split_bias).
    run_tasks(pool, tasks, spread, [&](int64_t t) {
      const int64_t n = t / G, gi = t % G;
      blas_gemm_split_bias(pool, false, false, Mg, S, Cg, wp + gi * Mg * Cg, Cg, xp + (n * C + gi * Cg) * Sin, Sin,
                           bp ? bp + gi * Mg : nullptr, yp + (n * M + gi * Mg) * S, S);
    });
    return false;
  }

  prefill_bias(pool, yp, N * M, S, M, bp);
  if (CgK == 0) return false;  // no input channels: the bias alone
  const T beta = bp ? T(1) : T(0);

  // im2col + GEMM, tiled over output rows (od, oh).
  const int64_t rows = g.out[0] * g.out[1];
  const int64_t row_bytes = CgK * g.out[2] * static_cast<int64_t>(sizeof(T));
  const int64_t tile = std::clamp<int64_t>(
      std::max(kColTileBytes / std::max<int64_t>(row_bytes, 1), ceil_div(kMinTileCols, g.out[2])), 1, rows);
  auto one_task = [&](int64_t t, T* col) {
    const int64_t n = t / G, gi = t % G;
    const T* xg = xp + (n * C + gi * Cg) * Sin;
    const T* wg = wp + gi * Mg * CgK;
    T* yg = yp + (n * M + gi * Mg) * S;
    for (int64_t p0 = 0; p0 < rows; p0 += tile) {
      const int64_t p1 = std::min(rows, p0 + tile);
      const int64_t cols = (p1 - p0) * g.out[2];
      im2col(pool, xg, Cg, g, p0, p1, col);
      blas_gemm_split(pool, false, false, Mg, cols, CgK, T(1), wg, CgK, col, cols, beta, yg + p0 * g.out[2], S);
    }
  };
  const size_t col_elems = static_cast<size_t>(CgK * tile * g.out[2]);
  // One column buffer per thread, kept between calls: allocating it per call made glibc return it
  // to the OS and fault it in again on every feed (calibration ran at 2.7x a plain run because of it).
  auto scratch = [col_elems]() -> T* {
    thread_local std::vector<T> col;
    if (col.size() < col_elems) col.resize(col_elems);
    return col.data();
  };
  if (spread && tasks > 1) {
    pool.parallel_for(tasks, 1, [&](int64_t lo, int64_t hi) {
      T* col = scratch();
      for (int64_t t = lo; t < hi; ++t) one_task(t, col);
    });
  } else {
    T* col = scratch();
    for (int64_t t = 0; t < tasks; ++t) one_task(t, col);
  }
  return false;
}

Epilogue::Act activation_kind(const KernelContext& ctx, const std::string& name) {
  using A = Epilogue::Act;
  static const std::pair<const char*, A> kinds[] = {{"Relu", A::Relu},       {"LeakyRelu", A::LeakyRelu},
                                                    {"Clip", A::Clip},       {"Sigmoid", A::Sigmoid},
                                                    {"HardSigmoid", A::HardSigmoid}, {"Tanh", A::Tanh},
                                                    {"HardSwish", A::HardSwish}};
  for (const auto& [n, k] : kinds)
    if (name == n) return k;
  ctx.fail("activation '{}' is not one FusedConv supports (Relu, LeakyRelu, Clip, Sigmoid, HardSigmoid, Tanh, HardSwish)",
           name);
}

// FusedConv's activation attributes and Z input.
Epilogue read_epilogue(const KernelContext& ctx, const Tensor& y_like, const Shape& yshape) {
  Epilogue e;
  const ir::Node& n = ctx.node();
  if (n.op_type != "FusedConv") return e;
  const std::string act = n.attr_string("activation", "");
  std::vector<float> params = n.attr_floats("activation_params", {});
  if (!act.empty()) {
    e.act = activation_kind(ctx, act);
    size_t want = 0;
    if (e.act == Epilogue::Act::LeakyRelu) {
      want = 1;
      e.p0 = params.empty() ? 0.01f : params[0];
    } else if (e.act == Epilogue::Act::HardSigmoid || e.act == Epilogue::Act::Clip) {
      want = 2;
      if (params.size() == 2) {
        e.p0 = params[0];
        e.p1 = params[1];
      }
    }
    if (params.size() != want && !(e.act == Epilogue::Act::LeakyRelu && params.empty()))
      ctx.fail("activation {} takes {} activation_params, got {}", act, want, params.size());
  }
  if (n.attr("fake_quant") != nullptr) {
    const std::vector<float> v = n.attr_floats("fake_quant", {});
    if (v.size() != 3 || !(v[0] > 0.0f) || !std::isfinite(v[0]) || !(v[1] <= v[2]) || v[1] != std::nearbyint(v[1]) ||
        v[2] != std::nearbyint(v[2]))
      ctx.fail("fake_quant must be [scale > 0, lo, hi] with integer bounds lo <= hi, got {} values", v.size());
    if (y_like.dtype() != DType::Float32) ctx.fail("fake_quant needs float32, got {}", dtype_name(y_like.dtype()));
    e.fq_scale = v[0];
    e.fq_lo = v[1];
    e.fq_hi = v[2];
    e.quant = quant::fake_quant_wide(v[1], v[2]) ? Epilogue::Quant::Wide : Epilogue::Quant::Narrow;
  }
  if (const Tensor* z = ctx.input_or_null(3)) {
    if (z->dtype() != y_like.dtype() || z->shape() != yshape)
      ctx.fail("Z is {}{} but the convolution's output is {}{}", dtype_name(z->dtype()), shape_str(z->shape()),
               dtype_name(y_like.dtype()), shape_str(yshape));
    e.z = z->raw_data();
  }
  return e;
}

// FusedConv's x_block, z_block and y_block (passes/block_conv_layout): which of X, Z and Y hold
// channel-blocked data (runtime/cpu/channel_blocks.h) rather than plain NCHW.
struct BlockedIo {
  int64_t x = 0, z = 0, y = 0;
  bool any() const { return x != 0 || z != 0 || y != 0; }
};

BlockedIo read_blocked_io(const KernelContext& ctx, const Tensor& x, int64_t M, bool has_z) {
  BlockedIo io;
  const ir::Node& n = ctx.node();
  if (n.op_type != "FusedConv") return io;
  io.x = n.attr_int("x_block", 0);
  io.z = n.attr_int("z_block", 0);
  io.y = n.attr_int("y_block", 0);
  if (!io.any()) return io;
  for (const int64_t b : {io.x, io.z, io.y})
    if (!valid_channel_block(b)) ctx.fail("channel block {} is not 0, 8, 16 or {} (channels-last)", b, kChannelsLast);
  if (x.dtype() != DType::Float32 || x.rank() != 4)
    ctx.fail("channel-blocked layouts need a float32 2-D convolution, got {}{}", dtype_name(x.dtype()),
             shape_str(x.shape()));
  if (!fits_channel_block(io.x, x.dim(1))) ctx.fail("X has {} channels, not a multiple of its block {}", x.dim(1), io.x);
  if (!fits_channel_block(io.y, M) || !fits_channel_block(io.z, M))
    ctx.fail("the output's {} channels are not a multiple of the channel block", M);
  if (io.z && !has_z) ctx.fail("z_block is set but there is no Z input");
  return io;
}

// A channel-blocked convolution that oneDNN does not run (no direct kernel for the shape): plain
// copies of the blocked inputs, mpq's kernels, and the result blocked if Y is.
void conv_blocked_fallback(KernelContext& ctx, const Tensor& x, const Tensor& w, const Tensor* b, int64_t G,
                           const Window& win, Epilogue epi, const BlockedIo& io, Tensor& y) {
  ThreadPool& pool = ctx.pool();
  // oneDNN declined the blocked shape: in float from here (an int8 plan on the plain copies would
  // reorder the weights on every call, with no node state to keep them).
  epi.int8 = nullptr;
  const int64_t N = x.dim(0);
  const int64_t xs = x.dim(2) * x.dim(3), ys = y.dim(2) * y.dim(3);
  // Depthwise from a blocked X: computed in X's blocks (then unblocked if Y is plain), with the
  // epilogue elementwise on Y's layout when Z (if any) shares it.
  const int64_t C = x.dim(1);
  if (G == C && C > 1 && w.dim(0) == C && w.dim(1) == 1 && win.rank() == 2 && io.x > 0 && (io.y == 0 || io.y == io.x) &&
      (epi.z == nullptr || io.z == io.y)) {
    Tensor blocked_y = io.y ? y : Tensor(DType::Float32, y.shape());
    depthwise_conv2d_blocked(pool, x.data<float>(), w.data<float>(), b ? b->data<float>() : nullptr, blocked_y.data<float>(), N,
                             C, io.x, to_window3(win));
    if (!io.y) from_channel_blocks(pool, blocked_y.data<float>(), y.data<float>(), N, C, ys, io.x);
    if (epi.active()) apply_epilogue_all(pool, epi, y.data<float>(), y.numel());
    return;
  }
  Tensor plain_x = x;
  if (io.x) {
    plain_x = Tensor(DType::Float32, x.shape());
    from_channel_blocks(pool, x.data<float>(), plain_x.data<float>(), N, x.dim(1), xs, io.x);
  }
  Tensor plain_z;
  if (io.z) {
    plain_z = Tensor(DType::Float32, y.shape());
    from_channel_blocks(pool, static_cast<const float*>(epi.z), plain_z.data<float>(), N, y.dim(1), ys, io.z);
    epi.z = plain_z.raw_data();
  }
  Tensor plain_y = io.y ? Tensor(DType::Float32, y.shape()) : y;
  if (!conv_typed<float>(ctx, plain_x, w, b, G, win, epi, plain_y))
    apply_epilogue_all(pool, epi, plain_y.data<float>(), plain_y.numel());
  if (io.y) to_channel_blocks(pool, plain_y.data<float>(), y.data<float>(), N, y.dim(1), ys, io.y);
}

// Conv and mpq::FusedConv; `constant_weights` (ConvKernel's state, see below) keeps oneDNN's plan,
// memory objects and reordered weights between calls.
// What a Conv or mpq::FusedConv call derives from its attributes and input shapes before it
// computes anything: the same for every call with the same shapes, so ConvKernel keeps the last
// one (a MobileNet at batch 1 read about ten attributes, by name, per convolution and run).
struct ConvSetup {
  // The key: what the checks and the derived values depend on.
  Shape x_shape, w_shape, b_shape;
  DType dtype = DType::Undefined;
  bool has_b = false, has_z = false;
  // Derived.
  int64_t G = 1, C = 0, M = 0;
  std::vector<int64_t> kernel;
  Window win;
  Shape yshape;
  Epilogue epi;  // its z is set per call
  BlockedIo io;
  std::shared_ptr<const Int8ConvScales> int8;  // epi.int8 points here

  bool matches(const Tensor& x, const Tensor& w, const Tensor* b, bool z) const {
    return dtype != DType::Undefined && x.dtype() == dtype && w.dtype() == dtype && has_b == (b != nullptr) &&
           has_z == z && (!b || (b->dtype() == dtype && b->shape() == b_shape)) && x.shape() == x_shape &&
           w.shape() == w_shape;
  }
};

// Whether FusedConv's Z may become Y's buffer (oneDNN's sum post-op adds what Y holds): the
// executor lets this node reuse it and it is not X's buffer too.
bool z_dies_here(const KernelContext& ctx, const Tensor& x, const Epilogue& epi) {
  return epi.z && ctx.input_reusable(3) && !ctx.input(3).same_buffer(x);
}

// FusedConv's int8_scales = [x_scale, w_scale[0], ..., w_scale[M - 1]] (passes/int8_conv) as the
// factors oneDNN's int8 convolution takes; null without the attribute, or where W or B is not a
// graph constant (the pass checked the constants' values: W on the scales' integer grid).
std::shared_ptr<const Int8ConvScales> read_int8_scales(const KernelContext& ctx, const Tensor& w, const Tensor* b,
                                                       int64_t G) {
  const ir::Node& n = ctx.node();
  if (n.attr("int8_scales") == nullptr) return nullptr;
  const std::vector<float> v = n.attr_floats("int8_scales", {});
  const int64_t M = w.dim(0);
  if (static_cast<int64_t>(v.size()) != M + 1)
    ctx.fail("int8_scales must hold 1 + {} scales (X's, then one per output channel), got {}", M, v.size());
  for (const float f : v)
    if (!(f > 0.0f) || !std::isfinite(f)) ctx.fail("int8_scales must be positive finite numbers, got {}", f);
  const bool constants = n.input(1)->is_constant() && (!b || n.input(2)->is_constant());
  if (G != 1 || w.dtype() != DType::Float32 || !constants) return nullptr;
  auto q = std::make_shared<Int8ConvScales>();
  q->x_inv = 1.0f / v[0];
  q->w_inv.resize(static_cast<size_t>(M));
  q->out.resize(static_cast<size_t>(M));
  if (b) q->bias.resize(static_cast<size_t>(M));
  auto usable = [](float f) { return std::isfinite(f) && f != 0.0f; };
  if (!usable(q->x_inv)) return nullptr;
  for (size_t m = 0; m < static_cast<size_t>(M); ++m) {
    q->w_inv[m] = 1.0f / v[m + 1];
    q->out[m] = v[0] * v[m + 1];
    if (b) q->bias[m] = b->data<float>()[m] / q->out[m];
    // Scales so extreme that their products leave float's range: in float, as written.
    if (!usable(q->w_inv[m]) || !usable(q->out[m]) || (b && !std::isfinite(q->bias[m]))) return nullptr;
  }
  return q;
}

// Checks the inputs and attributes and derives the setup (every failure names the node).
void prepare_conv(const KernelContext& ctx, const Tensor& x, const Tensor& w, const Tensor* b, ConvSetup& st) {
  st.dtype = DType::Undefined;  // invalid until complete
  check_float_inputs(ctx, x, w, b);
  const int64_t G = ctx.node().attr_int("group", 1);
  if (G <= 0) ctx.fail("group must be positive, got {}", G);
  const int64_t C = x.dim(1), M = w.dim(0);
  if (C % G != 0) ctx.fail("X has {} channels, which group={} does not divide", C, G);
  if (w.dim(1) * G != C)
    ctx.fail("X has {} channels but W {} with group={} expects {}", C, shape_str(w.shape()), G, w.dim(1) * G);
  if (M % G != 0) ctx.fail("W has {} output channels, which group={} does not divide", M, G);
  if (b && (b->rank() != 1 || b->dim(0) != M)) ctx.fail("B has shape {}, expected [{}]", shape_str(b->shape()), M);
  st.kernel = spatial(w);
  check_kernel_shape_attr(ctx, st.kernel);
  st.win = forward_window(ctx, spatial(x), st.kernel, false);
  st.yshape = Shape{x.dim(0), M};
  st.yshape.insert(st.yshape.end(), st.win.out.begin(), st.win.out.end());
  st.epi = read_epilogue(ctx, x, st.yshape);
  st.int8 = read_int8_scales(ctx, w, b, G);
  st.epi.int8 = st.int8.get();
  st.io = read_blocked_io(ctx, x, M, st.epi.z != nullptr);
  st.has_z = st.epi.z != nullptr;
  st.epi.z = nullptr;
  st.G = G;
  st.C = C;
  st.M = M;
  st.x_shape = x.shape();
  st.w_shape = w.shape();
  st.has_b = b != nullptr;
  st.b_shape = b ? b->shape() : Shape{};
  st.dtype = x.dtype();
}

// A 1x1 convolution of one pixel into one (a squeeze-and-excitation block's two after its global
// pooling) is Y[n, :] = W X[n, :] + b: a product with a small B in mpq's own kernel
// (gemm_small.h), then the epilogue. oneDNN's call cost more than the product there: MobileNetV3's
// six at batch 1 took 0.7-1.0 us each (--profile-nodes). Plain and channels-last tensors of one
// pixel hold the same values in the same order; channel-blocked ones are left to oneDNN. The
// choice depends on the shapes of one image, never on the batch, whose rows the kernel computes
// alike (the executor's batch split keeps its bits).
bool single_pixel_product(KernelContext& ctx, const Tensor& x, const Tensor& w, const Tensor* b, const ConvSetup& st,
                          const Epilogue& epi) {
  if (x.dtype() != DType::Float32 || st.G != 1 || epi.int8 != nullptr || st.C == 0 || st.M == 0) return false;
  for (const int64_t layout : {st.io.x, st.io.y, st.io.z})
    if (layout != 0 && layout != kChannelsLast) return false;
  // No padding: with one input pixel a pad below the stride still gives one output pixel, but
  // one that reads the padding (the bias alone).
  for (size_t d = 0; d < st.win.rank(); ++d)
    if (st.win.in[d] != 1 || st.win.kernel[d] != 1 || st.win.out[d] != 1 || st.win.pad_begin(d) != 0 ||
        st.win.pad_end(d) != 0)
      return false;
  if (!small_gemm_applies(false, true, st.C, st.M)) return false;
  Tensor& y = ctx.alloc_output(0, x.dtype(), st.yshape);
  const int64_t N = x.dim(0), C = st.C, M = st.M;
  if (N == 0) return true;
  float* yp = y.data<float>();
  if (b) prefill_bias(ctx.pool(), yp, N * M, 1, M, b->data<float>());  // C = the bias rows, summed onto
  small_gemm(ctx.pool(), true, N, M, C, 1.0f, x.data<float>(), C, w.data<float>(), C, b ? 1.0f : 0.0f, yp, M);
  apply_epilogue_all(ctx.pool(), epi, yp, y.numel());
  return true;
}

void conv_compute(KernelContext& ctx, OnednnConvState* constant_weights, ConvSetup* memo) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  const Tensor* b = ctx.input_or_null(2);
  const Tensor* zt = ctx.node().op_type == "FusedConv" ? ctx.input_or_null(3) : nullptr;
  ConvSetup local;
  ConvSetup& st = memo ? *memo : local;
  if (!memo || !st.matches(x, w, b, zt != nullptr)) prepare_conv(ctx, x, w, b, st);
  // Z's type and shape are checked on every call (read_epilogue's check, for a Z that changed).
  if (zt && (zt->dtype() != x.dtype() || zt->shape() != st.yshape))
    ctx.fail("Z is {}{} but the convolution's output is {}{}", dtype_name(zt->dtype()), shape_str(zt->shape()),
             dtype_name(x.dtype()), shape_str(st.yshape));
  const int64_t G = st.G, C = st.C, M = st.M;
  const std::vector<int64_t>& kernel = st.kernel;
  const Window& win = st.win;
  const Shape& yshape = st.yshape;
  Epilogue epi = st.epi;
  epi.z = zt ? zt->raw_data() : nullptr;
  const BlockedIo& io = st.io;
  if (single_pixel_product(ctx, x, w, b, st, epi)) return;
  if (io.any()) {
    // Y = conv(...) + Z in place of a Z that dies here: oneDNN's sum post-op adds what Y holds,
    // so Y needs no copy of Z first. Only where Z and Y share a layout (then oneDNN reorders
    // both or neither) and never into X's buffer.
    const bool in_place = io.z == io.y && z_dies_here(ctx, x, epi);
    if (in_place) {
      ctx.set_output(0, ctx.input(3));
    } else {
      ctx.alloc_output(0, x.dtype(), yshape);
    }
    Tensor& y = ctx.output(0);
    if (y.numel() == 0) return;
    DnnlConvShape ds = dnnl_shape(x.dim(0), C, M, G, to_window3(win), b != nullptr, epi);
    ds.x_block = io.x;
    ds.z_block = io.z;
    ds.y_block = io.y;
    if (C > 0 && onednn_conv_forward(ctx.pool(), ds, x.data<float>(), w.data<float>(), b ? b->data<float>() : nullptr,
                                     static_cast<const float*>(epi.z), y.data<float>(), constant_weights))
      return;
    // oneDNN declined before writing anything; mpq's kernels write Y before they add Z.
    Tensor& fresh = in_place ? ctx.alloc_output(0, x.dtype(), yshape) : y;
    conv_blocked_fallback(ctx, x, w, b, G, win, epi, io, fresh);
    return;
  }
  if (win.rank() > 3) {
    WindowGeometry geo{kernel, win.strides, win.dilations, win.pads, G, false};
    Tensor y = conv_ref(x, w, b, geo);
    if (x.dtype() == DType::Float32)
      apply_epilogue_all(ctx.pool(), epi, y.data<float>(), y.numel());
    else
      apply_epilogue_all(ctx.pool(), epi, y.data<double>(), y.numel());
    ctx.set_output(0, std::move(y));
    return;
  }
  if (x.dtype() == DType::Float32 && win.rank() <= 2 && C > 0 && z_dies_here(ctx, x, epi)) {
    // In place of a dying Z, as above, where oneDNN takes the convolution.
    ctx.set_output(0, ctx.input(3));
    Tensor& y = ctx.output(0);
    if (y.numel() == 0) return;
    const DnnlConvShape ds = dnnl_shape(x.dim(0), C, M, G, to_window3(win), b != nullptr, epi);
    if (onednn_conv_forward(ctx.pool(), ds, x.data<float>(), w.data<float>(), b ? b->data<float>() : nullptr,
                            static_cast<const float*>(epi.z), y.data<float>(), constant_weights))
      return;
  }
  Tensor& y = ctx.alloc_output(0, x.dtype(), yshape);
  if (x.dtype() == DType::Float32) {
    if (!conv_typed<float>(ctx, x, w, b, G, win, epi, y, constant_weights))
      apply_epilogue_all(ctx.pool(), epi, y.data<float>(), y.numel());
  } else {
    if (!conv_typed<double>(ctx, x, w, b, G, win, epi, y)) apply_epilogue_all(ctx.pool(), epi, y.data<double>(), y.numel());
  }
}

// Conv and mpq::FusedConv whose W is a graph constant: the kernel object, one per node and
// executor, keeps the oneDNN plan, its memory objects and the weights in oneDNN's layout between
// runs (calibration, validation and `mpq run` run the same shapes thousands of times). Training
// updates weights in place between steps; it runs inside a DeterministicBlas scope, where
// onednn_conv_forward ignores the state. A W that is not a graph constant gets no state.
class ConvKernel : public OpKernel {
 public:
  explicit ConvKernel(const ir::Node& node) {
    const ir::Value* w = node.num_inputs() > 1 ? node.input(1) : nullptr;
    if (w && w->is_constant()) state_ = std::make_unique<OnednnConvState>();
  }
  void compute(KernelContext& ctx) override { conv_compute(ctx, state_.get(), &setup_); }

 private:
  std::unique_ptr<OnednnConvState> state_;
  ConvSetup setup_;  // the last call's checks and derived values, reused while the shapes hold
};

// ---------------------------------------------------------------- ConvTranspose

// Y[m, i*s + k*d - pad] += col[(m, k), i] for the input positions i (g.in) and output g.out.
template <typename T>
void col2im(ThreadPool& pool, const T* col, int64_t channels, const Window3& g, T* y) {
  const int64_t K = g.k_size(), Sin = g.in_size(), S = g.out_size();
  const int64_t IW = g.in[2], OW = g.out[2];
  pool.parallel_for(channels, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) {
      T* ym = y + m * S;
      for (int64_t kk = 0; kk < K; ++kk) {
        const int64_t kw = kk % g.k[2], kh = (kk / g.k[2]) % g.k[1], kd = kk / (g.k[2] * g.k[1]);
        const T* src = col + (m * K + kk) * Sin;
        const int64_t woff = kw * g.d[2] - g.pb[2];
        const int64_t iw_lo = std::clamp<int64_t>(ceil_div(-woff, g.s[2]), 0, IW);
        const int64_t iw_hi = std::clamp<int64_t>(floor_div(OW - 1 - woff, g.s[2]) + 1, iw_lo, IW);
        for (int64_t id = 0; id < g.in[0]; ++id) {
          const int64_t od = id * g.s[0] + kd * g.d[0] - g.pb[0];
          if (od < 0 || od >= g.out[0]) continue;
          for (int64_t ih = 0; ih < g.in[1]; ++ih) {
            const int64_t oh = ih * g.s[1] + kh * g.d[1] - g.pb[1];
            if (oh < 0 || oh >= g.out[1]) continue;
            const T* s = src + (id * g.in[1] + ih) * IW;
            T* dst = ym + (od * g.out[1] + oh) * OW + woff;
            if (g.s[2] == 1) {
              for (int64_t iw = iw_lo; iw < iw_hi; ++iw) dst[iw] += s[iw];
            } else {
              const int64_t st = g.s[2];
              for (int64_t iw = iw_lo; iw < iw_hi; ++iw) dst[iw * st] += s[iw];
            }
          }
        }
      }
    }
  });
}

// A ConvTranspose whose kernel equals its stride, with no padding or dilation (U-Net's and FPN's
// learned upsampling) writes every output once: Y[m, ih*s + kh, iw*s + kw] = b[m] + col[(m, kh, kw),
// (ih, iw)]. The columns are then interleaved into Y with the bias, instead of filling Y with the
// bias and adding the columns in a scattered loop (U-Net at batch 1: col2im and the bias fill took
// 9 of the ConvTranspose's 19 us). `b + col` is what the fill-then-add gives, bit for bit (an absent
// bias is 0, so a -0 column value still becomes +0).
bool kernel_is_stride(const Window3& g) {
  for (int d = 0; d < 3; ++d)
    if (g.k[d] != g.s[d] || g.d[d] != 1 || g.pb[d] != 0 || g.out[d] != g.in[d] * g.s[d]) return false;
  return true;
}

template <typename T>
void interleave_row_plain(const T* c0, const T* c1, T bias, T* y, int64_t from, int64_t n) {
  for (int64_t i = from; i < n; ++i) {
    y[2 * i] = bias + c0[i];
    y[2 * i + 1] = bias + c1[i];
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Stride 2, float32: 8 values of each column row per step, interleaved by unpack and lane permutes.
__attribute__((target("avx2"))) void interleave_row_avx2(const float* c0, const float* c1, float bias, float* y,
                                                         int64_t n) {
  const __m256 b = _mm256_set1_ps(bias);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_add_ps(b, _mm256_loadu_ps(c0 + i)), z = _mm256_add_ps(b, _mm256_loadu_ps(c1 + i));
    const __m256 lo = _mm256_unpacklo_ps(a, z), hi = _mm256_unpackhi_ps(a, z);  // [a0 z0 a1 z1 | a4 z4 a5 z5], ...
    _mm256_storeu_ps(y + 2 * i, _mm256_permute2f128_ps(lo, hi, 0x20));
    _mm256_storeu_ps(y + 2 * i + 8, _mm256_permute2f128_ps(lo, hi, 0x31));
  }
  interleave_row_plain(c0, c1, bias, y, i, n);
}
#endif

// Output channels [m0, m1) of one image and group: col is [Mg * K, Sin] as the GEMM wrote it
// (channel m's rows from m * K), y the group's [Mg, S] output.
template <typename T>
void interleave_channels(const T* col, int64_t m0, int64_t m1, const Window3& g, const T* bias, T* y) {
  const int64_t K = g.k_size(), Sin = g.in_size(), S = g.out_size();
  const int64_t IH = g.in[1], IW = g.in[2], OH = g.out[1], OW = g.out[2], KH = g.k[1], KW = g.k[2];
  bool avx2 = false;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if constexpr (std::is_same_v<T, float>) {
    static const bool has_avx2 = __builtin_cpu_supports("avx2");
    avx2 = has_avx2;
  }
#endif
  for (int64_t m = m0; m < m1; ++m) {
    const T b = bias ? bias[m] : T(0);
    for (int64_t id = 0; id < g.in[0]; ++id)
      for (int64_t kd = 0; kd < g.k[0]; ++kd)
        for (int64_t kh = 0; kh < KH; ++kh) {
          const T* src = col + (m * K + (kd * KH + kh) * KW) * Sin + id * IH * IW;
          for (int64_t ih = 0; ih < IH; ++ih) {
            T* out = y + m * S + ((id * g.s[0] + kd) * OH + ih * KH + kh) * OW;
            const T* row = src + ih * IW;
            if (KW == 2) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
              if constexpr (std::is_same_v<T, float>) {
                if (avx2) {
                  interleave_row_avx2(row, row + Sin, b, out, IW);
                  continue;
                }
              }
#endif
              interleave_row_plain(row, row + Sin, b, out, 0, IW);
              continue;
            }
            for (int64_t iw = 0; iw < IW; ++iw)
              for (int64_t kw = 0; kw < KW; ++kw) out[iw * KW + kw] = b + row[kw * Sin + iw];
          }
        }
  }
}

template <typename T>
void col2im_kernel_is_stride(ThreadPool& pool, const T* col, int64_t channels, const Window3& g, const T* bias, T* y) {
  pool.parallel_for(channels, std::max<int64_t>(1, 16384 / std::max<int64_t>(g.k_size() * g.in_size(), 1)),
                    [&](int64_t lo, int64_t hi) { interleave_channels(col, lo, hi, g, bias, y); });
}

struct TransposeGeometry {
  std::vector<int64_t> in, kernel, strides, dilations, pads, out, output_padding;
};

TransposeGeometry transpose_window(const KernelContext& ctx, const std::vector<int64_t>& in,
                                   const std::vector<int64_t>& kernel) {
  const size_t k = in.size();
  TransposeGeometry t;
  t.in = in;
  t.kernel = kernel;
  auto ints = [&](const char* name, int64_t fill, bool positive) {
    std::vector<int64_t> v = ctx.node().attr_ints(name, {});
    if (v.empty()) v.assign(k, fill);
    if (v.size() != k) ctx.fail("{} has {} values but the input has {} spatial dimensions", name, v.size(), k);
    for (int64_t x : v)
      if (positive ? x <= 0 : x < 0) ctx.fail("{} must be {}, got {}", name, positive ? "positive" : "non-negative", x);
    return v;
  };
  t.strides = ints("strides", 1, true);
  t.dilations = ints("dilations", 1, true);
  t.output_padding = ints("output_padding", 0, false);
  const AutoPad ap = read_auto_pad(ctx);
  std::vector<int64_t> os = ctx.node().attr_ints("output_shape", {});
  if (!os.empty()) {
    if (os.size() == k + 2) os.erase(os.begin(), os.begin() + 2);
    if (os.size() != k) ctx.fail("output_shape has {} values but the input has {} spatial dimensions", os.size(), k);
  }
  std::vector<int64_t> pads = ctx.node().attr_ints("pads", {});
  if (ap == AutoPad::NotSet && os.empty() && !pads.empty()) {
    if (pads.size() != 2 * k) ctx.fail("pads has {} values, expected {}", pads.size(), 2 * k);
    for (int64_t x : pads)
      if (x < 0) ctx.fail("pads must not be negative, got {}", x);
  } else {
    pads.assign(2 * k, 0);
  }
  t.pads = pads;
  t.out.assign(k, 0);
  for (size_t d = 0; d < k; ++d) {
    const int64_t full = t.strides[d] * (in[d] - 1) + t.output_padding[d] + (kernel[d] - 1) * t.dilations[d] + 1;
    auto distribute = [&](int64_t total) {
      total = std::max<int64_t>(0, total);
      const int64_t small = total / 2, large = total - total / 2;
      t.pads[d] = ap == AutoPad::SameUpper ? small : large;
      t.pads[k + d] = ap == AutoPad::SameUpper ? large : small;
    };
    if (!os.empty()) {
      t.out[d] = os[d];
      distribute(full - os[d]);
    } else if (ap == AutoPad::SameUpper || ap == AutoPad::SameLower) {
      t.out[d] = in[d] * t.strides[d];
      distribute(full - t.out[d]);
    } else {
      t.out[d] = full - t.pads[d] - t.pads[k + d];
    }
    if (t.out[d] <= 0) ctx.fail("the output would be empty in spatial dimension {}", d);
  }
  return t;
}

// ConvTranspose's column buffers up to this size stay allocated on their thread between calls.
constexpr size_t kKeptColumnBytes = size_t{4} << 20;

// A column buffer of `elems` values (the whole column matrix of an image, not tiled like the
// convolution's): this thread's kept one where it is small, otherwise `once`, which the caller
// holds for the call, so a large one is not held for the life of the thread.
template <typename T>
T* column_buffer(size_t elems, std::vector<T>& once) {
  thread_local std::vector<T> kept;
  std::vector<T>& col = elems * sizeof(T) <= kKeptColumnBytes ? kept : once;
  if (col.size() < elems) col.resize(elems);
  return col.data();
}

template <typename T>
void conv_transpose_typed(KernelContext& ctx, const Tensor& x, const Tensor& w, const Tensor* b, int64_t G,
                          const TransposeGeometry& tg, Tensor& y) {
  ThreadPool& pool = ctx.pool();
  Window tmp{tg.in, tg.kernel, tg.strides, tg.dilations, tg.pads, tg.out};
  const Window3 g = to_window3(tmp);
  const int64_t N = x.dim(0), C = x.dim(1), Mg = w.dim(1), M = Mg * G, Cg = C / G;
  const int64_t Sin = g.in_size(), S = g.out_size(), K = g.k_size(), MgK = Mg * K;
  const T* xp = x.data<T>();
  const T* wp = w.data<T>();
  const T* bp = b ? b->data<T>() : nullptr;
  T* yp = y.data<T>();
  if (N == 0 || M == 0 || S == 0) return;
  // Where every output is written once from the columns (kernel_is_stride) they carry the bias
  // themselves; with no input channels there are no columns, so Y is the bias.
  bool pointwise = true;
  for (int d = 0; d < 3; ++d)
    if (g.k[d] != 1 || g.s[d] != 1 || g.pb[d] != 0 || g.out[d] != g.in[d]) pointwise = false;
  const bool kernel_stride = !pointwise && kernel_is_stride(g) && Sin > 0 && Cg > 0;
  if (!kernel_stride) prefill_bias(pool, yp, N * M, S, M, bp);
  if (Sin == 0 || Cg == 0) return;
  const int64_t tasks = N * G;
  // One (image, group) per task where they fill every thread evenly, or nearly (U-Net's upsampling
  // at batch 8: two parallel loops per image were 0.12 ms on two threads, no faster than on one);
  // otherwise each GEMM and col2im is split over the pool.
  const bool spread = blas_runs_single_threaded(MgK, Sin, Cg) || tasks % pool.size() == 0 || tasks >= 4 * pool.size();
  if (pointwise) {
    const T beta = bp ? T(1) : T(0);
    run_tasks(pool, tasks, spread, [&](int64_t t) {
      const int64_t n = t / G, gi = t % G;
      blas_gemm_split(pool, true, false, Mg, S, Cg, T(1), wp + gi * Cg * Mg, Mg, xp + (n * C + gi * Cg) * Sin, Sin,
                      beta, yp + (n * M + gi * Mg) * S, S);
    });
    return;
  }
  // col[rows, Sin] = W^T X for a part of W's columns. OpenBLAS, or oneDNN where OpenBLAS runs
  // without AVX-512 on an AVX-512 CPU (matmul_onednn.h), on the calling thread (threads 1) or on
  // the pool's threads (threads 0: OpenBLAS split as blas_gemm_split splits it, oneDNN on a team
  // of the pool's size; one thread either way inside a parallel loop).
  auto transpose_gemm = [&](int threads, int64_t rows, int64_t cols, int64_t inner, const T* wt, int64_t ldw,
                            const T* xt, T* col) {
    if constexpr (std::is_same_v<T, float>) {
      const int team = threads == 1 || blas_runs_single_threaded(rows, cols, inner) ? 1 : pool.size();
      if (onednn_sgemm_below_cpu(team, true, false, rows, cols, inner, 1.0f, wt, ldw, xt, cols, 0.0f, col, cols)) return;
    }
    if (threads == 1)
      blas_gemm(true, false, rows, cols, inner, T(1), wt, ldw, xt, cols, T(0), col, cols);
    else
      blas_gemm_split(pool, true, false, rows, cols, inner, T(1), wt, ldw, xt, cols, T(0), col, cols);
  };
  // One (image, group) with kernel equal to stride on several threads (U-Net's upsampling at
  // batch 1): each thread takes whole output channels, their GEMM rows and their interleave, in
  // one parallel region, so it reads back the columns it wrote. Splitting the GEMM and then the
  // interleave separately took two regions, and each thread read the other's columns: no faster
  // on two threads than on one (15-19 us). Not under DeterministicBlas, whose GEMMs must not
  // depend on the thread count.
  if (kernel_stride && tasks == 1 && pool.size() > 1 && !ThreadPool::inside_parallel_loop() && !deterministic_blas() &&
      Mg >= pool.size() && !blas_runs_single_threaded(MgK, Sin, Cg)) {
    const int parts = pool.size();
    std::vector<T> once;
    T* col = column_buffer(static_cast<size_t>(MgK * Sin), once);  // the calling thread's, shared by the parts
    pool.run_per_thread(parts, [&](int part) {
      const int64_t m0 = Mg * part / parts, m1 = Mg * (part + 1) / parts;
      if (m1 <= m0) return;
      transpose_gemm(1, (m1 - m0) * K, Sin, Cg, wp + m0 * K, MgK, xp, col + m0 * K * Sin);
      interleave_channels(col, m0, m1, g, bp, yp);
    });
    return;
  }
  auto one_task = [&](int64_t t, T* col) {
    const int64_t n = t / G, gi = t % G;
    transpose_gemm(0, MgK, Sin, Cg, wp + gi * Cg * MgK, MgK, xp + (n * C + gi * Cg) * Sin, col);
    if (kernel_stride)
      col2im_kernel_is_stride(pool, col, Mg, g, bp ? bp + gi * Mg : nullptr, yp + (n * M + gi * Mg) * S);
    else
      col2im(pool, col, Mg, g, yp + (n * M + gi * Mg) * S);
  };
  // One column buffer per running thread.
  auto run = [&](int64_t lo, int64_t hi) {
    std::vector<T> once;
    T* col = column_buffer(static_cast<size_t>(MgK * Sin), once);
    for (int64_t t = lo; t < hi; ++t) one_task(t, col);
  };
  if (spread && tasks > 1) pool.parallel_for(tasks, 1, run);
  else run(0, tasks);
}

void conv_transpose_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  const Tensor* b = ctx.input_or_null(2);
  check_float_inputs(ctx, x, w, b);
  const int64_t G = ctx.node().attr_int("group", 1);
  if (G <= 0) ctx.fail("group must be positive, got {}", G);
  const int64_t C = x.dim(1);
  if (C % G != 0) ctx.fail("X has {} channels, which group={} does not divide", C, G);
  if (w.dim(0) != C) ctx.fail("X has {} channels but W {} expects {}", C, shape_str(w.shape()), w.dim(0));
  const int64_t M = w.dim(1) * G;
  if (b && (b->rank() != 1 || b->dim(0) != M)) ctx.fail("B has shape {}, expected [{}]", shape_str(b->shape()), M);
  std::vector<int64_t> kernel = spatial(w);
  check_kernel_shape_attr(ctx, kernel);
  TransposeGeometry tg = transpose_window(ctx, spatial(x), kernel);
  if (tg.in.size() > 3) {
    WindowGeometry geo{kernel, tg.strides, tg.dilations, tg.pads, G, false};
    // The reference derives the size from the pads; fold the requested size into output_padding.
    std::vector<int64_t> opad(tg.in.size());
    for (size_t d = 0; d < tg.in.size(); ++d)
      opad[d] = tg.out[d] - (tg.strides[d] * (tg.in[d] - 1) + (kernel[d] - 1) * tg.dilations[d] + 1 - tg.pads[d] -
                             tg.pads[tg.in.size() + d]);
    ctx.set_output(0, conv_transpose_ref(x, w, b, geo, opad));
    return;
  }
  Shape yshape{x.dim(0), M};
  yshape.insert(yshape.end(), tg.out.begin(), tg.out.end());
  Tensor& y = ctx.alloc_output(0, x.dtype(), yshape);
  if (x.dtype() == DType::Float32)
    conv_transpose_typed<float>(ctx, x, w, b, G, tg, y);
  else
    conv_transpose_typed<double>(ctx, x, w, b, G, tg, y);
}

}  // namespace

void register_conv(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  auto conv_def = [&](const char* domain, const char* op) {
    KernelDef d;
    d.domain = domain;
    d.op_type = op;
    d.backend = cpu;
    d.factory = [](const ir::Node& node, int) -> std::unique_ptr<OpKernel> { return std::make_unique<ConvKernel>(node); };
    r.add(std::move(d));
  };
  conv_def("", "Conv");
  r.add_fn("", "ConvTranspose", 1, kMaxOpset, cpu, conv_transpose_kernel);
  // Conv + residual Add + activation, produced by passes/fuse_conv_activation for `mpq run`.
  conv_def("mpq", "FusedConv");
}

}  // namespace mpq::rt::cpu
