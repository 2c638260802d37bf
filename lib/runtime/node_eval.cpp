#include "runtime/node_eval.h"

#include "runtime/low_precision.h"
#include "runtime/thread_pool.h"

namespace mpq::rt {

std::vector<Tensor> evaluate_node(const ir::Node& node, int opset, const std::vector<const Tensor*>& inputs) {
  static ThreadPool pool(1);
  return evaluate_node(node, opset, inputs, pool);
}

std::vector<Tensor> evaluate_node(const ir::Node& node, int opset, const std::vector<const Tensor*>& inputs, ThreadPool& pool) {
  if (!node.subgraphs().empty()) fail_unsupported("{}: nodes with subgraphs cannot be evaluated alone", node.label());
  const KernelDef* def = OpRegistry::global().find(node.domain, node.op_type, opset, BackendKind::CPU);
  if (!def) fail_unsupported("{}: no CPU kernel for opset {}", node.label(), opset);
  std::unique_ptr<OpKernel> kernel = def->factory(node, opset);
  KernelContext ctx(node, opset, pool, nullptr);
  ctx.mutable_inputs() = inputs;
  ctx.mutable_inputs().resize(node.num_inputs(), nullptr);
  ctx.mutable_outputs().resize(node.num_outputs());
  if (!def->native_low_precision && any_low_precision(ctx.mutable_inputs())) {
    run_in_float32(*kernel, ctx);
  } else {
    kernel->compute(ctx);
  }
  return std::move(ctx.mutable_outputs());
}

}  // namespace mpq::rt
