#include "runtime/cuda/graph_runner.h"

#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "runtime/cuda/device_tensor.h"
#include "runtime/node_eval.h"

namespace mpq::rt::gpu {

namespace {

// The node's CPU kernel on host copies of its inputs; outputs copied back to the device. The host
// outputs are temporaries: that is safe because they are pageable memory, and cudaMemcpyAsync from
// pageable memory returns only once the source has been staged (CUDA runtime API, "API
// synchronization behavior"). Pinned buffers would need the stream synchronized first.
std::vector<Tensor> run_on_cpu(const ir::Node& node, int opset, const std::vector<Tensor>& inputs, KernelRuntime& rt) {
  std::vector<Tensor> host;
  std::vector<const Tensor*> ptrs;
  host.reserve(inputs.size());
  for (const Tensor& t : inputs)
    host.push_back(!t.defined() || t.is_host() ? t : to_host(t, rt.backend, rt.stream, node.name, node.op_type));
  for (const Tensor& t : host) ptrs.push_back(t.defined() ? &t : nullptr);
  std::vector<Tensor> outs;
  std::vector<Tensor> computed = rt.cpu_pool ? evaluate_node(node, opset, ptrs, *rt.cpu_pool) : evaluate_node(node, opset, ptrs);
  for (Tensor& t : computed)
    outs.push_back(!t.defined() || t.dtype() == DType::String ? t
                                                              : to_device(t, rt.alloc, rt.backend, rt.stream, node.name, node.op_type));
  return outs;
}

}  // namespace

std::vector<Tensor> run_graph(const ir::Model& model, const Feeds& feeds, KernelRuntime& rt, FallbackLog& log,
                              GraphRunStats* stats, const GraphRunHooks* hooks) {
  const ir::Graph& g = *model.graph;
  check_feeds(g, feeds);
  const Observer* observer = hooks && hooks->observer && *hooks->observer ? hooks->observer : nullptr;
  auto observe = [&](const ir::Value* v, const Tensor& t) {
    if (!observer || !t.defined()) return;
    (*observer)(*v, t.is_host() ? t : to_host(t, rt.backend, rt.stream, v->name(), "observer"));
  };

  // Values that must survive to the end: graph outputs and requested intermediates.
  std::unordered_set<const ir::Value*> keep(g.outputs().begin(), g.outputs().end());
  std::vector<const ir::Value*> extra;
  if (hooks)
    for (const std::string& name : hooks->extra_values) {
      const ir::Value* v = g.find(name);
      if (!v) fail_input("no value named '{}' in the model", name);
      keep.insert(v);
      extra.push_back(v);
    }
  // Index of the last node reading each value, so its buffer can go back to the allocator then.
  std::unordered_map<const ir::Value*, size_t> last_use;
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (const ir::Value* v : g.nodes()[i]->inputs())
      if (v) last_use[v] = i;

  std::unordered_map<const ir::Value*, Tensor> dev;  // device copy of every live value
  auto upload = [&](const ir::Value* v, const Tensor& host) {
    dev[v] = host.dtype() == DType::String ? host : to_device(host, rt.alloc, rt.backend, rt.stream, v->name(), "Input");
  };
  std::unordered_map<const ir::Value*, Tensor>* constants = hooks ? hooks->constants : nullptr;
  for (const ir::Value* v : g.initializers()) {
    if (feeds.count(v->name())) continue;
    if (!constants) {
      upload(v, v->initializer());
      continue;
    }
    auto it = constants->find(v);
    if (it == constants->end()) {
      upload(v, v->initializer());
      it = constants->emplace(v, dev[v]).first;
    }
    dev[v] = it->second;
  }
  {
    // The feeds, through the pinned staging buffer when there is one.
    std::vector<const ir::Value*> fed;
    std::vector<const Tensor*> hosts;
    std::vector<std::string> names;
    for (const ir::Value* v : g.inputs())
      if (auto it = feeds.find(v->name()); it != feeds.end()) {
        if (it->second.dtype() == DType::String) {
          dev[v] = it->second;
        } else {
          fed.push_back(v);
          hosts.push_back(&it->second);
          names.push_back(v->name());
        }
        observe(v, it->second);
      }
    std::vector<Tensor> up = to_device_all(hosts, rt.staging, rt.alloc, rt.backend, rt.stream, names);
    for (size_t i = 0; i < fed.size(); ++i) dev[fed[i]] = std::move(up[i]);
  }

  for (size_t index = 0; index < g.nodes().size(); ++index) {
    const ir::Node& node = *g.nodes()[index];
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
    const cuda_plan::NodeLaunch plan = cuda_plan::plan_node(node, opset, shapes, dtypes, consts);
    std::vector<Tensor> outs;
    bool on_device = plan.kind != cuda_plan::LaunchKind::Fallback;
    if (on_device) {
      try {
        outs = run_planned_node(plan, node, inputs, rt);
      } catch (const Error& e) {
        // A library that declines this problem (NOT_SUPPORTED): the CPU kernel takes it.
        if (e.kind() != ErrorKind::Unsupported) throw;
        log.note(node.op_type, e.what());
        on_device = false;
      }
    } else {
      log.note(node.op_type, plan.reason);
    }
    if (!on_device) outs = run_on_cpu(node, opset, inputs, rt);
    if (stats) ++(on_device ? stats->on_device : stats->on_cpu)[node.op_type];
    for (size_t i = 0; i < node.num_outputs() && i < outs.size(); ++i)
      if (const ir::Value* v = node.output(i)) {
        observe(v, outs[i]);
        if (last_use.count(v) || keep.count(v)) dev[v] = std::move(outs[i]);
      }
    inputs.clear();
    for (const ir::Value* v : node.inputs())
      if (v && !keep.count(v) && last_use[v] == index && !v->is_constant()) dev.erase(v);
  }
  // Outputs and requested intermediates: one batch of copies, one synchronization.
  std::vector<const ir::Value*> wanted(g.outputs().begin(), g.outputs().end());
  if (hooks && hooks->extra_out) wanted.insert(wanted.end(), extra.begin(), extra.end());
  std::vector<Tensor> fetched(wanted.size()), on_device;
  std::vector<size_t> slots;
  std::vector<std::string> names;
  for (size_t i = 0; i < wanted.size(); ++i) {
    auto it = dev.find(wanted[i]);
    if (it == dev.end()) fail_input("value '{}' was not computed", wanted[i]->name());
    if (it->second.is_host()) {
      fetched[i] = it->second;
    } else {
      on_device.push_back(it->second);
      slots.push_back(i);
      names.push_back(wanted[i]->name());
    }
  }
  std::vector<Tensor> down = to_host_all(on_device, rt.staging, rt.backend, rt.stream, names);
  for (size_t k = 0; k < slots.size(); ++k) fetched[slots[k]] = std::move(down[k]);
  const size_t n_out = g.outputs().size();
  if (hooks && hooks->extra_out) hooks->extra_out->assign(fetched.begin() + static_cast<long>(n_out), fetched.end());
  fetched.resize(n_out);
  return fetched;
}

}  // namespace mpq::rt::gpu
