#pragma once
// Training bodies: the backward of the elementwise unary ops, of (Log)Softmax and of
// LayerNormalization, BatchNormalization's training forward and backward, the reduction of
// a broadcast gradient back to an input's shape, GradScaler's unscale with its non-finite check,
// and the SGD and AdamW parameter updates. One thread per element (per row for softmax), the
// per-feature and per-column sums chunked (chunk_sum.cuh), grid-stride loops, no atomics: each
// output element has exactly one writer, so results do not depend on the launch shape.
#include "kernels/bodies/chunk_sum.cuh"
#include "kernels/bodies/elementwise.cuh"
#include "kernels/bodies/shape.cuh"

namespace mpq::cuda {

// dX for Y = op(X), from X, Y and dY (the same derivatives as lib/train/grads/unary_grad.cpp).
// alpha: HardSigmoid's slope (HardSwish's is fixed); the other ops ignore it.
MPQ_HD inline float unary_grad_apply(UnaryOp op, float x, float y, float dy, float alpha) {
  switch (op) {
    case UnaryOp::Relu: return x > 0.0f ? dy : 0.0f;
    case UnaryOp::Sigmoid: return dy * y * (1.0f - y);
    case UnaryOp::Tanh: return dy * (1.0f - y * y);
    case UnaryOp::Exp: return dy * y;
    case UnaryOp::Log: return dy / x;
    case UnaryOp::Neg: return -dy;
    case UnaryOp::Abs: return x > 0.0f ? dy : (x < 0.0f ? -dy : 0.0f);
    case UnaryOp::Sqrt: return dy * 0.5f / y;
    case UnaryOp::Erf: return dy * 1.12837916709551257f * expf(-x * x);
    case UnaryOp::Gelu:
      return dy * (0.5f * (1.0f + erff(x * 0.70710678118654752f)) + x * 0.39894228040143268f * expf(-0.5f * x * x));
    case UnaryOp::Reciprocal: return -dy * y * y;
    case UnaryOp::Identity: return dy;
    // The slope where the output is strictly inside (0, 1).
    case UnaryOp::HardSigmoid: return y > 0.0f && y < 1.0f ? alpha * dy : 0.0f;
    // 0 below -3, 1 above 3, x / 3 + 1/2 between (PyTorch's bounds).
    case UnaryOp::HardSwish: return dy * (x < -3.0f ? 0.0f : (x > 3.0f ? 1.0f : x * (1.0f / 3.0f) + 0.5f));
  }
  return dy;
}

struct UnaryGradBody {
  UnaryOp op;
  float alpha;
  const float* x;
  const float* y;
  const float* dy;
  float* dx;
  int64_t n;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) dx[i] = unary_grad_apply(op, x[i], y[i], dy[i], alpha);
  }
};

// Softmax over X viewed as [outer, n, inner] along the middle axis; one thread per (outer, inner)
// row. Softmax: dX = Y * (dY - sum(dY * Y)); LogSoftmax: dX = dY - exp(Y) * sum(dY).
struct SoftmaxGradBody {
  bool log;
  const float* y;
  const float* dy;
  float* dx;
  int64_t outer, n, inner;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t rows = outer * inner;
    for (int64_t r = t.global(); r < rows; r += t.stride()) {
      const int64_t o = r / inner, in = r % inner;
      const int64_t base = o * n * inner + in;
      double s = 0.0;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = base + k * inner;
        s += log ? static_cast<double>(dy[i]) : static_cast<double>(dy[i]) * static_cast<double>(y[i]);
      }
      const float sf = static_cast<float>(s);
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = base + k * inner;
        dx[i] = log ? dy[i] - expf(y[i]) * sf : y[i] * (dy[i] - sf);
      }
    }
  }
};

