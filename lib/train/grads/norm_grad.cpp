// Backward of BatchNormalization and LayerNormalization, and BatchNormalization's training forward.
//
// BatchNormalization, per feature f (a channel; one element of [C, D1, ...] for spatial=0 before
// opset 9) over the M = N * S values it normalises:
//   training (batch statistics):  xhat = (x - mean_B) inv,  inv = 1 / sqrt(var_B + eps)
//     dB = sum g,  dscale = sum g xhat,  dX = scale inv (g - dB / M - xhat dscale / M)
//   eval (running statistics, a frozen affine map): dX = g scale inv, same dB and dscale.
// The training forward (GradDef.train_forward) replaces the inference kernel whenever the engine
// runs the node: the engine's mode, not the model's training_mode / is_test, picks batch or
// running statistics. It stashes the mean and inv it used for the backward and, in training, hands
// back new running statistics. Every per-feature sum over
// N * S is cut into blocks of whole rows whose size depends on the shape alone; each block is
// summed by one thread and the blocks are added in order in double, so results are bit-identical
// at any thread count.
//
// LayerNormalization normalises rows of D = prod(shape[axis:]) values:
//   dX = inv (dxhat - mean(dxhat) - xhat mean(dxhat xhat)),  dxhat = g scale
//   dScale = sum over rows of g xhat,  dB = sum over rows of g
// with the row statistics recomputed from X as the forward kernel computes them, and the
// per-column sums built from fixed blocks of rows in the same way.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "runtime/cpu/common.h"
#include "runtime/cpu/math_util.h"
#include "runtime/thread_pool.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;
namespace math = rt::cpu::math;

// Elements one block of a per-feature or per-column sum covers (whole rows, at least one).
constexpr int64_t kBlockElems = 8192;

template <typename T>
std::vector<T> values_of(const Tensor& t) {
  std::vector<T> v(static_cast<size_t>(t.numel()));
  if (t.dtype() == dtype_of<T>) {
    std::copy(t.data<T>(), t.data<T>() + t.numel(), v.begin());
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) v[static_cast<size_t>(i)] = static_cast<T>(t.get_double(i));
  }
  return v;
}

template <typename T>
Tensor tensor_of(const std::vector<T>& v, const Shape& shape) {
  Tensor t(dtype_of<T>, shape);
  std::copy(v.begin(), v.end(), t.data<T>());
  return t;
}

// ---- BatchNormalization

struct BnGeometry {
  int64_t N = 0, F = 0, S = 0, per_n = 0;
  int64_t M() const { return N * S; }
};

// Validates as the forward kernel does (runtime/cpu/norm.cpp); `fail` names the node.
template <typename Fail>
BnGeometry bn_geometry(const Shape& x, const std::vector<int64_t>& param_counts, int opset, Fail fail) {
  if (x.size() < 2) fail(fmt::format("input must have rank >= 2, got shape {}", shape_str(x)));
  BnGeometry g;
  g.N = x[0];
  const int64_t C = x[1];
  g.per_n = g.N > 0 ? shape_numel(x) / g.N : 0;
  g.F = param_counts[0];
  if (g.F != C && !(g.F == g.per_n && opset < 9)) fail(fmt::format("scale has {} values for {} channels", g.F, C));
  for (int64_t c : param_counts)
    if (c != g.F) fail(fmt::format("scale, B, mean and var must have the same size ({} and {})", g.F, c));
  g.S = g.F > 0 ? g.per_n / g.F : 0;
  return g;
}

