#include "runtime/cuda/graph_runner.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "runtime/cuda/device_convert.h"
#include "runtime/cuda/device_tensor.h"
#include "runtime/low_precision.h"
#include "runtime/node_eval.h"

namespace mpq::rt::gpu {

namespace {

// Small integer tensors (shapes, axes, indices) are also kept on the host as they are made, so
// that the planner can read them (a Reshape whose shape is computed at run time runs on the GPU)
// and the CPU kernels of shape arithmetic need no copy back and no synchronization. Small float
// tensors made on the host too: a Constant node's Resize scales (as `mpq convert` leaves them).
bool keep_host_mirror(const Tensor& t) {
  if (!t.defined() || t.numel() > 64) return false;
  const DType d = t.dtype();
  return d == DType::Int64 || d == DType::Int32 || d == DType::Float32 || d == DType::Float16 || d == DType::BFloat16;
}

// The node's CPU kernel on host copies of its inputs (or their host data, `on_host`); outputs copied back
// to the device, and returned on the host in `*host_outs`. The uploads are safe from temporaries:
// they are pageable memory, and cudaMemcpyAsync from pageable memory returns only once the source
// has been staged (CUDA runtime API, "API synchronization behavior"). Pinned buffers would need the
// stream synchronized first.
std::vector<Tensor> run_on_cpu(const ir::Node& node, int opset, const std::vector<Tensor>& inputs,
                               const std::vector<const Tensor*>& on_host, KernelRuntime& rt, std::vector<Tensor>* host_outs) {
  std::vector<Tensor> host;
  std::vector<const Tensor*> ptrs;
  host.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (i < on_host.size() && on_host[i]) host.push_back(*on_host[i]);
    else host.push_back(!t.defined() || t.is_host() ? t : to_host(t, rt.backend, rt.stream, node.name, node.op_type));
  }
  for (const Tensor& t : host) ptrs.push_back(t.defined() ? &t : nullptr);
  std::vector<Tensor> outs;
  *host_outs = rt.cpu_pool ? evaluate_node(node, opset, ptrs, *rt.cpu_pool) : evaluate_node(node, opset, ptrs);
  for (const Tensor& t : *host_outs)
    outs.push_back(!t.defined() || t.dtype() == DType::String ? t
                                                              : to_device(t, rt.alloc, rt.backend, rt.stream, node.name, node.op_type));
  return outs;
}

// Shape and Size read only their input's dimensions, which a device tensor carries on the host:
// no copy of the data and no synchronization. Same semantics as the CPU kernels (Shape's start and
// end from opset 15: negative from the back, clamped to [0, rank]).
bool shape_from_metadata(const ir::Node& node, int opset, const std::vector<Tensor>& inputs, Tensor* out) {
  if (!node.domain.empty() || inputs.size() != 1 || !inputs[0].defined()) return false;
  const Shape& s = inputs[0].shape();
  if (node.op_type == "Size") {
    *out = Tensor::scalar<int64_t>(inputs[0].numel());
    return true;
  }
  if (node.op_type != "Shape") return false;
  const int64_t rank = static_cast<int64_t>(s.size());
  auto clamp = [&](int64_t v) {
    if (v < 0) v += rank;
    return v < 0 ? int64_t{0} : (v > rank ? rank : v);
  };
  const int64_t start = opset >= 15 ? clamp(node.attr_int("start", 0)) : 0;
  const int64_t end = opset >= 15 ? std::max(start, clamp(node.attr_int("end", rank))) : rank;
  *out = Tensor::from<int64_t>({end - start}, std::vector<int64_t>(s.begin() + start, s.begin() + end));
  return true;
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
  std::unordered_map<const ir::Value*, Tensor> mirror;  // host copies of small values (keep_host_mirror)
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
          if (keep_host_mirror(it->second)) mirror[v] = it->second;
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
    // Each input's data on the host where it is there without a copy: a constant's initializer or a
    // small value's mirror (null otherwise). The planner reads them as known values; the
    // CPU kernels read them instead of copying the device tensor back.
    std::vector<const Tensor*> on_host;
    for (const ir::Value* v : node.inputs()) {
      if (!v) {
        inputs.emplace_back();
        shapes.emplace_back();
        dtypes.push_back(DType::Undefined);
        on_host.push_back(nullptr);
        continue;
      }
      auto it = dev.find(v);
      if (it == dev.end()) fail_input("{}: input '{}' is not computed before the node (graph not sorted?)", node.label(), v->name());
      inputs.push_back(it->second);
      shapes.push_back(it->second.shape());
      dtypes.push_back(it->second.dtype());
      auto m = mirror.find(v);
      on_host.push_back(v->is_constant() ? &v->initializer() : (m != mirror.end() ? &m->second : nullptr));
    }
    std::vector<Tensor> outs, host_outs;  // host_outs: what the host computed (CPU kernels, Shape/Size)
    bool on_device = true;
    Tensor meta;
    if (shape_from_metadata(node, opset, inputs, &meta)) {
      outs.push_back(to_device(meta, rt.alloc, rt.backend, rt.stream, node.name, node.op_type));
      host_outs.push_back(std::move(meta));
    } else {
      // FP16/BF16 values: the node computes in FP32 on the device, as runtime/low_precision.h's
      // rule does on the CPU: planned as FP32 (small host-known values widened for the planner,
      // larger ones such as weights not given), then its low-precision inputs widened on the
      // device, its float outputs rounded back to the first such input's type. Cast converts
      // itself. A CPU fallback gets the original inputs (the CPU executor applies the same rule).
      // The CPU leaves data-movement ops (Reshape, Gather, Concat, ...) in their own type; here
      // they go through FP32 too, which gives the same values (both conversions are exact).
      const DType low = node_low_type(node, inputs);
      std::vector<Tensor> wide_host(on_host.size());
      std::vector<const Tensor*> plan_on_host = on_host;
      std::vector<DType> plan_dtypes = dtypes;
      if (low != DType::Undefined)
        for (size_t i = 0; i < dtypes.size(); ++i) {
          if (dtypes[i] != DType::Float16 && dtypes[i] != DType::BFloat16) continue;
          plan_dtypes[i] = DType::Float32;
          plan_on_host[i] = nullptr;
          if (on_host[i] && keep_host_mirror(*on_host[i])) {
            wide_host[i] = widen_to_float32(*on_host[i]);
            plan_on_host[i] = &wide_host[i];
          }
        }
      const cuda_plan::NodeLaunch plan = cuda_plan::plan_node(node, opset, shapes, plan_dtypes, plan_on_host, rt.plan);
      on_device = plan.kind != cuda_plan::LaunchKind::Fallback;
      if (on_device) {
        try {
          std::vector<Tensor> wide = inputs;
          if (low != DType::Undefined)
            for (Tensor& t : wide) t = widen_on_device(rt, t, node.name, "mixed precision");
          outs = run_planned_node(plan, node, wide, rt);
          narrow_outputs_on_device(rt, outs, low, node.name);
        } catch (const Error& e) {
          // A library that declines this problem (NOT_SUPPORTED): the CPU kernel takes it.
          if (e.kind() != ErrorKind::Unsupported) throw;
          log.note(node.op_type, e.what());
          on_device = false;
        }
      } else {
        log.note(node.op_type, plan.reason);
      }
      if (!on_device) outs = run_on_cpu(node, opset, inputs, on_host, rt, &host_outs);
    }
    if (stats) ++(on_device ? stats->on_device : stats->on_cpu)[node.op_type];
    // The outputs become live values (with host mirrors of the small ones); the inputs'
    // buffers go back to the allocator after their last reader.
    for (size_t i = 0; i < node.num_outputs() && i < outs.size(); ++i)
      if (const ir::Value* v = node.output(i)) {
        const Tensor* host = i < host_outs.size() && host_outs[i].defined() ? &host_outs[i] : nullptr;
        observe(v, host ? *host : outs[i]);
        if (!last_use.count(v) && !keep.count(v)) continue;
        if (host && keep_host_mirror(*host)) mirror[v] = *host;
        dev[v] = std::move(outs[i]);
      }
    inputs.clear();
    for (const ir::Value* v : node.inputs())
      if (v && !keep.count(v) && last_use[v] == index && !v->is_constant()) {
        dev.erase(v);
        mirror.erase(v);
      }
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