// LayerNormalization backward over `rows` rows of n values, from X, the Mean and InvStdDev the
// forward body wrote (LayerNormBody's optional outputs) and the scale (n values; a smaller
// broadcast scale is expanded by the caller). One thread per row:
//   xhat = (x - mean) inv, dxhat = dY scale,  dX = inv (dxhat - mean(dxhat) - xhat mean(dxhat xhat))
// the two row means summed in double (lib/train/grads/norm_grad.cpp computes the same in float).
struct LayerNormGradXBody {
  const float* x;
  const float* mean;
  const float* inv_std;
  const float* gamma;
  const float* dy;
  float* dx;
  int64_t rows, n;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t r = t.global(); r < rows; r += t.stride()) {
      const float* xr = x + r * n;
      const float* gr = dy + r * n;
      const float m = mean[r], inv = inv_std[r];
      double s1 = 0.0, s2 = 0.0;
      for (int64_t k = 0; k < n; ++k) {
        const double d = static_cast<double>(gr[k]) * gamma[k];
        s1 += d;
        s2 += d * ((xr[k] - m) * inv);
      }
      const float m1 = static_cast<float>(s1 / static_cast<double>(n)), m2 = static_cast<float>(s2 / static_cast<double>(n));
      for (int64_t k = 0; k < n; ++k) dx[r * n + k] = inv * (gr[k] * gamma[k] - m1 - ((xr[k] - m) * inv) * m2);
    }
  }
};

// LayerNormalization's parameter gradients over the normalised shape: dScale[k] = sum over rows of
// dY xhat, dBias[k] = sum over rows of dY (chunk_sum.cuh over the layout [rows, n, 1], so column k
// is segment k): this term is dScale's, FloatTerm over dY is dBias's.
struct LayerNormScaleTerm {
  const float* x;
  const float* mean;
  const float* inv_std;
  const float* dy;
  int64_t n;
  MPQ_HD double operator()(int64_t, int64_t flat) const {
    const int64_t r = flat / n;
    return static_cast<double>(dy[flat]) * ((x[flat] - mean[r]) * inv_std[r]);
  }
};

// BatchNormalization over X viewed as [N, F, S] (F features: the channels), as
// lib/train/grads/norm_grad.cpp. Statistics: in training the batch mean and inverse std-dev over
// the N * S values of each feature, from two chunked sums in double (chunk_sum.cuh: the values,
// then their squared deviations from the mean, SquaredDeviationTerm), population variance as the
// forward normalises by; in eval the running ones. inv = 1 / sqrt(var + eps). In training, when
// `update_mean` / `update_var` are given, the running statistics move in place as PyTorch's do
// (momentum is ONNX's: the weight of the old value): towards the batch mean and the unbiased
// batch variance, M / (M - 1) times the biased one (the host refuses M <= 1, as the CPU does).
struct SquaredDeviationTerm {
  const float* x;
  const double* sum;  // per feature
  double count;       // N * S
  MPQ_HD double operator()(int64_t g, int64_t flat) const {
    const double m = count > 0 ? sum[g] / count : 0.0;
    const double d = x[flat] - m;
    return d * d;
  }
};

// One thread per feature: the statistics from the running ones (eval: running_mean not null) or
// from the two sums (training).
struct BatchNormStatsBody {
  const float* running_mean;  // eval only (null in training)
  const float* running_var;
  const double* sum;     // training: per feature, the sum of x
  const double* sum_sq;  // training: per feature, the sum of (x - mean)^2
  float* mean;
  float* inv_std;
  int64_t f;
  double count;  // N * S
  float epsilon;
  float* update_mean;  // training, optional: running mean, updated in place
  float* update_var;   // with update_mean: running variance, updated in place
  float momentum;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t c = t.global(); c < f; c += t.stride()) {
      if (running_mean) {
        mean[c] = running_mean[c];
        inv_std[c] = static_cast<float>(1.0 / sqrt(static_cast<double>(running_var[c]) + epsilon));
        continue;
      }
      const double m = count > 0 ? sum[c] / count : 0.0;
      const double var = count > 0 ? sum_sq[c] / count : 0.0;
      mean[c] = static_cast<float>(m);
      inv_std[c] = static_cast<float>(1.0 / sqrt(var + epsilon));
      if (update_mean) {
        const double unbias = count > 1 ? count / (count - 1) : 1.0;
        update_mean[c] = static_cast<float>(momentum * static_cast<double>(update_mean[c]) + (1.0 - momentum) * m);
        update_var[c] = static_cast<float>(momentum * static_cast<double>(update_var[c]) + (1.0 - momentum) * var * unbias);
      }
    }
  }
};

