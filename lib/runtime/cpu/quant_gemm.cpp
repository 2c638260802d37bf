// Integer matrix products: MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv.
//
// The int32 accumulators are exact: operands are centred (q - zero_point, integers of at most 9
// bits) and multiplied with sgemm (blas_gemm_split) in chunks along K short enough that every partial sum
// stays within 2^24, where float32 holds integers exactly (see exact_gemm); chunk results are
// added in int32. Requantization then follows ONNX Runtime:
// y = saturate(round_half_to_even(float(acc + bias) * (in_scale * w_scale / out_scale)) + y_zp),
// bit for bit with calib::requantize_ref.
#include <algorithm>
#include <cstdlib>

#include "runtime/cpu/common.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/quant_internal.h"

namespace mpq::rt::cpu::quant {

namespace {

constexpr int64_t kGrain = 16384;

int32_t wrap_add(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}

// C[M, N] = A[M, K] * B[K, N] in int32, where A and B hold integers with |a| <= amax, |b| <= bmax.
// A float32 sum of integers is exact while every partial sum is at most 2^24 in magnitude,
// whatever the order or blocking of the additions (FMA included), so K is cut into chunks of at
// most 2^24 / (amax * bmax) terms; each chunk's float result converts exactly to int32.
void exact_gemm(ThreadPool& pool, int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B,
                int64_t ldb, int64_t amax, int64_t bmax, int32_t* C, int64_t ldc, std::vector<float>& scratch) {
  if (M == 0 || N == 0) return;
  for (int64_t i = 0; i < M; ++i) std::fill(C + i * ldc, C + i * ldc + N, 0);
  if (K == 0 || amax == 0 || bmax == 0) return;
  const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 24) / (amax * bmax));
  scratch.resize(static_cast<size_t>(M * N));
  float* t = scratch.data();
  for (int64_t k0 = 0; k0 < K; k0 += chunk) {
    const int64_t kk = std::min(chunk, K - k0);
    blas_gemm_split(pool, false, false, M, N, kk, 1.0f, A + k0, lda, B + k0 * ldb, ldb, 0.0f, t, N);
    for (int64_t i = 0; i < M; ++i) {
      int32_t* c = C + i * ldc;
      const float* ti = t + i * N;
      for (int64_t j = 0; j < N; ++j) c[j] = wrap_add(c[j], static_cast<int32_t>(ti[j]));
    }
  }
}

// Largest |x - z| over the data and zero points (a cheap, conservative bound from their ranges).
template <typename T>
int64_t max_abs_centered(const T* x, int64_t n, const std::vector<int32_t>& zp) {
  if (n == 0) return 0;
  T lo = x[0], hi = x[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = x[i] < lo ? x[i] : lo;
    hi = x[i] > hi ? x[i] : hi;
  }
  const int64_t zmin = *std::min_element(zp.begin(), zp.end()), zmax = *std::max_element(zp.begin(), zp.end());
  return std::max(std::abs(static_cast<int64_t>(lo) - zmax), std::abs(static_cast<int64_t>(hi) - zmin));
}

void check_qtype(const KernelContext& ctx, const Tensor& t, const char* what) {
  if (t.dtype() != DType::Int8 && t.dtype() != DType::UInt8)
    ctx.fail("{} must be int8 or uint8, got {}", what, dtype_name(t.dtype()));
}

struct Centered {
  std::vector<float> v;
  int64_t max_abs = 0;
};