// Per-feature sums of K quantities: row(f, n, acc) adds the (f, n) row's S values into acc.
// A task covers a run of features (one when rows are long, many when they are short, so that
// [N, C] inputs are read along their rows) over a block of batch entries; each feature's blocks
// are added in order. Both sizes depend on the shape alone.
template <size_t K, typename RowFn>
std::vector<std::array<double, K>> feature_sums(rt::ThreadPool& pool, const BnGeometry& geo, RowFn row) {
  using Acc = std::array<double, K>;
  const int64_t fw = geo.S >= 32 ? 1 : std::max<int64_t>(1, std::min<int64_t>(geo.F, 256));
  const int64_t chunks = geo.F > 0 ? (geo.F + fw - 1) / fw : 0;
  const int64_t nb = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(fw * geo.S, 1));
  const int64_t blocks = geo.N > 0 ? (geo.N + nb - 1) / nb : 0;
  std::vector<Acc> partial(static_cast<size_t>(geo.F * blocks));
  pool.parallel_for(chunks * blocks, 1, [&](int64_t lo, int64_t hi) {
    std::vector<Acc> acc(static_cast<size_t>(fw));
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t f0 = (t / blocks) * fw, f1 = std::min(geo.F, f0 + fw), b = t % blocks;
      std::fill(acc.begin(), acc.end(), Acc{});
      for (int64_t n = b * nb; n < std::min(geo.N, (b + 1) * nb); ++n)
        for (int64_t f = f0; f < f1; ++f) row(f, n, acc[static_cast<size_t>(f - f0)]);
      for (int64_t f = f0; f < f1; ++f) partial[static_cast<size_t>(f * blocks + b)] = acc[static_cast<size_t>(f - f0)];
    }
  });
  std::vector<Acc> total(static_cast<size_t>(geo.F));
  for (int64_t f = 0; f < geo.F; ++f)
    for (int64_t b = 0; b < blocks; ++b)
      for (size_t k = 0; k < K; ++k) total[static_cast<size_t>(f)][k] += partial[static_cast<size_t>(f * blocks + b)][k];
  return total;
}

// Calls fn(f, offset) for every (n, f) row of S contiguous values: over batch entries when rows
// are single values ([N, C] inputs), over rows otherwise.
template <typename Fn>
void for_each_row(rt::ThreadPool& pool, const BnGeometry& geo, Fn fn) {
  if (geo.S == 1) {
    pool.parallel_for(geo.N, math::grain_for(geo.F), [&](int64_t lo, int64_t hi) {
      for (int64_t n = lo; n < hi; ++n)
        for (int64_t f = 0; f < geo.F; ++f) fn(static_cast<size_t>(f), n * geo.F + f);
    });
    return;
  }
  pool.parallel_for(geo.N * geo.F, math::grain_for(geo.S), [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) fn(static_cast<size_t>(t % geo.F), t * geo.S);
  });
}

// Sum and sum of squared deviations of a short or long contiguous row.
template <typename T>
T sum_of(const T* x, int64_t n) {
  if (n >= 16) return math::row_sum_t(x, n);
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}

template <typename T>
T sq_dev_of(const T* x, int64_t n, T mean) {
  if (n >= 16) return math::row_sq_dev_t(x, n, mean);
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += (x[i] - mean) * (x[i] - mean);
  return s;
}

// BatchNormalization's backward sums over one row of S values: a0 += sum of g, a1 += sum of
// g * (x - m). Eight float lanes each, lane j taking the values at i = j mod 8 in order; the values
// past the last whole eight are added in double first, then the lanes in order.
template <typename T>
void bn_row_sums(const T* g, const T* x, T m, int64_t S, double& a0, double& a1) {
  T sg[8] = {}, sgx[8] = {};
  int64_t i = 0;
  for (; i + 8 <= S; i += 8)
    for (int j = 0; j < 8; ++j) {
      sg[j] += g[i + j];
      sgx[j] += g[i + j] * (x[i + j] - m);
    }
  double b0 = 0, b1 = 0;
  for (; i < S; ++i) {
    b0 += static_cast<double>(g[i]);
    b1 += static_cast<double>(g[i] * (x[i] - m));
  }
  for (int j = 0; j < 8; ++j) {
    b0 += static_cast<double>(sg[j]);
    b1 += static_cast<double>(sgx[j]);
  }
  a0 += b0;
  a1 += b1;
}
#if defined(__SSE2__)
// The same sums with the eight lanes in two SSE registers each, the same operations per lane (no
// FMA in SSE2), so the same bits. GCC vectorised the generic loop across i instead, with shuffles
// and spills: it took 9% of a one-thread fashion_resnet training step.
template <>
void bn_row_sums<float>(const float* g, const float* x, float m, int64_t S, double& a0, double& a1) {
  __m128 sg0 = _mm_setzero_ps(), sg1 = _mm_setzero_ps(), sx0 = _mm_setzero_ps(), sx1 = _mm_setzero_ps();
  const __m128 vm = _mm_set1_ps(m);
  int64_t i = 0;
  for (; i + 8 <= S; i += 8) {
    const __m128 g0 = _mm_loadu_ps(g + i), g1 = _mm_loadu_ps(g + i + 4);
    sg0 = _mm_add_ps(sg0, g0);
    sg1 = _mm_add_ps(sg1, g1);
    sx0 = _mm_add_ps(sx0, _mm_mul_ps(g0, _mm_sub_ps(_mm_loadu_ps(x + i), vm)));
    sx1 = _mm_add_ps(sx1, _mm_mul_ps(g1, _mm_sub_ps(_mm_loadu_ps(x + i + 4), vm)));
  }
  double b0 = 0, b1 = 0;
  for (; i < S; ++i) {
    b0 += static_cast<double>(g[i]);
    b1 += static_cast<double>(g[i] * (x[i] - m));
  }
  float sg[8], sgx[8];
  _mm_storeu_ps(sg, sg0);
  _mm_storeu_ps(sg + 4, sg1);
  _mm_storeu_ps(sgx, sx0);
  _mm_storeu_ps(sgx + 4, sx1);
  for (int j = 0; j < 8; ++j) {
    b0 += static_cast<double>(sg[j]);
    b1 += static_cast<double>(sgx[j]);
  }
  a0 += b0;
  a1 += b1;
}
#endif