// Y = scale (x - mean) inv + bias, one thread per element.
struct BatchNormApplyBody {
  const float* x;
  const float* scale;
  const float* bias;
  const float* mean;
  const float* inv_std;
  float* y;
  int64_t n, f, s;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = n * f * s;
    for (int64_t i = t.global(); i < total; i += t.stride()) {
      const int64_t c = (i / s) % f;
      y[i] = scale[c] * ((x[i] - mean[c]) * inv_std[c]) + bias[c];
    }
  }
};

// Backward, first pass: per feature, sum dY (FloatTerm) and sum dY (x - mean) (this term), chunked
// in double (chunk_sum.cuh); then one thread per feature stores sums[2c], sums[2c + 1] and
// dScale = inv * sums[2c + 1], dB = sums[2c] (either may be null).
struct CenteredProductTerm {
  const float* x;
  const float* mean;
  const float* dy;
  MPQ_HD double operator()(int64_t g, int64_t flat) const { return static_cast<double>(dy[flat]) * (x[flat] - mean[g]); }
};

struct BatchNormGradSumsBody {
  const double* sum_dy;
  const double* sum_dy_x;
  const float* inv_std;
  double* sums;
  float* dscale;
  float* dbias;
  int64_t f;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t c = t.global(); c < f; c += t.stride()) {
      sums[2 * c] = sum_dy[c];
      sums[2 * c + 1] = sum_dy_x[c];
      if (dscale) dscale[c] = static_cast<float>(sum_dy_x[c] * inv_std[c]);
      if (dbias) dbias[c] = static_cast<float>(sum_dy[c]);
    }
  }
};

// Backward, second pass, one thread per element:
//   training: dX = scale inv (dY - sum dY / M - (x - mean) inv^2 sum dY (x - mean) / M), M = N * S;
//   eval (a frozen affine map): dX = scale inv dY.
struct BatchNormGradXBody {
  bool training;
  const float* x;
  const float* mean;
  const float* inv_std;
  const float* scale;
  const float* dy;
  const double* sums;  // training only
  float* dx;
  int64_t n, f, s;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = n * f * s;
    const double m_count = static_cast<double>(n * s);
    for (int64_t i = t.global(); i < total; i += t.stride()) {
      const int64_t c = (i / s) % f;
      const float k = scale[c] * inv_std[c];
      if (!training) {
        dx[i] = k * dy[i];
        continue;
      }
      const double iv = inv_std[c];
      const float c0 = static_cast<float>(sums[2 * c] / m_count);
      const float c1 = static_cast<float>(sums[2 * c + 1] * iv * iv / m_count);
      dx[i] = k * (dy[i] - c0 - (x[i] - mean[c]) * c1);
    }
  }
};

// dIn = sum of dY over the dimensions `in` was broadcast along, as a chunked sum (chunk_sum.cuh)
// with one segment per input element e, whose `reduced` values are the output elements that read
// it, in row-major order (the layout [1, in_n, reduced]: j = flat - e * reduced). `bc` describes the
// forward broadcast with the input as operand a (a_stride 0 along broadcast dimensions); `in_dims`
// is the input's shape aligned to bc.rank (1 where missing).
struct SumToShapeTerm {
  Broadcast2 bc;
  int64_t in_dims[kMaxRank];
  const float* dy;
  int64_t reduced;
  MPQ_HD double operator()(int64_t e, int64_t flat) const {
    int64_t rj = flat - e * reduced, rem = e, out = 0, stride = 1;
    // Walk the dimensions from the last: the input's coordinate where it has extent > 1, else the
    // next digit of j.
    for (int d = bc.rank - 1; d >= 0; --d) {
      int64_t coord;
      if (in_dims[d] == 1) {
        coord = rj % bc.dims[d];
        rj /= bc.dims[d];
      } else {
        coord = rem % in_dims[d];
        rem /= in_dims[d];
      }
      out += coord * stride;
      stride *= bc.dims[d];
    }
    return static_cast<double>(dy[out]);
  }
};

