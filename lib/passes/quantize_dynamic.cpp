#include "passes/quantize_dynamic.h"

#include <fmt/format.h>

#include <map>
#include <unordered_map>

#include "core/error.h"
#include "passes/insert_qdq.h"
#include "passes/pass.h"
#include "passes/patterns.h"
#include "passes/quantize_embeddings.h"
#include "passes/upgrade_opset.h"

namespace mpq::passes {

const char* granularity_name(DynamicQuantOptions::Granularity g) {
  return g == DynamicQuantOptions::Granularity::Token ? "token" : "tensor";
}

DynamicQuantOptions::Granularity parse_granularity(const std::string& name) {
  if (name == "token") return DynamicQuantOptions::Granularity::Token;
  if (name == "tensor") return DynamicQuantOptions::Granularity::Tensor;
  fail_input("dynamic quantization granularity must be token or tensor, got '{}'", name);
}

namespace {

using ir::Attribute;
using ir::Graph;
using ir::Node;
using ir::Value;

// A weight in MatMulInteger's layout [K, N], quantized along N.
struct QuantWeight {
  Value* values = nullptr;   // uint8 [K, N]: the int8 values + 128 (zero point 128)
  Value* scales = nullptr;   // float [N] or scalar
  Value* colsum = nullptr;   // float [N]: sum over K of the signed int8 values (per-token form only)
};

// The run-time quantizer of one activation, shared by every anchor that reads it.
struct QuantActivation {
  Value* q = nullptr;      // uint8
  Value* scale = nullptr;  // per token [..., 1] or scalar
  Value* offset = nullptr; // per token: lo [..., 1]; per tensor: the uint8 zero point
};

class DynamicQuantizer {
 public:
  DynamicQuantizer(ir::Model& model, const DynamicQuantOptions& o, DynamicQuantReport& rep)
      : model_(model), g_(*model.graph), o_(o), rep_(rep) {}

  void run() {
    const std::vector<PatternMatch> patterns = find_fragile_patterns(g_);
    const auto membership = pattern_membership(patterns);
    std::vector<Node*> snapshot;
    for (const auto& n : g_.nodes()) snapshot.push_back(n.get());
    for (Node* n : snapshot) {
      if (!n->domain.empty() || (n->op_type != "MatMul" && n->op_type != "Gemm")) continue;
      if (o_.exclude_nodes.count(n->name) || o_.exclude_ops.count(n->op_type)) {
        skip(n, o_.exclude_nodes.count(n->name) ? "excluded by --exclude-nodes" : "excluded by --exclude-ops");
        continue;
      }
      if (auto it = membership.find(n); it != membership.end()) {
        skip(n, fmt::format("inside a {} pattern", pattern_name(patterns[it->second].kind)));
        continue;
      }
      rewrite(n);
    }
    if (o_.quantize_embeddings) {
      auto tables = find_embedding_tables(g_, o_.embedding_min_elements, o_.exclude_nodes, o_.exclude_ops);
      rep_.embedding_tables = static_cast<int>(tables.size());
      rep_.embedding_bytes_saved = quantize_embedding_tables(g_, tables);
    }
    g_.topological_sort();
    g_.remove_dead_nodes();
    remove_unused_initializers(model_);
  }

 private:
  ir::Model& model_;
  Graph& g_;
  const DynamicQuantOptions& o_;
  DynamicQuantReport& rep_;
  std::map<std::pair<const Value*, bool>, QuantWeight> weights_;  // (initializer, transposed)
  std::unordered_map<const Value*, QuantActivation> activations_;
  std::map<std::string, Value*> scalars_;
  int next_id_ = 0;
  Value* weight_zp_ = nullptr;      // shared uint8 scalar 128
  Value* activation_zp_ = nullptr;  // shared uint8 scalar 0 (per-token form)

  void skip(const Node* n, std::string why) { rep_.skipped.emplace_back(n->label(), std::move(why)); }

  Value* fresh(const std::string& stem) { return g_.add_value(g_.unique_name(stem)); }

  Value* scalar(float v, const std::string& name) {
    Value*& s = scalars_[name];
    if (!s) s = g_.add_initializer(g_.unique_name(name), Tensor::scalar<float>(v));
    return s;
  }

  Node* reduce(const char* op, Value* x, Value* out) {
    // ReduceMax/ReduceMin take their axes as an input from opset 18 on.
    if (model_.opset() >= 18) {
      Value*& axes = scalars_["__axes"];
      if (!axes) axes = g_.add_initializer(g_.unique_name("last_axis"), Tensor::from<int64_t>({1}, {-1}));
      Node* n = g_.add_node(op, {x, axes}, {out});
      n->set_attr(Attribute::make_int("keepdims", 1));
      return n;
    }
    Node* n = g_.add_node(op, {x}, {out});
    n->set_attr(Attribute::make_ints("axes", {-1}));
    n->set_attr(Attribute::make_int("keepdims", 1));
    return n;
  }