template <typename T>
void bn_forward_typed(TrainForwardContext& tctx, const BnGeometry& geo) {
  rt::KernelContext& k = tctx.kernel();
  const ir::Node& node = k.node();
  const Tensor& x = k.input(0);
  const Tensor& mean_in = k.input(3);
  const Tensor& var_in = k.input(4);
  const double eps = node.attr_float("epsilon", 1e-5f);
  const double momentum = node.attr_float("momentum", 0.9f);
  const size_t F = static_cast<size_t>(geo.F);
  const std::vector<T> sc = values_of<T>(k.input(1)), bi = values_of<T>(k.input(2));
  const std::vector<T> run_mean = values_of<T>(mean_in), run_var = values_of<T>(var_in);
  const T* px = x.data<T>();
  std::vector<T> mean(F), var(F), new_mean, new_var;
  if (tctx.training()) {
    const int64_t M = geo.M();
    if (M <= 1)
      k.fail("training-mode BatchNormalization needs more than one value per channel, got input shape {}",
             shape_str(x.shape()));
    const auto sums = feature_sums<1>(k.pool(), geo, [&](int64_t f, int64_t n, std::array<double, 1>& acc) {
      acc[0] += static_cast<double>(sum_of(px + n * geo.per_n + f * geo.S, geo.S));
    });
    for (size_t f = 0; f < F; ++f) mean[f] = static_cast<T>(sums[f][0] / static_cast<double>(M));
    const auto sq = feature_sums<1>(k.pool(), geo, [&](int64_t f, int64_t n, std::array<double, 1>& acc) {
      acc[0] += static_cast<double>(sq_dev_of(px + n * geo.per_n + f * geo.S, geo.S, mean[static_cast<size_t>(f)]));
    });
    // Running statistics follow PyTorch, not the ONNX training-mode formula: the running variance
    // moves towards the unbiased batch variance (M / (M - 1) times the biased one the batch is
    // normalised with). ONNX momentum is the weight of the old value (default 0.9, PyTorch's 0.1).
    new_mean.resize(F);
    new_var.resize(F);
    const double unbias = static_cast<double>(M) / static_cast<double>(M - 1);
    for (size_t f = 0; f < F; ++f) {
      const double v = sq[f][0] / static_cast<double>(M);
      var[f] = static_cast<T>(v);
      new_mean[f] = static_cast<T>(momentum * static_cast<double>(run_mean[f]) + (1.0 - momentum) * static_cast<double>(mean[f]));
      new_var[f] = static_cast<T>(momentum * static_cast<double>(run_var[f]) + (1.0 - momentum) * v * unbias);
    }
    tctx.update_state(3, tensor_of(new_mean, mean_in.shape()));
    tctx.update_state(4, tensor_of(new_var, var_in.shape()));
  } else {
    mean = run_mean;
    var = run_var;
    new_mean = run_mean;
    new_var = run_var;
  }
  std::vector<T> inv(F), a(F), b(F);
  for (size_t f = 0; f < F; ++f) {
    const double s = 1.0 / std::sqrt(static_cast<double>(var[f]) + eps);
    inv[f] = static_cast<T>(s);
    a[f] = static_cast<T>(static_cast<double>(sc[f]) * s);
    b[f] = bi[f] - mean[f] * a[f];
  }
  Tensor& y = k.alloc_output(0, x.dtype(), x.shape());
  T* py = y.data<T>();
  for_each_row(k.pool(), geo, [&](size_t f, int64_t off) {
    const T af = a[f], bf = b[f];
    const T* xr = px + off;
    T* yr = py + off;
    for (int64_t i = 0; i < geo.S; ++i) yr[i] = xr[i] * af + bf;
  });
  tctx.stash().push_back(tensor_of(mean, {geo.F}));
  tctx.stash().push_back(tensor_of(inv, {geo.F}));
  // Statistics outputs of models exported in training mode (no gradient flows through them):
  // opset 14+ has the new running mean and variance; before, also the batch mean and variance.
  auto emit = [&](size_t i, const std::vector<T>& v) {
    if (k.output_wanted(i)) std::copy(v.begin(), v.end(), k.alloc_output(i, x.dtype(), {geo.F}).template data<T>());
  };
  emit(1, new_mean);
  emit(2, new_var);
  if (k.opset() < 14) {
    emit(3, mean);
    emit(4, var);
  }
}