// GradScaler's unscale (and clipping's rescale): g *= inv_scale, and *found_inf = 1 if any result
// is not finite (every writer stores the same value, so there is no race to lose; null: no check).
struct UnscaleBody {
  float inv_scale;
  float* g;
  int64_t n;
  int* found_inf;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      g[i] *= inv_scale;
      if (found_inf && !hd_isfinite(g[i])) *found_inf = 1;
    }
  }
};

// Part of a global L2 norm: thread k adds the squares of its grid-stride share of g to
// partials[k] (double, as the CPU's grad_norm accumulates), or stores them when !accumulate. Run
// with the same launch shape over every gradient, then the host adds the partials: each thread
// owns its slot, so there are no atomics and the sum is the same on every run.
struct SumSquaresBody {
  const float* g;
  int64_t n;
  double* partials;
  bool accumulate;
  MPQ_HD void operator()(const Thread& t) const {
    double s = 0.0;
    for (int64_t i = t.global(); i < n; i += t.stride()) s += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    partials[t.global()] = accumulate ? partials[t.global()] + s : s;
  }
};

// The partials' total, by one thread in index order (the launch's other threads do nothing), so
// only one double goes back to the host.
struct SumPartialsBody {
  const double* partials;
  int64_t n;
  double* total;
  MPQ_HD void operator()(const Thread& t) const {
    if (t.global() != 0) return;
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += partials[i];
    *total = s;
  }
};

// The training loop's divergence check: *flag = 1 when a value is not finite or, with
// `positive` (learned step sizes), not above zero.
struct CheckValuesBody {
  const float* w;
  int64_t n;
  bool positive;
  int* flag;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride())
      if (!hd_isfinite(w[i]) || (positive && !(w[i] > 0.0f))) *flag = 1;
  }
};

struct SgdBody {
  SgdStep s;
  float* w;
  const float* g;
  float* buf;  // momentum buffer (null without momentum)
  int64_t n;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      float d = s.log_space ? g[i] * w[i] : g[i];
      if (s.weight_decay != 0.0f && !s.log_space) d += s.weight_decay * w[i];
      if (buf) {
        buf[i] = s.first ? d : s.momentum * buf[i] + s.damp * d;
        d = s.nesterov ? d + s.momentum * buf[i] : buf[i];
      }
      if (s.log_space) w[i] *= expf(-s.rate * d);
      else w[i] -= s.rate * d;
    }
  }
};

struct AdamWBody {
  AdamWStep s;
  float* w;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      const float gi = s.log_space ? g[i] * w[i] : g[i];
      w[i] *= s.decay;
      m[i] += s.one_minus_b1 * (gi - m[i]);
      v[i] = s.b2 * v[i] + s.one_minus_b2 * gi * gi;
      const float denom = sqrtf(v[i]) / s.bc2_sqrt + s.eps;
      if (s.log_space) w[i] *= expf(-s.step_size * m[i] / denom);
      else w[i] -= s.step_size * m[i] / denom;
    }
  }
};

// Clip's backward: dY passes where lo <= x <= hi, the bounds themselves included (a NaN x gets 0),
// as the CPU kernel. Absent bounds are -inf / +inf.
struct ClipGradBody {
  const float* x;
  const float* dy;
  float* dx;
  int64_t n;
  float lo, hi;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) dx[i] = (x[i] >= lo && x[i] <= hi) ? dy[i] : 0.0f;
  }
};

// dY broadcast back over the dimensions a reduction removed, divided by `divisor`: the backward of
// ReduceSum (1), ReduceMean (the reduced count) and GlobalAveragePool (the spatial size). `view`
// maps dX's elements to dY's (step 0 along the reduced dimensions; plan_shape's
// make_broadcast_view).
struct BroadcastDivideBody {
  StridedView view;
  float divisor;
  const float* dy;
  float* dx;
  int64_t n;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) dx[i] = dy[view_source(view, i)] / divisor;
  }
};

