// Conv and ConvTranspose (1-D, 2-D, 3-D; groups, strides, dilations, pads, auto_pad, bias).
//
// Conv picks one of three strategies:
//   * depthwise (one input channel per group, float32, 1-D/2-D): direct kernel, conv_depthwise.cpp;
//   * pointwise (1x1 kernel, stride 1, no padding): one GEMM per (image, group) straight on X;
//   * otherwise im2col + GEMM per (image, group), in cache-sized tiles of output rows.
// The output is pre-filled with the bias and the GEMM accumulates onto it (beta = 1), so the bias
// costs no extra pass. GEMMs large enough for OpenBLAS to thread run one at a time on its threads;
// (image, group) tasks whose GEMM OpenBLAS would run single-threaded anyway are spread over the
// kernel pool instead. ConvTranspose is GEMM (W^T X) + col2im per (image, group).
// More than three spatial dimensions fall back to the scalar reference implementation.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/cpu/conv_common.h"
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

// col[(c, kd, kh, kw), (p - p0) * OW + ow] = X[c, od*s + kd*d - pad, oh*s + kh*d - pad, ow*s + kw*d - pad]
// for output rows p = od * OH + oh in [p0, p1); zero where the window is in the padding.
template <typename T>
void im2col(ThreadPool& pool, const T* x, int64_t channels, const Window3& g, int64_t p0, int64_t p1, T* col) {
  const int64_t OW = g.out[2], OH = g.out[1];
  const int64_t ld = (p1 - p0) * OW;
  const int64_t K = g.k_size();
  const int64_t in_plane = g.in_size();
  pool.parallel_for(channels * K, std::max<int64_t>(1, 32768 / std::max<int64_t>(ld, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const int64_t c = r / K, kk = r % K;
      const int64_t kw = kk % g.k[2], kh = (kk / g.k[2]) % g.k[1], kd = kk / (g.k[2] * g.k[1]);
      const T* xc = x + c * in_plane;
      T* dst = col + r * ld;
      const int64_t woff = kw * g.d[2] - g.pb[2];
      const int64_t ow_lo = std::clamp<int64_t>(ceil_div(-woff, g.s[2]), 0, OW);
      const int64_t ow_hi = std::clamp<int64_t>(floor_div(g.in[2] - 1 - woff, g.s[2]) + 1, ow_lo, OW);
      for (int64_t p = p0; p < p1; ++p, dst += OW) {
        const int64_t od = p / OH, oh = p % OH;
        const int64_t id = od * g.s[0] + kd * g.d[0] - g.pb[0];
        const int64_t ih = oh * g.s[1] + kh * g.d[1] - g.pb[1];
        if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
          std::fill(dst, dst + OW, T(0));
          continue;
        }
        const T* src = xc + (id * g.in[1] + ih) * g.in[2] + woff;
        // Border runs are a few elements: plain loops, not memset calls.
        for (int64_t ow = 0; ow < ow_lo; ++ow) dst[ow] = T(0);
        bool done = false;
        if (g.s[2] == 1) {
          std::memcpy(dst + ow_lo, src + ow_lo, static_cast<size_t>(ow_hi - ow_lo) * sizeof(T));
          done = true;
        } else if constexpr (std::is_same_v<T, float>) {
          if (g.s[2] == 2) {
            gather_stride2(src + 2 * ow_lo, dst + ow_lo, ow_hi - ow_lo);
            done = true;
          }
        }
        if (!done) {
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

template <typename T>
void conv_typed(KernelContext& ctx, const Tensor& x, const Tensor& w, const Tensor* b, int64_t G, const Window& win,
                Tensor& y) {
  ThreadPool& pool = ctx.pool();
  const Window3 g = to_window3(win);
  const int64_t N = x.dim(0), C = x.dim(1), M = w.dim(0);
  const int64_t Cg = C / G, Mg = M / G;
  const int64_t S = g.out_size(), Sin = g.in_size(), K = g.k_size(), CgK = Cg * K;
  const T* xp = x.data<T>();
  const T* wp = w.data<T>();
  const T* bp = b ? b->data<T>() : nullptr;
  T* yp = y.data<T>();
  if (N == 0 || M == 0 || S == 0) return;

  if constexpr (std::is_same_v<T, float>) {
    if (Cg == 1 && G > 1 && win.rank() <= 2) {
      depthwise_conv2d(pool, xp, wp, bp, yp, N, C, Mg, g);
      return;
    }
  }

  prefill_bias(pool, yp, N * M, S, M, bp);
  if (CgK == 0) return;  // no input channels: the bias alone
  const T beta = bp ? T(1) : T(0);
  const int64_t tasks = N * G;
  const bool spread = blas_runs_single_threaded(Mg, S, CgK);
  bool pointwise = true;
  for (int d = 0; d < 3; ++d)
    if (g.k[d] != 1 || g.s[d] != 1 || g.pb[d] != 0 || g.pe[d] != 0) pointwise = false;

  if (pointwise) {
    run_tasks(pool, tasks, spread, [&](int64_t t) {
      const int64_t n = t / G, gi = t % G;
      blas_gemm(false, false, Mg, S, Cg, T(1), wp + gi * Mg * Cg, Cg, xp + (n * C + gi * Cg) * Sin, Sin, beta,
                yp + (n * M + gi * Mg) * S, S);
    });
    return;
  }

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
      blas_gemm(false, false, Mg, cols, CgK, T(1), wg, CgK, col, cols, beta, yg + p0 * g.out[2], S);
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
}

void conv_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  const Tensor* b = ctx.input_or_null(2);
  check_float_inputs(ctx, x, w, b);
  const int64_t G = ctx.node().attr_int("group", 1);
  if (G <= 0) ctx.fail("group must be positive, got {}", G);
  const int64_t C = x.dim(1), M = w.dim(0);
  if (C % G != 0) ctx.fail("X has {} channels, which group={} does not divide", C, G);
  if (w.dim(1) * G != C)
    ctx.fail("X has {} channels but W {} with group={} expects {}", C, shape_str(w.shape()), G, w.dim(1) * G);
  if (M % G != 0) ctx.fail("W has {} output channels, which group={} does not divide", M, G);
  if (b && (b->rank() != 1 || b->dim(0) != M)) ctx.fail("B has shape {}, expected [{}]", shape_str(b->shape()), M);
  std::vector<int64_t> kernel = spatial(w);
  check_kernel_shape_attr(ctx, kernel);
  Window win = forward_window(ctx, spatial(x), kernel, false);
  if (win.rank() > 3) {
    WindowGeometry geo{kernel, win.strides, win.dilations, win.pads, G, false};
    ctx.set_output(0, conv_ref(x, w, b, geo));
    return;
  }
  Shape yshape{x.dim(0), M};
  yshape.insert(yshape.end(), win.out.begin(), win.out.end());
  Tensor& y = ctx.alloc_output(0, x.dtype(), yshape);
  if (x.dtype() == DType::Float32)
    conv_typed<float>(ctx, x, w, b, G, win, y);
  else
    conv_typed<double>(ctx, x, w, b, G, win, y);
}

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
  prefill_bias(pool, yp, N * M, S, M, bp);
  if (Sin == 0 || Cg == 0) return;
  const int64_t tasks = N * G;
  const bool spread = blas_runs_single_threaded(MgK, Sin, Cg);
  bool pointwise = true;
  for (int d = 0; d < 3; ++d)
    if (g.k[d] != 1 || g.s[d] != 1 || g.pb[d] != 0 || g.out[d] != g.in[d]) pointwise = false;
  if (pointwise) {
    const T beta = bp ? T(1) : T(0);
    run_tasks(pool, tasks, spread, [&](int64_t t) {
      const int64_t n = t / G, gi = t % G;
      blas_gemm(true, false, Mg, S, Cg, T(1), wp + gi * Cg * Mg, Mg, xp + (n * C + gi * Cg) * Sin, Sin, beta,
                yp + (n * M + gi * Mg) * S, S);
    });
    return;
  }
  auto one_task = [&](int64_t t, T* col) {
    const int64_t n = t / G, gi = t % G;
    blas_gemm(true, false, MgK, Sin, Cg, T(1), wp + gi * Cg * MgK, MgK, xp + (n * C + gi * Cg) * Sin, Sin, T(0), col,
              Sin);
    col2im(pool, col, Mg, g, yp + (n * M + gi * Mg) * S);
  };
  const size_t col_elems = static_cast<size_t>(MgK * Sin);
  if (spread && tasks > 1) {
    pool.parallel_for(tasks, 1, [&](int64_t lo, int64_t hi) {
      std::vector<T> col(col_elems);
      for (int64_t t = lo; t < hi; ++t) one_task(t, col.data());
    });
  } else {
    std::vector<T> col(col_elems);
    for (int64_t t = 0; t < tasks; ++t) one_task(t, col.data());
  }
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
  r.add_fn("", "Conv", 1, kMaxOpset, cpu, conv_kernel);
  r.add_fn("", "ConvTranspose", 1, kMaxOpset, cpu, conv_transpose_kernel);
}

}  // namespace mpq::rt::cpu