  Node* cast(Value* x, Value* out, DType to) {
    Node* n = g_.add_node("Cast", {x}, {out});
    n->set_attr(Attribute::make_int("to", static_cast<int64_t>(to)));
    return n;
  }

  const QuantWeight& weight(Value* w, bool transposed) {
    auto key = std::make_pair(static_cast<const Value*>(w), transposed);
    if (auto it = weights_.find(key); it != weights_.end()) return it->second;
    Tensor wt = *constant_value(w);
    if (transposed) {
      const int64_t n = wt.dim(0), k = wt.dim(1);
      Tensor t(DType::Float32, Shape{k, n});
      const float* src = wt.data<float>();
      float* dst = t.data<float>();
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < k; ++j) dst[j * n + i] = src[i * k + j];
      wt = t;
    }
    const int qmax = o_.reduce_range ? 63 : 127;
    QuantizedWeight qw = quantize_weight(wt, o_.per_channel ? 1 : -1, qmax);
    QuantWeight out;
    const std::string base = w->name() + (transposed ? "_t" : "");
    // Stored as uint8 = q + 128 with zero point 128: ONNX Runtime's x86 kernels for uint8 x int8
    // (vpmaddubsw) saturate their int16 pair sums on CPUs without VNNI (AVX2-only machines gave
    // cosine 0.64 on the test encoder), while uint8 x uint8 widens first and is exact everywhere.
    // Same values, same size; mpq computes both forms exactly.
    Tensor shifted(DType::UInt8, qw.values.shape());
    const int8_t* signed_q = qw.values.data<int8_t>();
    uint8_t* shifted_q = shifted.data<uint8_t>();
    for (int64_t i = 0; i < shifted.numel(); ++i) shifted_q[i] = static_cast<uint8_t>(signed_q[i] + 128);
    out.values = g_.add_initializer(g_.unique_name(base + "_uint8"), shifted);
    out.scales = g_.add_initializer(g_.unique_name(base + "_scale"), qw.scales);
    if (o_.granularity == DynamicQuantOptions::Granularity::Token) {
      const int64_t k = wt.dim(0), n = wt.dim(1);
      std::vector<float> colsum(static_cast<size_t>(n), 0.0f);
      const int8_t* q = qw.values.data<int8_t>();
      for (int64_t j = 0; j < n; ++j) {
        int64_t sum = 0;  // exact: |sum| <= 127 K
        for (int64_t i = 0; i < k; ++i) sum += q[i * n + j];
        colsum[static_cast<size_t>(j)] = static_cast<float>(sum);
      }
      out.colsum = g_.add_initializer(g_.unique_name(base + "_colsum"), Tensor::from<float>({n}, colsum));
    }
    ++rep_.weight_tensors;
    return weights_.emplace(key, out).first->second;
  }

  Value* weight_zero_point() {
    if (!weight_zp_)
      weight_zp_ = g_.add_initializer(g_.unique_name("dyn_weight_zero_point"), Tensor::from<uint8_t>({}, {uint8_t{128}}));
    return weight_zp_;
  }
  // Per token the row minimum is added back explicitly, so the uint8 values have zero point 0.
  Value* activation_zero_point() {
    if (!activation_zp_)
      activation_zp_ = g_.add_initializer(g_.unique_name("dyn_token_zero_point"), Tensor::from<uint8_t>({}, {uint8_t{0}}));
    return activation_zp_;
  }

  const QuantActivation& activation(Value* x) {
    if (auto it = activations_.find(x); it != activations_.end()) return it->second;
    const std::string stem = fmt::format("dyn{}", next_id_++);
    QuantActivation a;
    a.q = fresh(stem + "_q");
    a.scale = fresh(stem + "_scale");
    if (o_.granularity == DynamicQuantOptions::Granularity::Tensor) {
      a.offset = fresh(stem + "_zero_point");
      g_.add_node("DynamicQuantizeLinear", {x}, {a.q, a.scale, a.offset});
    } else {
      Value* hi = fresh(stem + "_max");
      a.offset = fresh(stem + "_min");
      reduce("ReduceMax", x, hi);
      reduce("ReduceMin", x, a.offset);
      Value* range = fresh(stem + "_range");
      g_.add_node("Sub", {hi, a.offset}, {range});
      Value* step = fresh(stem + "_step");
      g_.add_node("Div", {range, scalar(255.0f, "uint8_levels")}, {step});
      // A constant row (hi == lo) gets a tiny scale instead of 0: every value then quantizes to 0
      // and the row comes back exactly as lo.
      g_.add_node("Max", {step, scalar(1e-30f, "min_scale")}, {a.scale});
      Value* shifted = fresh(stem + "_shifted");
      g_.add_node("Sub", {x, a.offset}, {shifted});
      Value* ratio = fresh(stem + "_ratio");
      g_.add_node("Div", {shifted, a.scale}, {ratio});
      // (x - lo) / s lies in [0, 255 (1 + 2^-23)] for finite x, so Round lands in [0, 255] and no
      // Clip is needed before the Cast.
      Value* rounded = fresh(stem + "_rounded");
      g_.add_node("Round", {ratio}, {rounded});
      cast(rounded, a.q, DType::UInt8);
    }
    ++rep_.activations;
    return activations_.emplace(x, a).first->second;
  }