// The backward of ReduceMax / ReduceMin / GlobalMaxPool: dY goes to one element of each reduced
// set, the others get 0. One thread per set (per dY element) walks the set in row-major order, so
// every dX element is written by exactly one thread. With `y` (ReduceMax/Min, as the CPU): the
// first element equal to the forward's result (NaN matching NaN); without (GlobalMaxPool, as the
// CPU): the first strict maximum. in_dims: X's shape; reduced[d]: whether dimension d was reduced.
struct ReduceExtremeGradBody {
  int rank;
  int64_t in_dims[kMaxRank];
  bool reduced[kMaxRank];
  const float* x;
  const float* y;  // may be null
  const float* dy;
  float* dx;
  int64_t kept_n;
  MPQ_HD void operator()(const Thread& t) const {
    int64_t set_n = 1;
    for (int d = 0; d < rank; ++d)
      if (reduced[d]) set_n *= in_dims[d];
    for (int64_t r = t.global(); r < kept_n; r += t.stride()) {
      // The kept coordinates of set r (row-major over the non-reduced dimensions).
      int64_t kept[kMaxRank];
      int64_t rem = r;
      for (int d = rank - 1; d >= 0; --d) {
        kept[d] = reduced[d] ? 0 : rem % in_dims[d];
        if (!reduced[d]) rem /= in_dims[d];
      }
      int64_t chosen = -1;
      float best = 0.0f;
      for (int64_t j = 0; j < set_n; ++j) {
        const int64_t e = element(kept, j);
        const float v = x[e];
        dx[e] = 0.0f;
        if (y) {
          const float target = y[r];
          const bool match = v == target || (v != v && target != target);
          if (chosen < 0 && match) chosen = e;
        } else if (chosen < 0 || v > best) {
          chosen = e;
          best = v;
        }
      }
      if (chosen >= 0) dx[chosen] = dy[r];
    }
  }
  // X's offset of the j-th element (row-major over the reduced dimensions) of the set at `kept`.
  MPQ_HD int64_t element(const int64_t* kept, int64_t j) const {
    int64_t off = 0, stride = 1;
    for (int d = rank - 1; d >= 0; --d) {
      int64_t c = kept[d];
      if (reduced[d]) {
        c = j % in_dims[d];
        j /= in_dims[d];
      }
      off += c * stride;
      stride *= in_dims[d];
    }
    return off;
  }
};

// PRelu's backward per element of X: dX = x < 0 ? slope * dY : dY, and (when slope_term is not
// null) the slope's term dY * min(x, 0), which SumToShapeBody then sums to the slope's shape.
// bc: make_broadcast2(X's shape, the slope's shape) (A = X, B = the slope).
struct PReluGradBody {
  Broadcast2 bc;
  const float* x;
  const float* slope;
  const float* dy;
  float* dx;          // may be null
  float* slope_term;  // may be null
  int64_t n;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      int64_t oa, ob;
      broadcast_offsets(bc, i, oa, ob);
      const bool negative = x[oa] < 0.0f;
      if (dx) dx[i] = negative ? slope[ob] * dy[i] : dy[i];
      if (slope_term) slope_term[i] = dy[i] * (negative ? x[oa] : 0.0f);
    }
  }
};

// Where's backward for one branch, before the sum to the branch's shape: dY where the condition
// selects the branch (take: the X branch, condition true), 0 elsewhere. bc: make_broadcast2(the
// condition's shape, Y's shape) (A = the condition).
struct WhereGradBody {
  Broadcast2 bc;
  const bool* cond;
  const float* dy;
  float* masked;
  int64_t n;
  bool take;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      int64_t oa, ob;
      broadcast_offsets(bc, i, oa, ob);
      masked[i] = cond[oa] == take ? dy[i] : 0.0f;
    }
  }
};

}  // namespace mpq::cuda