void batchnorm_train_forward(TrainForwardContext& tctx) {
  rt::KernelContext& k = tctx.kernel();
  const Tensor& x = k.input(0);
  std::vector<int64_t> counts;
  for (size_t i = 1; i <= 4; ++i) counts.push_back(k.input(i).numel());
  const BnGeometry geo = bn_geometry(x.shape(), counts, k.opset(), [&](const std::string& m) { k.fail("{}", m); });
  if (x.dtype() == DType::Float32) bn_forward_typed<float>(tctx, geo);
  else if (x.dtype() == DType::Float64) bn_forward_typed<double>(tctx, geo);
  else k.fail("needs a floating-point input, got {}", dtype_name(x.dtype()));
}

void batchnorm_grad(GradContext& ctx) {
  const Shape& xs = ctx.input_shape(0);
  std::vector<int64_t> counts;
  for (size_t i = 1; i <= 4; ++i) counts.push_back(shape_numel(ctx.input_shape(i)));
  const BnGeometry geo = bn_geometry(xs, counts, ctx.opset(), [&](const std::string& m) { ctx.fail("{}", m); });
  if (ctx.stash().size() != 2)
    fail_internal("{} (backward): the training forward stashed {} tensors, expected the mean and inverse std",
                  ctx.node().label(), ctx.stash().size());
  // Outputs 1-4 (statistics) carry no gradient; without one for Y every gradient is zero.
  const DType type = ctx.has_grad_output(0) ? ctx.grad_output(0).dtype() : ctx.input_dtype(0);
  if (!ctx.has_grad_output(0)) {
    for (size_t i = 0; i < 3; ++i) ctx.set_grad(i, Tensor::zeros(type, ctx.input_shape(i)));
    return;
  }
  const Tensor& g = ctx.grad_output(0);
  const bool training = ctx.training();
  visit_float(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::vector<T> mean = values_of<T>(ctx.stash()[0]), inv = values_of<T>(ctx.stash()[1]);
    const T* pg = g.data<T>();
    const bool need_x = ctx.needs_grad(0), need_s = ctx.needs_grad(1), need_b = ctx.needs_grad(2);
    std::vector<std::array<double, 2>> sums(static_cast<size_t>(geo.F));  // sum g, sum g (x - mean)
    const bool need_sums = need_s || need_b || (need_x && training);
    Tensor x;
    const T* px = nullptr;
    if (need_sums) {
      x = grad_util::convert(ctx.input(0), type);
      px = x.data<T>();
      sums = feature_sums<2>(ctx.pool(), geo, [&](int64_t f, int64_t n, std::array<double, 2>& acc) {
        const int64_t off = n * geo.per_n + f * geo.S;
        const T m = mean[static_cast<size_t>(f)];
        if (geo.S < 8) {
          for (int64_t i = 0; i < geo.S; ++i) {
            acc[0] += static_cast<double>(pg[off + i]);
            acc[1] += static_cast<double>(pg[off + i] * (px[off + i] - m));
          }
          return;
        }
        bn_row_sums<T>(pg + off, px + off, m, geo.S, acc[0], acc[1]);
      });
    }
    const size_t F = static_cast<size_t>(geo.F);
    if (need_x) {
      const std::vector<T> sc = values_of<T>(grad_util::convert(ctx.input(1), type));
      // dX = k (g - c0 - (x - mean) c1) in training, k g in eval.
      std::vector<T> kf(F), c0(F, T(0)), c1(F, T(0));
      const double M = static_cast<double>(geo.M());
      for (size_t f = 0; f < F; ++f) {
        kf[f] = sc[f] * inv[f];
        if (training) {
          c0[f] = static_cast<T>(sums[f][0] / M);
          const double iv = static_cast<double>(inv[f]);
          c1[f] = static_cast<T>(sums[f][1] * iv * iv / M);
        }
      }
      Tensor dx(type, xs);
      T* pd = dx.data<T>();
      for_each_row(ctx.pool(), geo, [&](size_t f, int64_t off) {
        const T kk = kf[f], a = c0[f], c = c1[f], m = mean[f];
        const T* gr = pg + off;
        T* dr = pd + off;
        if (training) {
          const T* xr = px + off;
          for (int64_t i = 0; i < geo.S; ++i) dr[i] = kk * (gr[i] - a - (xr[i] - m) * c);
        } else {
          for (int64_t i = 0; i < geo.S; ++i) dr[i] = kk * gr[i];
        }
      });
      ctx.set_grad(0, std::move(dx));
    }
    if (need_s) {
      std::vector<T> ds(F);
      for (size_t f = 0; f < F; ++f) ds[f] = static_cast<T>(sums[f][1] * static_cast<double>(inv[f]));
      ctx.set_grad(1, tensor_of(ds, ctx.input_shape(1)));
    }
    if (need_b) {
      std::vector<T> db(F);
      for (size_t f = 0; f < F; ++f) db[f] = static_cast<T>(sums[f][0]);
      ctx.set_grad(2, tensor_of(db, ctx.input_shape(2)));
    }
  });
}

