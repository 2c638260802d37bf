#include "passes/precision_data.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "runtime/low_precision.h"

namespace mpq::passes::precision {

namespace {

bool is_float(DType d) {
  return d == DType::Float32 || d == DType::Float16 || d == DType::BFloat16 || d == DType::Float64;
}

// Every element as double (half types widened, integers and bool converted).
std::vector<double> as_doubles(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16) {
    Tensor w = rt::widen_to_float32(t);
    const float* p = w.data<float>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  } else if (t.dtype() == DType::Float32) {
    const float* p = t.data<float>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = p[i];
  } else if (t.dtype() == DType::Float64) {
    const double* p = t.data<double>();
    std::copy(p, p + out.size(), out.begin());
  } else {
    Tensor d = t.cast_to(DType::Float64);
    const double* p = d.data<double>();
    std::copy(p, p + out.size(), out.begin());
  }
  return out;
}

double max_abs_of(const Tensor& t) {
  double m = 0.0;
  auto scan = [&](const float* p, int64_t n) {
    float best = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      float a = std::fabs(p[i]);
      if (!(a <= std::numeric_limits<float>::max())) return std::numeric_limits<double>::infinity();
      best = std::max(best, a);
    }
    return static_cast<double>(best);
  };
  if (t.dtype() == DType::Float32) {
    m = scan(t.data<float>(), t.numel());
  } else if (t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16) {
    Tensor w = rt::widen_to_float32(t);
    m = scan(w.data<float>(), w.numel());
  } else if (t.dtype() == DType::Float64) {
    const double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      double a = std::fabs(p[i]);
      if (!std::isfinite(a)) return std::numeric_limits<double>::infinity();
      m = std::max(m, a);
    }
  }
  return m;
}

}  // namespace

std::unordered_map<std::string, double> collect_magnitudes(const ir::Model& model, const data::FeedSource& feeds,
                                                          const rt::ExecOptions& exec, const ProgressFn& progress) {
  std::unordered_map<std::string, double> out;
  rt::Executor ex(model, exec);
  ex.set_observer([&](const ir::Value& v, const Tensor& t) {
    if (!is_float(t.dtype()) || !t.is_host()) return;
    double m = max_abs_of(t);
    auto [it, fresh] = out.emplace(v.name(), m);
    if (!fresh) it->second = std::max(it->second, m);
  });
  const int64_t total = static_cast<int64_t>(feeds.size());
  for (size_t i = 0; i < feeds.size(); ++i) {
    data::Feed feed = feeds.get(i);
    ex.run(feed.tensors);
    if (progress) progress(static_cast<int64_t>(i + 1), total);
  }
  return out;
}

OutputComparison compare_tensors(const Tensor& candidate, const Tensor& reference) {
  OutputComparison c;
  if (candidate.shape() != reference.shape())
    fail_input("output shapes differ: candidate {} vs reference {}", shape_str(candidate.shape()), shape_str(reference.shape()));
  if (candidate.dtype() == DType::String || reference.dtype() == DType::String) return c;
  std::vector<double> a = as_doubles(candidate), b = as_doubles(reference);
  c.values = static_cast<int64_t>(a.size());
  double dot = 0, na = 0, nb = 0, nd = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    if (!std::isfinite(y)) {
      if (!(x == y || (std::isnan(x) && std::isnan(y)))) ++c.nonfinite;
      continue;
    }
    if (!std::isfinite(x)) {
      ++c.nonfinite;
      continue;
    }
    dot += x * y;
    na += x * x;
    nb += y * y;
    nd += (x - y) * (x - y);
    c.max_abs = std::max(c.max_abs, std::fabs(x - y));
  }
  if (na == 0 && nb == 0) c.cosine = 1.0;
  else if (na == 0 || nb == 0) c.cosine = 0.0;
  else c.cosine = dot / std::sqrt(na * nb);
  c.rel_l2 = nb > 0 ? std::sqrt(nd) / std::sqrt(nb) : (nd > 0 ? std::numeric_limits<double>::infinity() : 0.0);
  if (c.nonfinite > 0) {
    c.cosine = 0.0;
    c.rel_l2 = std::numeric_limits<double>::infinity();
    c.max_abs = std::numeric_limits<double>::infinity();
  }
  // Top-1 along the last axis, for score-like outputs.
  if (is_float(reference.dtype()) && reference.rank() >= 1 && reference.dim(-1) >= 2) {
    const int64_t cols = reference.dim(-1);
    const int64_t rows = reference.numel() / cols;
    c.rows = rows;
    for (int64_t r = 0; r < rows; ++r) {
      const double* pa = a.data() + r * cols;
      const double* pb = b.data() + r * cols;
      int64_t ia = 0, ib = 0;
      for (int64_t k = 1; k < cols; ++k) {
        if (pa[k] > pa[ia] || (std::isnan(pa[k]) && !std::isnan(pa[ia]))) ia = k;
        if (pb[k] > pb[ib]) ib = k;
      }
      if (ia == ib) ++c.top1_agree;
    }
  }
  return c;
}

void merge_comparison(OutputComparison& into, const OutputComparison& feed) {
  into.values += feed.values;
  into.cosine = std::min(into.cosine, feed.cosine);
  into.rel_l2 = std::max(into.rel_l2, feed.rel_l2);
  into.max_abs = std::max(into.max_abs, feed.max_abs);
  into.rows += feed.rows;
  into.top1_agree += feed.top1_agree;
  into.nonfinite += feed.nonfinite;
}

Comparison compare_models(const ir::Model& reference, const ir::Model& candidate, const data::FeedSource& feeds,
                          const rt::ExecOptions& exec, const ProgressFn& progress) {
  Comparison out;
  rt::Executor ref(reference, exec);
  rt::Executor cand(candidate, exec);
  if (ref.output_names().size() != cand.output_names().size())
    fail_input("the converted model has {} outputs, the reference {}", cand.output_names().size(), ref.output_names().size());
  std::unordered_map<std::string, DType> cand_inputs;
  for (const ir::Value* v : candidate.graph->inputs())
    if (v->type.is_tensor()) cand_inputs[v->name()] = v->type.elem;
  for (const std::string& name : ref.output_names()) {
    out.outputs.emplace_back();
    out.outputs.back().name = name;
  }
  const int64_t total = static_cast<int64_t>(feeds.size());
  for (size_t i = 0; i < feeds.size(); ++i) {
    data::Feed feed = feeds.get(i);
    std::vector<Tensor> want = ref.run(feed.tensors);
    rt::Feeds converted = feed.tensors;
    for (auto& [name, t] : converted) {
      auto it = cand_inputs.find(name);
      if (it == cand_inputs.end() || t.dtype() != DType::Float32) continue;
      if (it->second == DType::Float16 || it->second == DType::BFloat16) t = rt::narrow_from_float32(t, it->second);
    }
    std::vector<Tensor> got = cand.run(converted);
    for (size_t k = 0; k < want.size(); ++k) merge_comparison(out.outputs[k], compare_tensors(got[k], want[k]));
    ++out.feeds;
    if (progress) progress(static_cast<int64_t>(i + 1), total);
  }
  return out;
}

}  // namespace mpq::passes::precision
