#pragma once
// The CPU backward kernels (lib/train/grads) called directly on one node: the ground truth the CUDA
// backward bodies and the backward runner are compared with (train_bodies_test,
// backward_runner_test).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/thread_pool.h"
#include "train/grad_registry.h"

namespace mpq::test {

// The gradients of a one-node model's inputs (undefined tensors: absent optional inputs) from the
// CPU backward kernel, with output 0 and its dY given; `wanted` marks the inputs whose gradient
// the engine asks for; `stash` is what the op's training forward would have kept for it; `domain`
// (opset 1) for mpq's own ops.
inline std::vector<Tensor> cpu_backward_inputs(const std::string& op, int opset, const std::vector<Tensor>& inputs, const Tensor& y,
                                        const Tensor& dy, const std::vector<ir::Attribute>& attrs,
                                        const std::vector<char>& wanted, const std::vector<Tensor>& stash = {},
                                        bool training = false, const std::string& domain = "") {
  ir::Model model;
  model.set_opset("", opset);
  if (!domain.empty()) model.set_opset(domain, 1);
  ir::Graph* g = model.graph.get();
  std::vector<ir::Value*> ins;
  for (size_t i = 0; i < inputs.size(); ++i) ins.push_back(inputs[i].defined() ? g->add_value("in" + std::to_string(i)) : nullptr);
  ir::Node* node = g->add_node(op, ins, {g->add_value("y")}, "node_under_test");
  node->domain = domain;
  for (const auto& a : attrs) node->set_attr(a);
  const train::GradDef* def = train::GradRegistry::global().find(domain, op, domain.empty() ? opset : 1, rt::BackendKind::CPU);
  REQUIRE(def);
  rt::ThreadPool pool(1);
  train::GradContext ctx(*node, opset, pool);
  for (const Tensor& t : inputs) {
    ctx.mutable_inputs().push_back(t);
    ctx.mutable_input_shapes().push_back(t.defined() ? t.shape() : Shape{});
    ctx.mutable_input_dtypes().push_back(t.defined() ? t.dtype() : DType::Undefined);
    ctx.mutable_input_present().push_back(t.defined() ? 1 : 0);
  }
  ctx.mutable_wanted() = wanted;
  ctx.mutable_stash() = stash;
  ctx.set_training(training);
  ctx.mutable_outputs() = {y};
  ctx.mutable_output_shapes() = {y.shape()};
  ctx.mutable_grad_outputs() = {dy};
  ctx.mutable_grads().resize(inputs.size());
  def->fn(ctx);
  return ctx.mutable_grads();
}


}  // namespace mpq::test