// ---- LayerNormalization (opset 17)

// A Scale or B tensor laid out over the normalised shape (it broadcasts to it, as the forward
// kernel checks).
template <typename T>
std::vector<T> expand_to(const Tensor& t, const Shape& target) {
  const int64_t n = shape_numel(target);
  if (t.numel() == n) return values_of<T>(t);
  const std::vector<T> src = values_of<T>(t);
  std::vector<T> out(static_cast<size_t>(n));
  const rt::cpu::BroadcastIter it(target, {&t.shape()});
  const int64_t inner = it.inner(), stride = it.inner_stride(0);
  int64_t off[rt::cpu::BroadcastIter::kMaxInputs];
  for (int64_t o = 0; o < it.outer_count(); ++o) {
    it.offsets(o, off);
    for (int64_t i = 0; i < inner; ++i) out[static_cast<size_t>(o * inner + i)] = src[static_cast<size_t>(off[0] + i * stride)];
  }
  return out;
}

// The gradient of a parameter of `shape` that was broadcast to `norm_shape`.
Tensor param_grad(rt::ThreadPool& pool, Tensor full, const Shape& norm_shape, const Shape& shape) {
  if (shape_numel(shape) == shape_numel(norm_shape)) return full.reshaped(shape);
  return grad_util::reduce_to_shape(pool, full.reshaped(norm_shape), shape);
}

