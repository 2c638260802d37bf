#include "train/loss.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "train/grads/grad_util.h"

namespace mpq::train {

namespace {

// Class axis 1 of a [N, C, d1...] tensor: `outer` = N, `classes` = C, `inner` = d1*d2*...
struct ClassLayout {
  int64_t outer = 1, classes = 1, inner = 1;
  int64_t positions() const { return outer * inner; }
};

ClassLayout class_layout(const Tensor& t, const char* what) {
  if (t.rank() < 2) fail_input("{} must have a class axis (rank >= 2), got shape {}", what, shape_str(t.shape()));
  ClassLayout l;
  l.outer = t.dim(0);
  l.classes = t.dim(1);
  for (int d = 2; d < t.rank(); ++d) l.inner *= t.dim(d);
  return l;
}

DType grad_type(const Tensor& t) { return t.dtype() == DType::Float64 ? DType::Float64 : DType::Float32; }

std::vector<double> as_doubles(const Tensor& t) {
  const Tensor f = grad_util::convert(t, t.dtype() == DType::Float64 ? DType::Float64 : DType::Float32);
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (f.dtype() == DType::Float64) std::copy(f.data<double>(), f.data<double>() + t.numel(), out.begin());
  else if (f.dtype() == DType::Float32) std::copy(f.data<float>(), f.data<float>() + t.numel(), out.begin());
  else fail_input("loss inputs must be floating point, got {}", dtype_name(t.dtype()));
  return out;
}

Tensor from_doubles(const std::vector<double>& v, const Shape& shape, DType type) {
  Tensor t(type, shape);
  if (type == DType::Float64) std::copy(v.begin(), v.end(), t.data<double>());
  else std::transform(v.begin(), v.end(), t.data<float>(), [](double x) { return static_cast<float>(x); });
  return t;
}

// Softmax of x / T over the class axis at position (o, i), into p (and log-softmax into lp).
void softmax_at(const std::vector<double>& x, const ClassLayout& l, int64_t o, int64_t i, double T, std::vector<double>& p,
                std::vector<double>* lp) {
  double mx = -INFINITY;
  for (int64_t c = 0; c < l.classes; ++c) mx = std::max(mx, x[static_cast<size_t>((o * l.classes + c) * l.inner + i)] / T);
  double sum = 0.0;
  for (int64_t c = 0; c < l.classes; ++c) {
    const double e = std::exp(x[static_cast<size_t>((o * l.classes + c) * l.inner + i)] / T - mx);
    p[static_cast<size_t>(c)] = e;
    sum += e;
  }
  const double log_sum = std::log(sum);
  for (int64_t c = 0; c < l.classes; ++c) {
    if (lp) (*lp)[static_cast<size_t>(c)] = x[static_cast<size_t>((o * l.classes + c) * l.inner + i)] / T - mx - log_sum;
    p[static_cast<size_t>(c)] /= sum;
  }
}

}  // namespace

LossResult cross_entropy(const Tensor& logits, const Tensor& labels) {
  const ClassLayout l = class_layout(logits, "logits");
  if (!dtype_is_integer(labels.dtype()))
    fail_input("labels must be integers, got {}", dtype_name(labels.dtype()));
  if (labels.numel() != l.positions())
    fail_input("{} labels for logits of shape {} ({} positions)", labels.numel(), shape_str(logits.shape()), l.positions());
  const std::vector<double> x = as_doubles(logits);
  std::vector<double> g(x.size());
  std::vector<double> p(static_cast<size_t>(l.classes)), lp(static_cast<size_t>(l.classes));
  double total = 0.0;
  const double inv_n = 1.0 / static_cast<double>(std::max<int64_t>(l.positions(), 1));
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i) {
      const int64_t y = labels.get_int64(o * l.inner + i);
      if (y < 0 || y >= l.classes) fail_input("label {} at position {} is outside [0, {})", y, o * l.inner + i, l.classes);
      softmax_at(x, l, o, i, 1.0, p, &lp);
      total -= lp[static_cast<size_t>(y)];
      for (int64_t c = 0; c < l.classes; ++c)
        g[static_cast<size_t>((o * l.classes + c) * l.inner + i)] = (p[static_cast<size_t>(c)] - (c == y ? 1.0 : 0.0)) * inv_n;
    }
  LossResult r;
  r.value = total * inv_n;
  r.grad = from_doubles(g, logits.shape(), grad_type(logits));
  return r;
}

