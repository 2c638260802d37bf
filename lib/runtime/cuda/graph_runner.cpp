#include "runtime/cuda/graph_runner.h"

#include <unordered_map>

#include "core/error.h"
#include "runtime/cuda/device_tensor.h"
#include "runtime/node_eval.h"

namespace mpq::rt::gpu {

std::vector<Tensor> run_graph(const ir::Model& model, const Feeds& feeds, KernelRuntime& rt, FallbackLog& log,
                              GraphRunStats* stats) {
  const ir::Graph& g = *model.graph;
  check_feeds(g, feeds);
  std::unordered_map<const ir::Value*, Tensor> dev;  // device copy of every value computed so far
  auto upload = [&](const ir::Value* v, const Tensor& host) {
    dev[v] = host.dtype() == DType::String ? host : to_device(host, rt.alloc, rt.backend, rt.stream, v->name(), "Input");
  };
  for (const ir::Value* v : g.initializers())
    if (!feeds.count(v->name())) upload(v, v->initializer());
  for (const ir::Value* v : g.inputs())
    if (auto it = feeds.find(v->name()); it != feeds.end()) upload(v, it->second);

  for (const auto& np : g.nodes()) {
    const ir::Node& node = *np;
    for (const ir::Attribute& a : node.attributes)
      if (a.type == ir::AttrType::Graph || a.type == ir::AttrType::Graphs)
        fail_unsupported("{}: nodes with subgraphs are not run by the CUDA graph runner yet", node.label());
    const int opset = static_cast<int>(model.opset(node.domain));
    std::vector<Tensor> inputs;
    std::vector<Shape> shapes;
    std::vector<DType> dtypes;
    std::vector<const Tensor*> consts;
    for (const ir::Value* v : node.inputs()) {
      if (!v) {
        inputs.emplace_back();
        shapes.emplace_back();
        dtypes.push_back(DType::Undefined);
        consts.push_back(nullptr);
        continue;
      }
      auto it = dev.find(v);
      if (it == dev.end()) fail_input("{}: input '{}' is not computed before the node (graph not sorted?)", node.label(), v->name());
      inputs.push_back(it->second);
      shapes.push_back(it->second.shape());
      dtypes.push_back(it->second.dtype());
      consts.push_back(v->is_constant() ? &v->initializer() : nullptr);
    }
    cuda_plan::NodeLaunch plan = cuda_plan::plan_node(node, opset, shapes, dtypes, consts);
    std::vector<Tensor> outs;
    bool on_device = plan.kind != cuda_plan::LaunchKind::Fallback && plan.kind != cuda_plan::LaunchKind::Gemm &&
                     plan.kind != cuda_plan::LaunchKind::Conv;
    if (on_device) {
      outs = run_planned_node(plan, node, inputs, rt);
    } else {
      log.note(node.op_type, plan.kind == cuda_plan::LaunchKind::Fallback ? plan.reason
                                                                          : "cuBLASLt/cuDNN execution not written");
      std::vector<Tensor> host;
      std::vector<const Tensor*> ptrs;
      host.reserve(inputs.size());
      for (const Tensor& t : inputs)
        host.push_back(!t.defined() || t.is_host() ? t : to_host(t, rt.backend, rt.stream, node.name, node.op_type));
      for (const Tensor& t : host) ptrs.push_back(t.defined() ? &t : nullptr);
      for (Tensor& t : evaluate_node(node, opset, ptrs))
        outs.push_back(!t.defined() || t.dtype() == DType::String
                           ? t
                           : to_device(t, rt.alloc, rt.backend, rt.stream, node.name, node.op_type));
    }
    if (stats) ++(on_device ? stats->on_device : stats->on_cpu)[node.op_type];
    for (size_t i = 0; i < node.num_outputs() && i < outs.size(); ++i)
      if (node.output(i)) dev[node.output(i)] = outs[i];
  }
  std::vector<Tensor> result;
  for (const ir::Value* v : g.outputs()) {
    auto it = dev.find(v);
    if (it == dev.end()) fail_input("graph output '{}' was not computed", v->name());
    result.push_back(it->second.is_host() ? it->second : to_host(it->second, rt.backend, rt.stream, v->name(), "Output"));
  }
  return result;
}

}  // namespace mpq::rt::gpu