void layernorm_grad(GradContext& ctx) {
  const Shape& xs = ctx.input_shape(0);
  const int rank = static_cast<int>(xs.size());
  if (rank == 0) ctx.fail("input must have rank >= 1");
  const int64_t axis_attr = ctx.node().attr_int("axis", -1);
  const int64_t axis = axis_attr < 0 ? axis_attr + rank : axis_attr;
  if (axis < 0 || axis >= rank) ctx.fail("axis {} is out of range for rank {}", axis_attr, rank);
  const double eps = ctx.node().attr_float("epsilon", 1e-5f);
  const Shape norm_shape(xs.begin() + axis, xs.end());
  const int64_t D = shape_numel(norm_shape);
  const int64_t rows = D > 0 ? shape_numel(xs) / D : 0;
  const DType type = ctx.has_grad_output(0) ? ctx.grad_output(0).dtype() : ctx.input_dtype(0);
  // Mean and InvStdDev outputs carry no gradient.
  if (!ctx.has_grad_output(0)) {
    for (size_t i = 0; i < 3; ++i)
      if (ctx.has_input(i)) ctx.set_grad(i, Tensor::zeros(type, ctx.input_shape(i)));
    return;
  }
  const Tensor& g = ctx.grad_output(0);
  const bool need_x = ctx.needs_grad(0), need_s = ctx.needs_grad(1), need_b = ctx.has_input(2) && ctx.needs_grad(2);
  const Tensor x = grad_util::convert(ctx.input(0), type);
  visit_float(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const std::vector<T> sc = expand_to<T>(grad_util::convert(ctx.input(1), type), norm_shape);
    const T* px = x.data<T>();
    const T* pg = g.data<T>();
    const T* s = sc.data();
    Tensor dx = need_x ? Tensor(type, xs) : Tensor();
    T* pd = need_x ? dx.template data<T>() : nullptr;
    // Blocks of whole rows; block b's column sums land in partial[b] (in T over the block's few
    // rows, then across blocks in double).
    const int64_t rb = std::max<int64_t>(1, kBlockElems / std::max<int64_t>(D, 1));
    const int64_t blocks = (rows + rb - 1) / rb;
    const bool need_cols = need_s || need_b;
    std::vector<T> ps(need_s ? static_cast<size_t>(blocks * D) : 0), pb(need_b ? static_cast<size_t>(blocks * D) : 0);
    ctx.pool().parallel_for(blocks, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        T* cs = need_s ? ps.data() + b * D : nullptr;
        T* cb = need_b ? pb.data() + b * D : nullptr;
        for (int64_t r = b * rb; r < std::min(rows, (b + 1) * rb); ++r) {
          const T* xr = px + r * D;
          const T* gr = pg + r * D;
          const T mean = math::row_sum_t(xr, D) / static_cast<T>(D);
          const T inv = T(1) / std::sqrt(math::row_sq_dev_t(xr, D, mean) / static_cast<T>(D) + static_cast<T>(eps));
          if (pd) {
            // sum(dxhat) and sum(dxhat xhat) in 8 lanes, then dX.
            T a1[8] = {}, a2[8] = {};
            int64_t i = 0;
            for (; i + 8 <= D; i += 8)
              for (int j = 0; j < 8; ++j) {
                const T d = gr[i + j] * s[i + j];
                a1[j] += d;
                a2[j] += d * ((xr[i + j] - mean) * inv);
              }
            T sum1 = 0, sum2 = 0;
            for (; i < D; ++i) {
              const T d = gr[i] * s[i];
              sum1 += d;
              sum2 += d * ((xr[i] - mean) * inv);
            }
            for (int j = 0; j < 8; ++j) {
              sum1 += a1[j];
              sum2 += a2[j];
            }
            const T m1 = sum1 / static_cast<T>(D), m2 = sum2 / static_cast<T>(D);
            T* dr = pd + r * D;
            for (int64_t k = 0; k < D; ++k) dr[k] = inv * (gr[k] * s[k] - m1 - ((xr[k] - mean) * inv) * m2);
          }
          if (cs)
            for (int64_t k = 0; k < D; ++k) cs[k] += gr[k] * ((xr[k] - mean) * inv);
          if (cb)
            for (int64_t k = 0; k < D; ++k) cb[k] += gr[k];
        }
      }
    });
    if (need_x) ctx.set_grad(0, std::move(dx));
    if (!need_cols) return;
    // Column totals, block by block in order.
    auto total = [&](const std::vector<T>& part) {
      Tensor out(type, norm_shape);
      T* po = out.data<T>();
      ctx.pool().parallel_for(D, 1024, [&](int64_t lo, int64_t hi) {
        for (int64_t k = lo; k < hi; ++k) {
          double acc = 0;
          for (int64_t b = 0; b < blocks; ++b) acc += static_cast<double>(part[static_cast<size_t>(b * D + k)]);
          po[k] = static_cast<T>(acc);
        }
      });
      return out;
    };
    if (need_s) ctx.set_grad(1, param_grad(ctx.pool(), total(ps), norm_shape, ctx.input_shape(1)));
    if (need_b) ctx.set_grad(2, param_grad(ctx.pool(), total(pb), norm_shape, ctx.input_shape(2)));
  });
}

}  // namespace

void register_norm_grads(GradRegistry& r) {
  GradDef bn;
  bn.op_type = "BatchNormalization";
  bn.fn = batchnorm_grad;
  bn.train_forward = batchnorm_train_forward;
  bn.differentiable = bit(0) | bit(1) | bit(2);  // never the running mean and variance
  bn.saved_inputs = bit(0) | bit(1);
  r.add(std::move(bn));
  GradDef ln;
  ln.op_type = "LayerNormalization";
  ln.since = 17;
  ln.fn = layernorm_grad;
  ln.differentiable = bit(0) | bit(1) | bit(2);
  ln.saved_inputs = bit(0) | bit(1);
  // mpq::LayerNormalization (passes/fuse_layer_norm.h; the training engine fuses exporters'
  // nine-node LayerNorm into it) has the same semantics at any opset.
  GradDef fused_ln = ln;
  fused_ln.domain = "mpq";
  fused_ln.since = 1;
  r.add(std::move(ln));
  r.add(std::move(fused_ln));
}

}  // namespace mpq::train::grads