// x - zero_point as floats (exact: small integers), the zero point broadcast against x (a scalar,
// or a tensor whose shape broadcasts to x's without enlarging it). `zp_shape` overrides the zero
// point's own shape.
Centered centered(const KernelContext& ctx, ThreadPool& pool, const Tensor& x, const Tensor* zp, const Shape* zp_shape,
                  const char* what) {
  const int64_t n = x.numel();
  Centered out;
  out.v.resize(static_cast<size_t>(n));
  if (zp && zp->dtype() != x.dtype())
    ctx.fail("{} zero point type {} does not match the input type {}", what, dtype_name(zp->dtype()),
             dtype_name(x.dtype()));
  std::vector<int32_t> z = zp ? read_int32(*zp) : std::vector<int32_t>{0};
  if (z.empty()) ctx.fail("{} zero point is empty", what);
  visit_quant_storage(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* px = x.data<T>();
    float* po = out.v.data();
    out.max_abs = max_abs_centered(px, n, z);
    if (z.size() == 1) {
      const int32_t zv = z[0];
      pool.parallel_for(n, kGrain, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) po[i] = static_cast<float>(static_cast<int32_t>(px[i]) - zv);
      });
      return;
    }
    const Shape& zs = zp_shape ? *zp_shape : zp->shape();
    if (shape_numel(zs) != static_cast<int64_t>(z.size())) fail_internal("centered: zero point shape mismatch");
    if (zs.size() > x.shape().size() || broadcast_shapes(ctx, {&x.shape(), &zs}) != x.shape())
      ctx.fail("{} zero point of shape {} does not fit the input of shape {}", what, shape_str(zs), shape_str(x.shape()));
    BroadcastIter it(x.shape(), {&x.shape(), &zs});
    const int64_t inner = it.inner();
    const int64_t sz = it.inner_stride(1);
    pool.parallel_for(it.outer_count(), std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1)),
                      [&](int64_t lo, int64_t hi) {
                        int64_t off[BroadcastIter::kMaxInputs];
                        for (int64_t o = lo; o < hi; ++o) {
                          it.offsets(o, off);
                          const T* xs = px + off[0];
                          const int32_t* zz = z.data() + off[1];
                          float* d = po + off[0];
                          for (int64_t i = 0; i < inner; ++i) d[i] = static_cast<float>(static_cast<int32_t>(xs[i]) - zz[i * sz]);
                        }
                      });
  });
  return out;
}

// ---------------------------------------------------------------------------------------------
// Batched matrix product with numpy MatMul shape rules.

struct MatMulPlan {
  int64_t M = 1, K = 1, N = 1;
  Shape out;
  std::vector<int64_t> a_off, b_off;  // per output batch: element offsets of A's and B's matrices
};

