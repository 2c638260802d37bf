#include "passes/fuse_conv_bn.h"

#include <fmt/format.h>

#include <cmath>

#include "core/error.h"

namespace mpq::passes {

namespace {

// Float32 copy of a float constant (float16/64 weights are folded in float and stored back).
Tensor as_float(const Tensor& t) { return t.dtype() == DType::Float32 ? t : t.cast_to(DType::Float32); }

bool is_float_constant(const ir::Value* v, int64_t numel) {
  const Tensor* t = constant_value(v);
  return t && dtype_is_float(t->dtype()) && (numel < 0 || t->numel() == numel);
}

struct BnParams {
  std::vector<float> scale;  // gamma / sqrt(var + eps)
  std::vector<float> shift;  // beta - mean * scale
};

BnParams bn_params(const ir::Node& bn) {
  Tensor gamma = as_float(*constant_value(bn.input(1)));
  Tensor beta = as_float(*constant_value(bn.input(2)));
  Tensor mean = as_float(*constant_value(bn.input(3)));
  Tensor var = as_float(*constant_value(bn.input(4)));
  const float eps = bn.attr_float("epsilon", 1e-5f);
  BnParams p;
  const int64_t c = gamma.numel();
  for (int64_t i = 0; i < c; ++i) {
    float s = gamma.data<float>()[i] / std::sqrt(var.data<float>()[i] + eps);
    p.scale.push_back(s);
    p.shift.push_back(beta.data<float>()[i] - mean.data<float>()[i] * s);
  }
  return p;
}

}  // namespace

bool FuseConvBn::match(const ir::Model& model, const ir::Node& bn) const {
  if (!bn.domain.empty() || bn.num_inputs() < 5) return false;
  if (bn.attr_int("training_mode", 0) != 0) return false;
  for (size_t i = 1; i < bn.num_outputs(); ++i)
    if (bn.output(i)) return false;  // running statistics outputs requested
  if (model.opset() < 9 && bn.attr_int("spatial", 1) != 1) return false;
  ir::Value* x = bn.input(0);
  if (!x || !x->producer() || x->is_graph_output() || consumer_count(model, x) != 1) return false;
  const ir::Node& prod = *x->producer();
  if (!prod.domain.empty()) return false;
  const std::string& op = prod.op_type;
  if (op != "Conv" && op != "ConvTranspose" && op != "Gemm" && op != "MatMul") return false;
  const Tensor* w = constant_value(prod.input(1));
  if (!w || !dtype_is_float(w->dtype())) return false;
  if (float32_only_ && w->dtype() != DType::Float32) return false;
  int64_t channels = -1;
  if (op == "Conv") {
    channels = w->rank() >= 3 ? w->dim(0) : -1;
  } else if (op == "ConvTranspose") {
    if (prod.attr_int("group", 1) != 1 || w->rank() < 3) return false;
    channels = w->dim(1);
  } else if (op == "Gemm") {
    if (w->rank() != 2 || prod.attr_float("alpha", 1.0f) != 1.0f) return false;
    channels = prod.attr_int("transB", 0) ? w->dim(0) : w->dim(1);
    if (prod.input(2) && !is_float_constant(prod.input(2), -1)) return false;
    if (prod.input(2) && constant_value(prod.input(2))->numel() != channels && constant_value(prod.input(2))->numel() != 1)
      return false;
  } else {  // MatMul: only a 2-D activation [N, K] x constant [K, M] is normalised on axis 1
    if (w->rank() != 2) return false;
    const ir::ValueType& xt = prod.input(0)->type;
    if (!xt.is_tensor() || !xt.has_shape || xt.dims.size() != 2) return false;
    channels = w->dim(1);
  }
  if (channels <= 0) return false;
  if (op == "Conv" || op == "ConvTranspose") {
    if (prod.input(2) && !is_float_constant(prod.input(2), channels)) return false;
  }
  for (size_t i = 1; i <= 4; ++i)
    if (!is_float_constant(bn.input(i), channels)) return false;
  return true;
}

void FuseConvBn::apply(ir::Model& model, ir::Node& bn, PassStats& stats) {
  ir::Graph& g = *model.graph;
  ir::Node& prod = *bn.input(0)->producer();
  const std::string& op = prod.op_type;
  BnParams p = bn_params(bn);
  const int64_t c = static_cast<int64_t>(p.scale.size());

  const Tensor& w_orig = *constant_value(prod.input(1));
  Tensor w = as_float(w_orig).clone();
  float* wd = w.data<float>();
  if (op == "Conv") {
    const int64_t per = w.numel() / c;
    for (int64_t o = 0; o < c; ++o)
      for (int64_t k = 0; k < per; ++k) wd[o * per + k] *= p.scale[static_cast<size_t>(o)];
  } else if (op == "ConvTranspose") {  // [C_in, C_out, k...]
    const int64_t cin = w.dim(0), per = w.numel() / (cin * c);
    for (int64_t i = 0; i < cin; ++i)
      for (int64_t o = 0; o < c; ++o)
        for (int64_t k = 0; k < per; ++k) wd[(i * c + o) * per + k] *= p.scale[static_cast<size_t>(o)];
  } else if (op == "Gemm" && prod.attr_int("transB", 0)) {  // [M, K]
    const int64_t k_dim = w.dim(1);
    for (int64_t o = 0; o < c; ++o)
      for (int64_t k = 0; k < k_dim; ++k) wd[o * k_dim + k] *= p.scale[static_cast<size_t>(o)];
  } else {  // Gemm without transB, MatMul: [K, M]
    const int64_t k_dim = w.dim(0);
    for (int64_t k = 0; k < k_dim; ++k)
      for (int64_t o = 0; o < c; ++o) wd[k * c + o] *= p.scale[static_cast<size_t>(o)];
  }
  std::vector<float> bias(static_cast<size_t>(c), 0.0f);
  if (op != "MatMul" && prod.input(2)) {
    Tensor b = as_float(*constant_value(prod.input(2)));
    for (int64_t o = 0; o < c; ++o) bias[static_cast<size_t>(o)] = b.numel() == 1 ? b.data<float>()[0] : b.data<float>()[o];
    if (op == "Gemm") {
      float beta = prod.attr_float("beta", 1.0f);
      for (float& v : bias) v *= beta;
    }
  }
  for (int64_t o = 0; o < c; ++o)
    bias[static_cast<size_t>(o)] = bias[static_cast<size_t>(o)] * p.scale[static_cast<size_t>(o)] + p.shift[static_cast<size_t>(o)];

  const DType wtype = w_orig.dtype();
  std::string base = prod.name.empty() ? bn.output(0)->name() : prod.name;
  ir::Value* new_w = g.add_initializer(g.unique_name(base + ".weight_bn"), wtype == DType::Float32 ? w : w.cast_to(wtype));
  Tensor bias_t = Tensor::from<float>({c}, bias);
  ir::Value* new_b = g.add_initializer(g.unique_name(base + ".bias_bn"), wtype == DType::Float32 ? bias_t : bias_t.cast_to(wtype));
  g.set_node_input(&prod, 1, new_w);
  ir::Value* bn_out = bn.output(0);
  ir::Value* prod_out = prod.output(0);
  if (op == "Gemm") {
    prod.set_attr(ir::Attribute::make_float("beta", 1.0f));
    g.set_node_input(&prod, 2, new_b);
  } else if (op != "MatMul") {
    g.set_node_input(&prod, 2, new_b);
  }
  g.remove_node(&bn);
  if (op == "MatMul") {
    // MatMul has no bias input: the folded shift becomes an Add.
    g.add_node("Add", {prod_out, new_b}, {bn_out}, g.unique_name(base + "_bn_add"));
  } else {
    g.set_node_output(&prod, 0, bn_out);
  }
  ++stats.changed;
  stats.notes.push_back(fmt::format("folded BatchNormalization into {}", prod.label()));
}

}  // namespace mpq::passes