  void rewrite(Node* n) {
    const bool gemm = n->op_type == "Gemm";
    Value* x = n->input(0);
    Value* w = n->input(1);
    const Tensor* wt = constant_value(w);
    if (!x || constant_value(x)) return skip(n, "first input is a constant");
    if (!wt) return skip(n, "both inputs are activations (attention): no weight to quantize");
    if (wt->dtype() != DType::Float32) return skip(n, "weight is not float32");
    if (wt->rank() != 2) return skip(n, fmt::format("weight has rank {} (2 needed)", wt->rank()));
    Value* bias = nullptr;
    float beta = 1.0f;
    bool transposed = false;
    if (gemm) {
      if (n->attr_int("transA", 0) != 0 || n->attr_float("alpha", 1.0f) != 1.0f)
        return skip(n, "Gemm with transA or alpha != 1");
      transposed = n->attr_int("transB", 0) != 0;
      bias = n->input(2);
      beta = n->attr_float("beta", 1.0f);
      if (bias && beta != 1.0f && !constant_value(bias)) return skip(n, "Gemm with beta != 1 and a computed C");
    }
    const QuantWeight& qw = weight(w, transposed);
    const QuantActivation& qa = activation(x);
    Value* out = n->output(0);
    const std::string stem = fmt::format("dyn{}", next_id_++);
    g_.remove_node(n);
    Value* acc = fresh(stem + "_acc");
    Value* accf = fresh(stem + "_accf");
    Value* y = bias ? fresh(stem + "_y") : out;
    if (o_.granularity == DynamicQuantOptions::Granularity::Tensor) {
      g_.add_node("MatMulInteger", {qa.q, qw.values, qa.offset, weight_zero_point()}, {acc});
      cast(acc, accf, DType::Float32);
      Value* scale = fresh(stem + "_scale");
      g_.add_node("Mul", {qa.scale, qw.scales}, {scale});
      g_.add_node("Mul", {accf, scale}, {y});
    } else {
      g_.add_node("MatMulInteger", {qa.q, qw.values, activation_zero_point(), weight_zero_point()}, {acc});
      cast(acc, accf, DType::Float32);
      Value* scaled = fresh(stem + "_scaled");
      g_.add_node("Mul", {accf, qa.scale}, {scaled});
      Value* offset = fresh(stem + "_offset");
      g_.add_node("Mul", {qa.offset, qw.colsum}, {offset});
      Value* sum = fresh(stem + "_sum");
      g_.add_node("Add", {scaled, offset}, {sum});
      g_.add_node("Mul", {sum, qw.scales}, {y});
    }
    if (bias) {
      Value* b = bias;
      if (beta != 1.0f) {
        Tensor c = constant_value(bias)->cast_to(DType::Float32);
        float* p = c.data<float>();
        for (int64_t i = 0; i < c.numel(); ++i) p[i] *= beta;
        b = g_.add_initializer(g_.unique_name(bias->name() + "_beta"), c);
      }
      g_.add_node("Add", {y, b}, {out});
    }
    ++rep_.quantized[gemm ? "Gemm" : "MatMul"];
  }
};

}  // namespace

DynamicQuantReport quantize_dynamic(ir::Model& model, const DynamicQuantOptions& o) {
  DynamicQuantReport rep;
  const int64_t opset = model.opset();
  if (opset < 11) {
    std::string why;
    if (!upgrade_opset(model, 13, &why))
      fail_input("dynamic quantization needs opset 11 (MatMulInteger, Round, DynamicQuantizeLinear); this opset-{} model "
                 "cannot be raised: {}",
                 opset, why);
    rep.notes.push_back(fmt::format("raised the model's opset from {} to 13", opset));
  }
  DynamicQuantizer(model, o, rep).run();
  return rep;
}

PassStats QuantizeDynamic::run(ir::Model& model) {
  report_ = quantize_dynamic(model, options_);
  PassStats stats;
  for (const auto& [op, n] : report_.quantized) stats.changed += n;
  stats.changed += report_.embedding_tables;
  for (const auto& [node, why] : report_.skipped) stats.notes.push_back(fmt::format("{}: {}", node, why));
  for (const std::string& n : report_.notes) stats.notes.push_back(n);
  return stats;
}

}  // namespace mpq::passes