LossResult mse(const Tensor& prediction, const Tensor& target) {
  if (prediction.shape() != target.shape())
    fail_input("MSE of a prediction shaped {} against a target shaped {}", shape_str(prediction.shape()),
               shape_str(target.shape()));
  const std::vector<double> x = as_doubles(prediction), t = as_doubles(target);
  std::vector<double> g(x.size());
  const double inv_n = 1.0 / static_cast<double>(std::max<size_t>(x.size(), 1));
  double total = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = x[i] - t[i];
    total += d * d;
    g[i] = 2.0 * d * inv_n;
  }
  LossResult r;
  r.value = total * inv_n;
  r.grad = from_doubles(g, prediction.shape(), grad_type(prediction));
  return r;
}

LossResult kl_distillation(const Tensor& student_logits, const Tensor& teacher_logits, double temperature) {
  if (student_logits.shape() != teacher_logits.shape())
    fail_input("distillation of student logits shaped {} against teacher logits shaped {}",
               shape_str(student_logits.shape()), shape_str(teacher_logits.shape()));
  if (!(temperature > 0)) fail_input("distillation temperature must be positive, got {}", temperature);
  const ClassLayout l = class_layout(student_logits, "student logits");
  const std::vector<double> s = as_doubles(student_logits), t = as_doubles(teacher_logits);
  std::vector<double> g(s.size());
  std::vector<double> ps(static_cast<size_t>(l.classes)), lps(static_cast<size_t>(l.classes));
  std::vector<double> pt(static_cast<size_t>(l.classes)), lpt(static_cast<size_t>(l.classes));
  const double T = temperature;
  const double inv_n = 1.0 / static_cast<double>(std::max<int64_t>(l.positions(), 1));
  double total = 0.0;
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i) {
      softmax_at(s, l, o, i, T, ps, &lps);
      softmax_at(t, l, o, i, T, pt, &lpt);
      for (int64_t c = 0; c < l.classes; ++c) {
        const size_t k = static_cast<size_t>(c);
        if (pt[k] > 0) total += pt[k] * (lpt[k] - lps[k]);
        g[static_cast<size_t>((o * l.classes + c) * l.inner + i)] = T * (ps[k] - pt[k]) * inv_n;
      }
    }
  LossResult r;
  r.value = T * T * total * inv_n;
  r.grad = from_doubles(g, student_logits.shape(), grad_type(student_logits));
  return r;
}

namespace {
int64_t argmax_at(const std::vector<double>& x, const ClassLayout& l, int64_t o, int64_t i) {
  int64_t best = 0;
  for (int64_t c = 1; c < l.classes; ++c)
    if (x[static_cast<size_t>((o * l.classes + c) * l.inner + i)] > x[static_cast<size_t>((o * l.classes + best) * l.inner + i)])
      best = c;
  return best;
}
}  // namespace

Top1 top1_against_labels(const Tensor& logits, const Tensor& labels) {
  const ClassLayout l = class_layout(logits, "logits");
  if (labels.numel() != l.positions())
    fail_input("{} labels for logits of shape {}", labels.numel(), shape_str(logits.shape()));
  const std::vector<double> x = as_doubles(logits);
  Top1 r;
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i) r.correct += argmax_at(x, l, o, i) == labels.get_int64(o * l.inner + i);
  r.total = l.positions();
  return r;
}

Top1 top1_agreement(const Tensor& logits, const Tensor& reference_logits) {
  const ClassLayout l = class_layout(logits, "logits");
  if (logits.shape() != reference_logits.shape())
    fail_input("top-1 agreement of logits shaped {} and {}", shape_str(logits.shape()), shape_str(reference_logits.shape()));
  const std::vector<double> x = as_doubles(logits), y = as_doubles(reference_logits);
  Top1 r;
  for (int64_t o = 0; o < l.outer; ++o)
    for (int64_t i = 0; i < l.inner; ++i) r.correct += argmax_at(x, l, o, i) == argmax_at(y, l, o, i);
  r.total = l.positions();
  return r;
}

}  // namespace mpq::train
