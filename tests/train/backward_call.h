#pragma once
// Calls one backward kernel directly, without the forward pass, so that negative tests can hand it
// inputs the forward kernel would have refused (the backward checks what it writes through, such
// as indices). The node is named "node_under_test"; input 0 is the differentiable one.
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/thread_pool.h"
#include "train/grad_registry.h"

namespace mpq::test {

// Input tensors (undefined: omitted), the gradients of the outputs (one per output) and the
// attributes of the node; returns the gradient of input 0.
inline Tensor call_backward(const std::string& op, int opset, const std::vector<Tensor>& inputs,
                            const std::vector<Tensor>& grad_outputs, const std::vector<ir::Attribute>& attrs = {}) {
  ir::Model model;
  model.set_opset("", opset);
  ir::Graph* g = model.graph.get();
  std::vector<ir::Value*> ins, outs;
  for (size_t i = 0; i < inputs.size(); ++i)
    ins.push_back(inputs[i].defined() ? g->add_value("in" + std::to_string(i)) : nullptr);
  for (size_t j = 0; j < grad_outputs.size(); ++j) outs.push_back(g->add_value("out" + std::to_string(j)));
  ir::Node* node = g->add_node(op, ins, outs, "node_under_test");
  for (const auto& a : attrs) node->set_attr(a);
  const train::GradDef* def = train::GradRegistry::global().find("", op, opset, rt::BackendKind::CPU);
  if (!def) fail_internal("no backward for {} at opset {}", op, opset);
  rt::ThreadPool pool(1);
  train::GradContext ctx(*node, opset, pool);
  for (const Tensor& t : inputs) {
    ctx.mutable_inputs().push_back(t);
    ctx.mutable_input_shapes().push_back(t.defined() ? t.shape() : Shape{});
    ctx.mutable_input_dtypes().push_back(t.dtype());
    ctx.mutable_input_present().push_back(t.defined() ? 1 : 0);
    ctx.mutable_wanted().push_back(ctx.mutable_wanted().empty() ? 1 : 0);
  }
  for (const Tensor& t : grad_outputs) {
    ctx.mutable_grad_outputs().push_back(t);
    ctx.mutable_output_shapes().push_back(t.shape());
  }
  ctx.mutable_grads().resize(inputs.size());
  def->fn(ctx);
  return ctx.mutable_grads().at(0);
}

}  // namespace mpq::test