MatMulPlan plan_matmul(const KernelContext& ctx, const Shape& a_in, const Shape& b_in) {
  if (a_in.empty() || b_in.empty()) ctx.fail("MatMul inputs must have rank >= 1");
  Shape a = a_in, b = b_in;
  const bool a1 = a.size() == 1, b1 = b.size() == 1;
  if (a1) a.insert(a.begin(), 1);
  if (b1) b.push_back(1);
  MatMulPlan p;
  p.M = a[a.size() - 2];
  p.K = a.back();
  p.N = b.back();
  if (b[b.size() - 2] != p.K)
    ctx.fail("inner dimensions do not match: {} and {}", shape_str(a_in), shape_str(b_in));
  Shape ab(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  Shape batch = broadcast_shapes(ctx, {&ab, &bb});
  const size_t rank = batch.size();
  auto batch_strides = [&](const Shape& s, int64_t mat) {
    std::vector<int64_t> st(rank, 0);
    int64_t stride = mat;
    for (size_t i = 0; i < s.size(); ++i) {
      size_t d = s.size() - 1 - i;
      size_t od = rank - 1 - i;
      st[od] = s[d] == 1 ? 0 : stride;
      stride *= s[d];
    }
    return st;
  };
  std::vector<int64_t> sa = batch_strides(ab, p.M * p.K), sb = batch_strides(bb, p.K * p.N);
  const int64_t nb = shape_numel(batch);
  p.a_off.resize(static_cast<size_t>(nb));
  p.b_off.resize(static_cast<size_t>(nb));
  for (int64_t i = 0; i < nb; ++i) {
    int64_t rem = i, oa = 0, ob = 0;
    for (size_t d = rank; d-- > 0;) {
      const int64_t idx = rem % batch[d];
      rem /= batch[d];
      oa += idx * sa[d];
      ob += idx * sb[d];
    }
    p.a_off[static_cast<size_t>(i)] = oa;
    p.b_off[static_cast<size_t>(i)] = ob;
  }
  p.out = batch;
  if (!a1) p.out.push_back(p.M);
  if (!b1) p.out.push_back(p.N);
  return p;
}

// Exact integer products of centred operands: acc[batch][M][N].
std::vector<int32_t> int_matmul(ThreadPool& pool, const MatMulPlan& p, const Centered& a, const Centered& b) {
  const int64_t nb = static_cast<int64_t>(p.a_off.size());
  std::vector<int32_t> c(static_cast<size_t>(nb * p.M * p.N));
  std::vector<float> scratch;
  for (int64_t i = 0; i < nb; ++i)
    exact_gemm(pool, p.M, p.N, p.K, a.v.data() + p.a_off[static_cast<size_t>(i)], p.K, b.v.data() + p.b_off[static_cast<size_t>(i)],
               p.N, a.max_abs, b.max_abs, c.data() + i * p.M * p.N, p.N, scratch);
  return c;
}

// A per-row zero point / scale of A given as a vector of M values applies along A's rows.
Shape a_param_shape(const Tensor& a, const Tensor& param) {
  if (param.rank() == 1 && a.rank() >= 2 && param.numel() == a.dim(-2) && param.numel() != 1)
    return Shape{param.numel(), 1};
  return param.shape();
}

void matmul_integer(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  check_qtype(ctx, a, "A");
  check_qtype(ctx, b, "B");
  const Tensor* azp = ctx.input_or_null(2);
  const Tensor* bzp = ctx.input_or_null(3);
  MatMulPlan p = plan_matmul(ctx, a.shape(), b.shape());
  Shape azs = azp ? a_param_shape(a, *azp) : Shape{};
  Centered ad = centered(ctx, ctx.pool(), a, azp, azp ? &azs : nullptr, "A");
  Centered bd = centered(ctx, ctx.pool(), b, bzp, nullptr, "B");
  std::vector<int32_t> acc = int_matmul(ctx.pool(), p, ad, bd);
  Tensor& y = ctx.alloc_output(0, DType::Int32, p.out);
  std::copy(acc.begin(), acc.end(), y.data<int32_t>());
}

// Per-tensor (1 value) or per-row / per-column (count values) parameters.
std::vector<float> scale_vector(const KernelContext& ctx, const Tensor& t, int64_t count, const char* what) {
  std::vector<float> s = read_scales(ctx, t, what);
  if (s.size() != 1 && static_cast<int64_t>(s.size()) != count)
    ctx.fail("{} must hold 1 or {} values, got shape {}", what, count, shape_str(t.shape()));
  return s;
}

int32_t scalar_zero_point(const KernelContext& ctx, const Tensor* zp, DType type, const char* what) {
  if (!zp) return 0;
  if (zp->dtype() != type)
    ctx.fail("{} type {} does not match {}", what, dtype_name(zp->dtype()), dtype_name(type));
  if (zp->numel() != 1) ctx.fail("{} must be a scalar, got shape {}", what, shape_str(zp->shape()));
  return read_int32(*zp)[0];
}

float scalar_scale(const KernelContext& ctx, const Tensor& t, const char* what) {
  std::vector<float> s = read_scales(ctx, t, what);
  if (s.size() != 1) ctx.fail("{} must be a scalar, got shape {}", what, shape_str(t.shape()));
  return s[0];
}

void qlinear_matmul(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(3);
  check_qtype(ctx, a, "a");
  check_qtype(ctx, b, "b");
  const Tensor* azp = ctx.input_or_null(2);
  const Tensor* bzp = ctx.input_or_null(5);
  const Tensor* yzp = ctx.input_or_null(7);
  MatMulPlan p = plan_matmul(ctx, a.shape(), b.shape());
  std::vector<float> as = scale_vector(ctx, ctx.input(1), p.M, "a_scale");
  std::vector<float> bs = scale_vector(ctx, ctx.input(4), p.N, "b_scale");
  const float ys = scalar_scale(ctx, ctx.input(6), "y_scale");
  const DType ytype = yzp ? yzp->dtype() : a.dtype();
  if (ytype != DType::Int8 && ytype != DType::UInt8) ctx.fail("y_zero_point must be int8 or uint8, got {}", dtype_name(ytype));
  const int32_t yz = scalar_zero_point(ctx, yzp, ytype, "y_zero_point");
  Shape azs = azp ? a_param_shape(a, *azp) : Shape{};
  Centered ad = centered(ctx, ctx.pool(), a, azp, azp ? &azs : nullptr, "a");
  Centered bd = centered(ctx, ctx.pool(), b, bzp, nullptr, "b");
  std::vector<int32_t> acc = int_matmul(ctx.pool(), p, ad, bd);
  // Output multipliers, (a_scale * b_scale) / y_scale in float as ONNX Runtime computes them.
  std::vector<float> mult(as.size() * bs.size());
  for (size_t i = 0; i < as.size(); ++i)
    for (size_t j = 0; j < bs.size(); ++j) mult[i * bs.size() + j] = (as[i] * bs[j]) / ys;
  const QRange range = qrange_of(ytype);
  Tensor& y = ctx.alloc_output(0, ytype, p.out);
  const int64_t rows = static_cast<int64_t>(p.a_off.size()) * p.M;
  visit_quant_storage(ytype, [&](auto tag) {
    using Q = typename decltype(tag)::type;
    Q* py = y.data<Q>();
    ctx.pool().parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(p.N, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t m = r % p.M;
        const int32_t* accrow = acc.data() + r * p.N;
        const float* mrow = mult.data() + (as.size() == 1 ? 0 : static_cast<size_t>(m) * bs.size());
        if (bs.size() == 1) {
          requantize_run<Q>(accrow, p.N, 0, mrow[0], yz, range, py + r * p.N);
        } else {
          for (int64_t j = 0; j < p.N; ++j) requantize_run<Q>(accrow + j, 1, 0, mrow[j], yz, range, py + r * p.N + j);
        }
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Convolution by im2col + exact dgemm, spatial rank 1 to 3.

struct ConvGeom {
  int64_t N = 0, C = 0, M = 0, group = 1, Cg = 0, Mg = 0;
  int nsp = 0;
  // Spatial dims padded to 3-D with leading 1s.
  int64_t in[3] = {1, 1, 1}, k[3] = {1, 1, 1}, out[3] = {1, 1, 1}, stride[3] = {1, 1, 1}, dil[3] = {1, 1, 1},
          pad[3] = {0, 0, 0};
  Shape out_shape;
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
};

ConvGeom conv_geometry(const KernelContext& ctx, const Tensor& x, const Tensor& w) {
  const ir::Node& node = ctx.node();
  ConvGeom g;
  if (x.rank() < 3 || x.rank() > 5) ctx.fail_unsupported("convolution input must have rank 3 to 5, got {}", x.rank());
  if (w.rank() != x.rank()) ctx.fail("weight rank {} differs from input rank {}", w.rank(), x.rank());
  g.nsp = x.rank() - 2;
  g.N = x.dim(0);
  g.C = x.dim(1);
  g.M = w.dim(0);
  g.group = node.attr_int("group", 1);
  if (g.group <= 0 || g.C % g.group != 0 || g.M % g.group != 0)
    ctx.fail("group {} must divide the input channels {} and output channels {}", g.group, g.C, g.M);
  g.Cg = g.C / g.group;
  g.Mg = g.M / g.group;
  if (w.dim(1) != g.Cg) ctx.fail("weight shape {} needs {} input channels per group, input has {}", shape_str(w.shape()), w.dim(1), g.Cg);
  const size_t ns = static_cast<size_t>(g.nsp);
  std::vector<int64_t> ks = node.attr_ints("kernel_shape");
  if (ks.empty())
    for (int d = 0; d < g.nsp; ++d) ks.push_back(w.dim(2 + d));
  std::vector<int64_t> strides = node.attr_ints("strides", std::vector<int64_t>(ns, 1));
  std::vector<int64_t> dils = node.attr_ints("dilations", std::vector<int64_t>(ns, 1));
  std::vector<int64_t> pads = node.attr_ints("pads", std::vector<int64_t>(2 * ns, 0));
  if (ks.size() != ns || strides.size() != ns || dils.size() != ns || pads.size() != 2 * ns)
    ctx.fail("kernel_shape/strides/dilations/pads do not match {} spatial dimensions", g.nsp);
  const std::string auto_pad = node.attr_string("auto_pad", "NOTSET");
  const int off = 3 - g.nsp;
  g.out_shape = {g.N, g.M};
  for (size_t d = 0; d < ns; ++d) {
    const int64_t in = x.dim(static_cast<int>(2 + d));
    if (ks[d] != w.dim(static_cast<int>(2 + d))) ctx.fail("kernel_shape {} does not match the weight shape {}", ks[d], shape_str(w.shape()));
    if (strides[d] <= 0 || dils[d] <= 0) ctx.fail("strides and dilations must be positive");
    const int64_t ek = (ks[d] - 1) * dils[d] + 1;
    int64_t pb = pads[d], pe = pads[d + ns];
    if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
      const int64_t o = (in + strides[d] - 1) / strides[d];
      const int64_t total = std::max<int64_t>(0, (o - 1) * strides[d] + ek - in);
      pb = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pe = total - pb;
    } else if (auto_pad == "VALID") {
      pb = pe = 0;
    } else if (auto_pad != "NOTSET" && !auto_pad.empty()) {
      ctx.fail("unknown auto_pad '{}'", auto_pad);
    }
    if (pb < 0 || pe < 0) ctx.fail("pads must be non-negative");
    const int64_t o = (in + pb + pe - ek) / strides[d] + 1;
    if (in + pb + pe < ek) ctx.fail("kernel is larger than the padded input");
    g.in[off + d] = in;
    g.k[off + d] = ks[d];
    g.out[off + d] = o;
    g.stride[off + d] = strides[d];
    g.dil[off + d] = dils[d];
    g.pad[off + d] = pb;
    g.out_shape.push_back(o);
  }
  return g;
}

// col[(c * k_size + kk) * P + p] = x[n, c0 + c, input position of (kk, p)] - zp, 0 in the padding.
template <typename T>
void im2col(ThreadPool& pool, const ConvGeom& g, const T* x, int32_t zp, int64_t n, int64_t c0, float* col) {
  const int64_t P = g.out_size(), KS = g.k_size(), IS = g.in_size();
  const int64_t rows = g.Cg * KS;
  pool.parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(P, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row) {
      const int64_t c = row / KS;
      int64_t kk = row % KS;
      const int64_t kw = kk % g.k[2];
      kk /= g.k[2];
      const int64_t kh = kk % g.k[1];
      const int64_t kd = kk / g.k[1];
      const T* xc = x + (n * g.C + c0 + c) * IS;
      float* dst = col + row * P;
      for (int64_t od = 0; od < g.out[0]; ++od) {
        const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dil[0];
        for (int64_t oh = 0; oh < g.out[1]; ++oh) {
          const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dil[1];
          float* d = dst + (od * g.out[1] + oh) * g.out[2];
          if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
            std::fill(d, d + g.out[2], 0.0f);
            continue;
          }
          const T* xr = xc + (id * g.in[1] + ih) * g.in[2];
          const int64_t base = kw * g.dil[2] - g.pad[2];
          if (g.stride[2] == 1 && base >= 0 && base + g.out[2] <= g.in[2]) {
            for (int64_t ow = 0; ow < g.out[2]; ++ow) d[ow] = static_cast<float>(static_cast<int32_t>(xr[base + ow]) - zp);
          } else {
            for (int64_t ow = 0; ow < g.out[2]; ++ow) {
              const int64_t iw = ow * g.stride[2] + base;
              d[ow] = (iw >= 0 && iw < g.in[2]) ? static_cast<float>(static_cast<int32_t>(xr[iw]) - zp) : 0.0f;
            }
          }
        }
      }
    }
  });
}

// Exact int32 accumulators acc[n][m][p] of an integer convolution, delivered one (n, group)
// block at a time: sink(n, m0, block) with block [Mg, P].
template <typename Sink>
void int_conv(KernelContext& ctx, const ConvGeom& g, const Tensor& x, int32_t x_zp, const Tensor& w,
              const std::vector<int32_t>& w_zp, Sink sink) {
  const int64_t P = g.out_size(), KS = g.k_size();
  const int64_t Kc = g.Cg * KS;
  // Centred weights [M, Cg * KS] and the operand bounds that size exact_gemm's chunks.
  std::vector<float> wd(static_cast<size_t>(g.M * Kc));
  int64_t wmax = 0, xmax = 0;
  visit_quant_storage(w.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pw = w.data<T>();
    wmax = max_abs_centered(pw, w.numel(), w_zp);
    for (int64_t m = 0; m < g.M; ++m) {
      const int32_t z = w_zp.size() == 1 ? w_zp[0] : w_zp[static_cast<size_t>(m)];
      for (int64_t j = 0; j < Kc; ++j)
        wd[static_cast<size_t>(m * Kc + j)] = static_cast<float>(static_cast<int32_t>(pw[m * Kc + j]) - z);
    }
  });
  visit_quant_storage(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    xmax = max_abs_centered(x.data<T>(), x.numel(), std::vector<int32_t>{x_zp});
  });
  std::vector<float> col(static_cast<size_t>(Kc * P));
  std::vector<int32_t> out(static_cast<size_t>(g.Mg * P));
  std::vector<float> scratch;
  for (int64_t n = 0; n < g.N; ++n) {
    for (int64_t gr = 0; gr < g.group; ++gr) {
      if (P > 0 && g.Mg > 0) {
        visit_quant_storage(x.dtype(), [&](auto tag) {
          using T = typename decltype(tag)::type;
          im2col<T>(ctx.pool(), g, x.data<T>(), x_zp, n, gr * g.Cg, col.data());
        });
        exact_gemm(ctx.pool(), g.Mg, P, Kc, wd.data() + gr * g.Mg * Kc, Kc, col.data(), P, wmax, xmax, out.data(), P, scratch);
      }
      sink(n, gr * g.Mg, out.data());
    }
  }
}

