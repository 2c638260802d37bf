#include "train/grad_check.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "runtime/executor.h"
#include "test_util.h"
#include "train/autograd.h"

namespace mpq::test {

namespace {

bool is_float(DType t) { return t == DType::Float32 || t == DType::Float64; }

struct OneNode {
  ir::Model model;
  rt::Feeds feeds;
  std::vector<std::string> input_names;  // "" for inputs that are initializers or omitted
};

OneNode build(const std::string& op, const std::vector<Tensor>& inputs, const std::vector<ir::Attribute>& attrs,
              const GradCheckOptions& o, const std::vector<size_t>& wrt) {
  OneNode m;
  m.model.set_opset("", o.opset);
  if (!o.domain.empty()) m.model.set_opset(o.domain, 1);
  ir::Graph* g = m.model.graph.get();
  std::vector<ir::Value*> ins;
  for (size_t i = 0; i < inputs.size(); ++i) {
    m.input_names.emplace_back();
    if (!inputs[i].defined()) {
      ins.push_back(nullptr);
      continue;
    }
    const std::string name = "in" + std::to_string(i);
    if (std::find(wrt.begin(), wrt.end(), i) != wrt.end()) {
      ir::Value* v = g->add_value(name, ir::ValueType::tensor(inputs[i].dtype(), inputs[i].shape()));
      g->add_input(v);
      ins.push_back(v);
      m.feeds[name] = inputs[i];
      m.input_names.back() = name;
    } else {
      ins.push_back(g->add_initializer(name, inputs[i]));
    }
  }
  std::vector<ir::Value*> outs;
  for (size_t j = 0; j < o.n_outputs; ++j) {
    ir::Value* v = g->add_value("out" + std::to_string(j));
    g->add_output(v);
    outs.push_back(v);
  }
  ir::Node* n = g->add_node(op, ins, outs, "node_under_test", o.domain);
  for (const auto& a : attrs) n->set_attr(a);
  return m;
}

train::AutogradOptions engine_options(const GradCheckOptions& o) {
  train::AutogradOptions e;
  e.threads = o.threads;
  e.training = o.training;
  e.input_grads = true;
  e.default_parameters = false;
  return e;
}

std::vector<size_t> default_wrt(const std::vector<Tensor>& inputs, const GradCheckOptions& o) {
  if (!o.wrt.empty()) return o.wrt;
  std::vector<size_t> w;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && is_float(inputs[i].dtype())) w.push_back(i);
  return w;
}

// Fixed random weights R_j of the loss for output j (float64 values, stored in `type`).
std::vector<Tensor> loss_weights(const std::vector<Tensor>& outputs, const GradCheckOptions& o, DType type) {
  std::vector<Tensor> r(outputs.size());
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (!is_float(outputs[j].dtype())) continue;
    if (!o.loss_outputs.empty() && std::find(o.loss_outputs.begin(), o.loss_outputs.end(), j) == o.loss_outputs.end())
      continue;
    r[j] = random_tensor(outputs[j].shape(), o.seed * 131 + static_cast<uint32_t>(j), -1, 1).cast_to(type);
  }
  return r;
}

double loss_of(const std::vector<Tensor>& outputs, const std::vector<Tensor>& r) {
  double l = 0;
  for (size_t j = 0; j < outputs.size(); ++j) {
    if (!r[j].defined()) continue;
    for (int64_t i = 0; i < outputs[j].numel(); ++i) l += outputs[j].get_double(i) * r[j].get_double(i);
  }
  return l;
}

Tensor to_type(const Tensor& t, DType type) {
  return t.defined() && is_float(t.dtype()) && t.dtype() != type ? t.cast_to(type) : t;
}

}  // namespace

std::vector<Tensor> node_gradients(const std::string& op, const std::vector<Tensor>& inputs,
                                   const std::vector<ir::Attribute>& attrs, const GradCheckOptions& o) {
  const std::vector<size_t> wrt = default_wrt(inputs, o);
  OneNode m = build(op, inputs, attrs, o, wrt);
  train::Autograd engine(m.model, engine_options(o));
  std::vector<Tensor> outs = engine.forward(m.feeds);
  DType type = DType::Float64;
  for (const Tensor& t : inputs)
    if (t.defined() && is_float(t.dtype())) type = t.dtype();
  engine.backward(loss_weights(outs, o, type));
  // input_grads() follows the graph inputs, which are the wrt inputs in order.
  std::vector<Tensor> grads(inputs.size());
  const std::vector<Tensor>& ig = engine.input_grads();
  size_t k = 0;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!m.input_names[i].empty()) grads[i] = ig.at(k++);
  return grads;
}

void check_gradients(const std::string& op, const std::vector<Tensor>& inputs, const std::vector<ir::Attribute>& attrs,
                     const GradCheckOptions& o) {
  INFO("op " << op);
  std::vector<Tensor> in64;
  for (const Tensor& t : inputs) in64.push_back(to_type(t, DType::Float64));
  const std::vector<size_t> wrt = default_wrt(in64, o);
  const std::vector<Tensor> analytic = node_gradients(op, in64, attrs, o);

  OneNode m = build(op, in64, attrs, o, wrt);
  train::Autograd engine(m.model, engine_options(o));
  const std::vector<Tensor> r = loss_weights(engine.forward(m.feeds), o, DType::Float64);
  std::mt19937 rng(o.seed);
  for (size_t i : wrt) {
    INFO("input " << i << " " << shape_str(in64[i].shape()));
    REQUIRE(analytic[i].defined());
    REQUIRE(analytic[i].shape() == in64[i].shape());
    const int64_t n = in64[i].numel();
    std::vector<int64_t> elems(static_cast<size_t>(n));
    for (int64_t e = 0; e < n; ++e) elems[static_cast<size_t>(e)] = e;
    if (n > o.max_elements) {
      std::shuffle(elems.begin(), elems.end(), rng);
      elems.resize(static_cast<size_t>(o.max_elements));
    }
    int bad = 0;
    for (int64_t e : elems) {
      rt::Feeds feeds = m.feeds;
      Tensor plus = in64[i].clone(), minus = in64[i].clone();
      plus.data<double>()[e] += o.eps;
      minus.data<double>()[e] -= o.eps;
      feeds[m.input_names[i]] = plus;
      const double lp = loss_of(engine.forward(feeds), r);
      feeds[m.input_names[i]] = minus;
      const double lm = loss_of(engine.forward(feeds), r);
      const double fd = (lp - lm) / (2 * o.eps);
      const double an = analytic[i].data<double>()[e];
      if (!(std::fabs(an - fd) <= o.atol + o.rtol * std::max(std::fabs(an), std::fabs(fd)))) {
        if (bad++ < 5) UNSCOPED_INFO("element " << e << ": analytic " << an << ", finite difference " << fd);
      }
    }
    CHECK(bad == 0);
  }
  // Constant (non-wrt) inputs received nothing, and the float32 path agrees with float64.
  std::vector<Tensor> in32;
  for (const Tensor& t : inputs) in32.push_back(to_type(t, DType::Float32));
  const std::vector<Tensor> g32 = node_gradients(op, in32, attrs, o);
  for (size_t i : wrt) {
    INFO("float32 gradient of input " << i);
    REQUIRE(g32[i].defined());
    CHECK(g32[i].dtype() == DType::Float32);
    const double err = rel_l2(g32[i].cast_to(DType::Float64), analytic[i]);
    UNSCOPED_INFO("relative L2 " << err);
    CHECK(err <= o.float32_rel_l2);
  }
}

}  // namespace mpq::test