std::vector<int32_t> weight_zero_points(const KernelContext& ctx, const Tensor* zp, const Tensor& w, int64_t M) {
  if (!zp) return {0};
  if (zp->dtype() != w.dtype())
    ctx.fail("w_zero_point type {} does not match the weight type {}", dtype_name(zp->dtype()), dtype_name(w.dtype()));
  if (zp->numel() != 1 && (zp->rank() != 1 || zp->numel() != M))
    ctx.fail("w_zero_point must be a scalar or hold {} values, got shape {}", M, shape_str(zp->shape()));
  return read_int32(*zp);
}

void conv_integer(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(1);
  check_qtype(ctx, x, "x");
  check_qtype(ctx, w, "w");
  ConvGeom g = conv_geometry(ctx, x, w);
  const int32_t xz = scalar_zero_point(ctx, ctx.input_or_null(2), x.dtype(), "x_zero_point");
  std::vector<int32_t> wz = weight_zero_points(ctx, ctx.input_or_null(3), w, g.M);
  Tensor& y = ctx.alloc_output(0, DType::Int32, g.out_shape);
  int32_t* py = y.data<int32_t>();
  const int64_t P = g.out_size();
  int_conv(ctx, g, x, xz, w, wz, [&](int64_t n, int64_t m0, const int32_t* block) {
    std::copy(block, block + g.Mg * P, py + (n * g.M + m0) * P);
  });
}

void qlinear_conv(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w = ctx.input(3);
  check_qtype(ctx, x, "x");
  check_qtype(ctx, w, "w");
  ConvGeom g = conv_geometry(ctx, x, w);
  const float xs = scalar_scale(ctx, ctx.input(1), "x_scale");
  const int32_t xz = scalar_zero_point(ctx, ctx.input_or_null(2), x.dtype(), "x_zero_point");
  std::vector<float> ws = scale_vector(ctx, ctx.input(4), g.M, "w_scale");
  std::vector<int32_t> wz = weight_zero_points(ctx, ctx.input_or_null(5), w, g.M);
  const float ys = scalar_scale(ctx, ctx.input(6), "y_scale");
  const Tensor* yzp = ctx.input_or_null(7);
  const DType ytype = yzp ? yzp->dtype() : x.dtype();
  if (ytype != DType::Int8 && ytype != DType::UInt8) ctx.fail("y_zero_point must be int8 or uint8, got {}", dtype_name(ytype));
  const int32_t yz = scalar_zero_point(ctx, yzp, ytype, "y_zero_point");
  std::vector<int32_t> bias(static_cast<size_t>(g.M), 0);
  if (const Tensor* bt = ctx.input_or_null(8)) {
    if (bt->dtype() != DType::Int32) ctx.fail("B must be int32, got {}", dtype_name(bt->dtype()));
    if (bt->numel() != g.M) ctx.fail("B must hold {} values, got shape {}", g.M, shape_str(bt->shape()));
    std::copy(bt->data<int32_t>(), bt->data<int32_t>() + g.M, bias.begin());
  }
  std::vector<float> mult(static_cast<size_t>(g.M));
  for (int64_t m = 0; m < g.M; ++m) mult[static_cast<size_t>(m)] = (xs * ws[ws.size() == 1 ? 0 : static_cast<size_t>(m)]) / ys;
  const QRange range = qrange_of(ytype);
  Tensor& y = ctx.alloc_output(0, ytype, g.out_shape);
  const int64_t P = g.out_size();
  visit_quant_storage(ytype, [&](auto tag) {
    using Q = typename decltype(tag)::type;
    Q* py = y.data<Q>();
    int_conv(ctx, g, x, xz, w, wz, [&](int64_t n, int64_t m0, const int32_t* block) {
      ctx.pool().parallel_for(g.Mg, std::max<int64_t>(1, kGrain / std::max<int64_t>(P, 1)), [&](int64_t lo, int64_t hi) {
        for (int64_t mi = lo; mi < hi; ++mi) {
          const int64_t m = m0 + mi;
          requantize_run<Q>(block + mi * P, P, bias[static_cast<size_t>(m)], mult[static_cast<size_t>(m)], yz, range,
                            py + (n * g.M + m) * P);
        }
      });
    });
  });
}

}  // namespace

void register_quant_gemm(OpRegistry& r) {
  r.add_fn("", "MatMulInteger", 10, kMaxOpset, BackendKind::CPU, matmul_integer);
  r.add_fn("", "QLinearMatMul", 10, kMaxOpset, BackendKind::CPU, qlinear_matmul);
  r.add_fn("", "ConvInteger", 10, kMaxOpset, BackendKind::CPU, conv_integer);
  r.add_fn("", "QLinearConv", 10, kMaxOpset, BackendKind::CPU, qlinear_conv);
}

}  // namespace mpq::rt::cpu::quant
