#include "train/autograd.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <cstring>
#include <functional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "kernels/ops_table.h"
#include "ir/onnx_tools.h"
#include "passes/fuse_gelu.h"
#include "passes/fuse_layer_norm.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/device_tensor.h"
#include "runtime/cuda/node_plan.h"
#include "runtime/cuda/node_runner.h"
#include "runtime/cuda/status.h"
#include "runtime/low_precision.h"
#include "runtime/thread_pool.h"
#include "train/cuda/backward_runner.h"
#include "train/cuda/device_amp.h"
#include "train/cuda/device_parameters.h"
#include "train/grads/grad_util.h"

namespace mpq::train {

namespace {

int node_opset(const ir::Model& model, const std::string& domain) {
  const int64_t v = model.opset(domain);
  return v > 0 ? static_cast<int>(v) : 1;
}

bool is_float(DType t) {
  return t == DType::Float32 || t == DType::Float64 || t == DType::Float16 || t == DType::BFloat16;
}

// Ops whose outputs never carry a gradient: indices, comparisons, shapes, generators, and
// piecewise-constant functions (zero gradient almost everywhere, as in PyTorch).
bool op_is_non_differentiable(const ir::Node& n) {
  static const std::unordered_set<std::string> ops = {
      "Shape", "Size", "ArgMax", "ArgMin", "Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not",
      "And", "Or", "Xor", "IsNaN", "IsInf", "NonZero", "ConstantOfShape", "Range", "Floor", "Ceil", "Round",
      "Sign", "EyeLike", "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli",
      "Multinomial", "QuantizeLinear", "DynamicQuantizeLinear", "Constant", "OneHot", "BitShift", "Mod"};
  return n.domain.empty() && ops.count(n.op_type) > 0;
}

bool output_differentiable(const ir::Node& n, size_t i) {
  if (op_is_non_differentiable(n)) return false;
  const ir::Value* v = n.output(i);
  if (!v) return false;
  if (n.domain.empty() && n.op_type == "Cast") return is_float(static_cast<DType>(n.attr_int("to", 1)));
  if (n.domain.empty() && (n.op_type == "TopK" || n.op_type == "MaxPool") && i == 1) return false;  // indices
  if (v->type.is_tensor() && v->type.elem != DType::Undefined) return is_float(v->type.elem);
  return true;
}

// Ops that pass a parameter through unchanged in value (default_trainable looks past them).
bool is_pass_through(const ir::Node& n) {
  static const std::unordered_set<std::string> ops = {"Identity", "Reshape", "Transpose", "Squeeze",
                                                      "Unsqueeze", "Flatten", "Cast", "Expand"};
  return n.domain.empty() && ops.count(n.op_type) > 0;
}

bool is_weight_slot(const ir::Node& n, int index) {
  // Step sizes (LSQ), and weights and biases behind their fake quantizers.
  if (n.domain == "mpq" && n.op_type == "FakeQuant") return index <= 1;
  if (n.domain == "mpq" && n.op_type == "FakeQuantBias") return index == 0;
  if (n.domain == "mpq" && n.op_type == "LayerNormalization") return index == 1 || index == 2;
  if (!n.domain.empty()) return false;
  const std::string& op = n.op_type;
  if (op == "Conv" || op == "ConvTranspose" || op == "Gemm" || op == "MatMul") return index == 1 || index == 2;
  if (op == "BatchNormalization" || op == "LayerNormalization" || op == "InstanceNormalization" ||
      op == "GroupNormalization")
    return index == 1 || index == 2;
  return false;
}

// 0: no differentiable use; 1: a differentiable use; 2: a weight / normalisation parameter slot.
int parameter_use(const ir::Model& model, const ir::Value* v, const GradRegistry& grads, int depth) {
  int best = 0;
  for (const ir::Use& u : v->uses()) {
    const ir::Node& n = *u.node;
    const GradDef* def = grads.find(n.domain, n.op_type, node_opset(model, n.domain), rt::BackendKind::CPU);
    if (!def || !in_mask(def->differentiable, static_cast<size_t>(u.input_index))) continue;
    if (is_weight_slot(n, u.input_index)) return 2;
    best = std::max(best, 1);
    if (is_pass_through(n) && u.input_index == 0 && depth < 8)
      for (const ir::Value* out : n.outputs())
        if (out) best = std::max(best, parameter_use(model, out, grads, depth + 1));
    if (best == 2) return 2;
  }
  return best;
}

}  // namespace

std::vector<std::string> default_trainable(const ir::Model& model, const GradRegistry& grads) {
  std::vector<std::string> names;
  for (const ir::Value* v : model.graph->initializers()) {
    if (v->is_graph_input() || !is_float(v->initializer().dtype())) continue;
    const int use = parameter_use(model, v, grads, 0);
    if (use == 2 || (use == 1 && v->initializer().numel() > 1)) names.push_back(v->name());
  }
  return names;
}

namespace {

// Runs a training forward as an OpKernel so that run_in_float32 can wrap it like any kernel.
class TrainForwardKernel final : public rt::OpKernel {
 public:
  TrainForwardKernel(TrainForwardFn fn, bool training) : fn_(fn), training_(training) {}
  void compute(rt::KernelContext& ctx) override {
    TrainForwardContext tctx(ctx, training_);
    fn_(tctx);
    stash = std::move(tctx.stash());
    updates = std::move(tctx.updates());
  }
  std::vector<Tensor> stash;
  std::vector<std::pair<size_t, Tensor>> updates;

 private:
  TrainForwardFn fn_;
  bool training_;
};

struct Step {
  const ir::Node* node = nullptr;
  int opset = 0;
  const rt::KernelDef* kdef = nullptr;
  std::unique_ptr<rt::OpKernel> kernel;
  const GradDef* gdef = nullptr;  // found for every node (its train_forward applies off the gradient path too)
  bool backward = false;          // on a path from a parameter to the loss
  std::vector<int> inputs, outputs;
  std::vector<int> release;        // slots whose last forward reader this is
  std::vector<char> wanted;        // per input: gradient wanted
  // Per forward: what the backward reads.
  std::vector<Tensor> saved_in, saved_out, stash;
  std::vector<Shape> in_shapes, out_shapes;
  std::vector<DType> seen_dtype;  // type each input had when the kernel ran (after autocast)
  std::vector<char> present;
  bool ran = false;
};

// AutogradOptions::device == CUDA: the plugin's context (or the tests' kernel table and memory),
// the kernel runtime over it, and the device copies of the constant initializers (uploaded once).
struct DevicePath {
  std::unique_ptr<rt::gpu::CudaContext> context;
  std::unique_ptr<rt::gpu::CachingAllocator> test_allocator;
  std::unique_ptr<rt::gpu::KernelRuntime> runtime;
  rt::gpu::FallbackLog own_log;
  rt::gpu::FallbackLog* log = &own_log;
  std::unordered_map<int, Tensor> constants;
  // MPQ_CUDA_PROFILE=1: every forward and backward step is timed between two stream
  // synchronisations (which slows the run) and the totals per op type go to stderr at the end.
  bool profiling = false;
  std::map<std::string, std::pair<int64_t, double>> profile;

  void sync(const std::string& what) {
    const int code = runtime->backend.synchronize(runtime->stream);
    rt::cuda_plan::check_cuda_status(rt::cuda_plan::CudaLibrary::Runtime, code, "cudaStreamSynchronize",
                                     runtime->backend.error_text(code), "MPQ_CUDA_PROFILE", what);
  }
  template <class F>
  void timed(const std::string& key, F&& f) {
    if (!profiling) return f();
    using Clock = std::chrono::steady_clock;
    sync(key);
    const auto t0 = Clock::now();
    f();
    sync(key);
    auto& [calls, ms] = profile[key];
    ++calls;
    ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  }

  DevicePath(const AutogradOptions& o, rt::ThreadPool& pool) {
    const char* env = std::getenv("MPQ_CUDA_PROFILE");
    profiling = env && *env && std::string(env) != "0";
    if ((o.cuda_ops == nullptr) != (o.cuda_memory == nullptr))
      fail_internal("AutogradOptions: cuda_ops and cuda_memory go together");
    if (o.cuda_ops) {
      test_allocator = std::make_unique<rt::gpu::CachingAllocator>(*o.cuda_memory);
      runtime.reset(new rt::gpu::KernelRuntime{*o.cuda_ops, *test_allocator, *o.cuda_memory, nullptr});
    } else {
      context = std::make_unique<rt::gpu::CudaContext>();
      runtime.reset(new rt::gpu::KernelRuntime{context->ops(), context->allocator(), context->backend(), context->stream()});
      log = &context->fallbacks();
    }
    runtime->cpu_pool = &pool;
  }
  ~DevicePath() {
    if (profiling && !profile.empty()) {
      std::vector<std::pair<double, std::string>> rows;
      double total = 0.0;
      for (const auto& [key, v] : profile) {
        rows.emplace_back(v.second, key);
        total += v.second;
      }
      std::sort(rows.rbegin(), rows.rend());
      std::fprintf(stderr, "MPQ_CUDA_PROFILE: training engine on the device, %.3f ms in all\n", total);
      for (const auto& [ms, key] : rows)
        std::fprintf(stderr, "  %-40s %8lld calls %10.3f ms %6.1f%%\n", key.c_str(), static_cast<long long>(profile[key].first), ms,
                     total > 0 ? 100.0 * ms / total : 0.0);
    }
    constants.clear();  // device buffers go back before the allocator and the stream do
    runtime.reset();
  }
  bool on_device(const Tensor& t) const { return t.defined() && t.device() == Device::CUDA; }
  Tensor upload(const Tensor& t, const std::string& name, const char* what) {
    if (!t.defined() || on_device(t) || t.dtype() == DType::String) return t;
    return rt::gpu::to_device(t, runtime->alloc, runtime->backend, runtime->stream, name, what);
  }
  Tensor download(const Tensor& t, const std::string& name, const char* what) {
    if (!on_device(t)) return t;
    return rt::gpu::to_host(t, runtime->backend, runtime->stream, name, what);
  }
  // a + b (same shape) as a new device tensor of a's type (FP16/BF16 added in FP32, then rounded,
  // as the CPU engine's grad_util::add).
  Tensor add(const Tensor& a, const Tensor& b, const std::string& name) {
    const Tensor wa = widen(a, name, "gradient sum"), wb = widen(b, name, "gradient sum");
    Tensor r = rt::gpu::device_empty(runtime->alloc, DType::Float32, a.shape(), runtime->stream, name, "gradient sum");
    gpu::add_same_shape(*runtime, wa, wb, r, name, "gradient sum");
    return convert(r, a.dtype(), name, "gradient sum");
  }
  // Mixed precision: a float value stored as `to` (on the device where it lives there).
  Tensor convert(const Tensor& t, DType to, const std::string& name, const char* what) {
    if (!t.defined() || t.dtype() == to) return t;
    return on_device(t) ? gpu::convert_on_device(*runtime, t, to, name, what) : grad_util::convert(t, to);
  }
  Tensor widen(const Tensor& t, const std::string& name, const char* what) {
    return on_device(t) ? gpu::widen_on_device(*runtime, t, name, what) : (t.defined() ? rt::widen_to_float32(t) : t);
  }
};

// Whether `m` has a node where a LayerNorm (Sub of a ReduceMean) or GELU (Erf) pattern could
// start: without one, no copy is made.
bool may_fuse(const ir::Model& m) {
  for (const auto& np : m.graph->nodes()) {
    const ir::Node& n = *np;
    if (!n.domain.empty()) continue;
    if (n.op_type == "Erf") return true;
    if (n.op_type == "Sub" && n.num_inputs() > 1 && n.input(1) && n.input(1)->producer() &&
        n.input(1)->producer()->op_type == "ReduceMean")
      return true;
  }
  return false;
}

// The model the engine trains: `m` itself, or a copy with its LayerNorm and GELU patterns fused
// (AutogradOptions::fuse) when both registries take the fused op. Null when nothing changed, or
// when the fusion would change what the parameters named in `o.trainable` feed.
std::unique_ptr<ir::Model> fuse_for_training(const ir::Model& m, const AutogradOptions& o, const rt::OpRegistry& kernels,
                                             const GradRegistry& grads) {
  if (!o.fuse || o.amp != Amp::Off || o.device != rt::BackendKind::CPU || !may_fuse(m)) return nullptr;
  auto takes = [&](const char* op) {
    const int opset = std::max(1, node_opset(m, "mpq"));
    return kernels.find("mpq", op, opset, rt::BackendKind::CPU) && grads.find("mpq", op, opset, rt::BackendKind::CPU);
  };
  passes::FuseLayerNorm fuse_ln;
  passes::FuseGelu fuse_gelu;
  std::vector<passes::Pass*> pipeline;
  if (takes("LayerNormalization")) pipeline.push_back(&fuse_ln);
  if (takes("Gelu")) pipeline.push_back(&fuse_gelu);
  if (pipeline.empty()) return nullptr;
  auto fused = std::make_unique<ir::Model>(m.clone());
  ir::infer_shapes(*fused);  // best effort: the patterns need their input's element type
  int changed = 0;
  for (passes::Pass* pass : pipeline) changed += passes::run_pass(*pass, *fused).changed;
  if (changed == 0) return nullptr;
  // A parameter the fusion took out of the graph (an epsilon that became an attribute), or whose
  // uses it changed (a constant shared with a node outside the pattern, a weight of a branch the
  // pass removed as dead): keep the graph as written.
  for (const std::string& name : o.trainable) {
    const ir::Value* v = fused->graph->find(name);
    const ir::Value* was = m.graph->find(name);
    if (!v || !v->has_initializer() || !was || v->uses().size() != was->uses().size()) return nullptr;
  }
  // The inferred types served the patterns only: the engine plans with the model's own.
  for (ir::Value* v : fused->graph->values())
    if (const ir::Value* was = m.graph->find(v->name())) v->type = was->type;
  return fused;
}

// `o` with the default parameters resolved on the model as written (AutogradOptions::trainable
// empty and default_parameters on), so that fusing cannot change which initializers train.
AutogradOptions resolve_parameters(const ir::Model& m, AutogradOptions o) {
  if (o.trainable.empty() && o.default_parameters) {
    o.trainable = default_trainable(m, o.grads ? *o.grads : GradRegistry::global());
    o.default_parameters = false;
  }
  return o;
}

}  // namespace

struct Autograd::Impl {
  std::unique_ptr<ir::Model> fused;  // the fused copy `model` refers to, if any
  const ir::Model& model;
  AutogradOptions options;
  const rt::OpRegistry& kernels;
  const GradRegistry& grads;
  rt::ThreadPool pool;
  // Device mode; declared before the values and steps so that their device buffers go first.
  std::unique_ptr<DevicePath> dev;
  std::unique_ptr<gpu::DeviceParameters> dev_params;  // the parameters' device copies (device mode)

  std::unordered_map<std::string, int> slot_of;
  std::vector<const ir::Value*> slot_values;
  std::vector<Step> steps;
  std::vector<int> input_slots, output_slots;
  std::vector<std::pair<int, Tensor>> constants;
  std::vector<int> param_of_slot;  // slot -> parameter index or -1
  std::vector<int> state_of_slot;  // slot -> state buffer index or -1
  std::vector<char> requires_grad;
  std::vector<Parameter> params;
  std::vector<StateBuffer> state;
  std::vector<std::string> output_names;

  // Per forward.
  std::vector<Tensor> env;
  std::vector<DType> slot_dtype;
  std::unordered_map<int, Tensor> low_cache;
  bool have_forward = false;
  std::vector<Tensor> input_grad_values;
  size_t step_base = 0, step_peak = 0;

  Impl(const ir::Model& m, AutogradOptions o)
      : fused(fuse_for_training(m, o, o.kernels ? *o.kernels : rt::OpRegistry::global(),
                                o.grads ? *o.grads : GradRegistry::global())),
        model(fused ? *fused : m),
        options(std::move(o)),
        kernels(options.kernels ? *options.kernels : rt::OpRegistry::global()),
        grads(options.grads ? *options.grads : GradRegistry::global()),
        pool(options.threads) {
    plan();
    if (options.device == rt::BackendKind::CUDA) {
      // The device kernels and backward bodies are FP32 (float64 gradient checks and FP16/BF16
      // models train on the CPU); mixed precision stores FP16/BF16 values around them
      // (train/cuda/device_amp.h).
      for (const ir::Value* v : slot_values) {
        const DType t = v->has_initializer() ? v->initializer().dtype() : v->type.elem;
        if (is_float(t) && t != DType::Float32)
          fail_unsupported("training on the GPU takes FP32 models only: '{}' is {}; train on the CPU (--device cpu)", v->name(),
                           dtype_name(t));
      }
      dev = std::make_unique<DevicePath>(options, pool);
      dev_params = std::make_unique<gpu::DeviceParameters>(params, *dev->runtime);
    } else if (options.device != rt::BackendKind::CPU) {
      fail_unsupported("the training engine runs on the CPU or CUDA only");
    }
  }
  ~Impl() {
    // Saved device values and gradients first, then the device path (allocator, stream).
    steps.clear();
    env.clear();
    low_cache.clear();
    input_grad_values.clear();
    dev_params.reset();
    dev.reset();
  }

  int slot(const ir::Value* v) {
    auto [it, inserted] = slot_of.emplace(v->name(), static_cast<int>(slot_values.size()));
    if (inserted) slot_values.push_back(v);
    return it->second;
  }

  void plan() {
    const ir::Graph& g = *model.graph;
    for (ir::Value* v : g.values()) slot(v);
    for (ir::Value* v : g.inputs()) input_slots.push_back(slot(v));
    for (ir::Value* v : g.outputs()) {
      output_slots.push_back(slot(v));
      output_names.push_back(v->name());
    }
    const size_t n_slots = slot_values.size();
    param_of_slot.assign(n_slots, -1);
    state_of_slot.assign(n_slots, -1);

    // Already resolved on the model as written (resolve_parameters).
    for (const std::string& name : options.trainable) {
      const ir::Value* v = g.find(name);
      if (!v || !v->has_initializer())
        fail_input("'{}' is not an initializer of the model and cannot be trained", name);
      if (!is_float(v->initializer().dtype()))
        fail_input("initializer '{}' is {}, only float tensors can be trained", name, dtype_name(v->initializer().dtype()));
      const int s = slot(v);
      if (param_of_slot[static_cast<size_t>(s)] >= 0) continue;
      param_of_slot[static_cast<size_t>(s)] = static_cast<int>(params.size());
      Parameter p;
      p.name = name;
      p.value = v->initializer().clone();
      p.grad = Tensor::zeros(p.value.dtype(), p.value.shape());
      params.push_back(std::move(p));
    }
    for (ir::Value* v : g.initializers())
      if (param_of_slot[static_cast<size_t>(slot(v))] < 0) constants.emplace_back(slot(v), v->initializer());

    // Forward plan: kernels, slots, readiness and last readers (as the executor does).
    std::vector<char> ready(n_slots, 0);
    for (ir::Value* v : g.values())
      if (v->is_graph_input() || v->has_initializer()) ready[static_cast<size_t>(slot(v))] = 1;
    std::vector<int> last_reader(n_slots, -1);
    for (const auto& np : g.nodes()) {
      const ir::Node& n = *np;
      if (!n.subgraphs().empty())
        fail_unsupported("{}: control flow (If, Loop, Scan) is not supported by the training engine", n.label());
      Step st;
      st.node = &n;
      st.opset = node_opset(model, n.domain);
      st.kdef = kernels.find(n.domain, n.op_type, st.opset, rt::BackendKind::CPU);
      if (!st.kdef)
        fail_unsupported("{}: operator {}{} (opset {}) is not supported on cpu", n.label(),
                         n.domain.empty() ? "" : n.domain + "::", n.op_type, st.opset);
      st.kernel = st.kdef->factory(n, st.opset);
      st.gdef = grads.find(n.domain, n.op_type, st.opset, rt::BackendKind::CPU);
      const int index = static_cast<int>(steps.size());
      for (ir::Value* v : n.inputs()) {
        if (!v) {
          st.inputs.push_back(-1);
          continue;
        }
        const int s = slot(v);
        if (!ready[static_cast<size_t>(s)])
          fail_input("{}: reads '{}' before it is computed (graph is not in topological order)", n.label(), v->name());
        st.inputs.push_back(s);
        last_reader[static_cast<size_t>(s)] = index;
      }
      for (ir::Value* v : n.outputs()) {
        st.outputs.push_back(v ? slot(v) : -1);
        if (v) ready[static_cast<size_t>(slot(v))] = 1;
      }
      steps.push_back(std::move(st));
    }
    std::set<int> keep(output_slots.begin(), output_slots.end());
    for (size_t s = 0; s < n_slots; ++s)
      if (last_reader[s] >= 0 && !keep.count(static_cast<int>(s)))
        steps[static_cast<size_t>(last_reader[s])].release.push_back(static_cast<int>(s));
    for (size_t i = 0; i < steps.size(); ++i)
      for (int s : steps[i].outputs)
        if (s >= 0 && last_reader[static_cast<size_t>(s)] < 0 && !keep.count(s)) steps[i].release.push_back(s);

    // Which values carry a gradient (forward from the parameters) ...
    requires_grad.assign(n_slots, 0);
    for (size_t s = 0; s < n_slots; ++s)
      if (param_of_slot[s] >= 0) requires_grad[s] = 1;
    if (options.input_grads)
      for (int s : input_slots)
        if (!slot_values[static_cast<size_t>(s)]->has_initializer()) requires_grad[static_cast<size_t>(s)] = 1;
    std::vector<char> any_input_req(steps.size(), 0);
    for (size_t k = 0; k < steps.size(); ++k) {
      Step& st = steps[k];
      bool req = false;
      for (size_t i = 0; i < st.inputs.size(); ++i) {
        const int s = st.inputs[i];
        if (s < 0 || !requires_grad[static_cast<size_t>(s)]) continue;
        any_input_req[k] = 1;
        if (!st.gdef || in_mask(st.gdef->differentiable, i)) req = true;
      }
      if (!req) continue;
      for (size_t j = 0; j < st.outputs.size(); ++j)
        if (st.outputs[j] >= 0 && output_differentiable(*st.node, j)) requires_grad[static_cast<size_t>(st.outputs[j])] = 1;
    }
    // ... and which lead to a graph output (backward from the loss).
    std::vector<char> reaches(n_slots, 0);
    for (int s : output_slots) reaches[static_cast<size_t>(s)] = 1;
    for (size_t k = steps.size(); k-- > 0;) {
      Step& st = steps[k];
      bool out_reaches = false;
      for (size_t j = 0; j < st.outputs.size(); ++j) {
        const int s = st.outputs[j];
        if (s >= 0 && reaches[static_cast<size_t>(s)] && requires_grad[static_cast<size_t>(s)]) out_reaches = true;
      }
      if (!out_reaches || !any_input_req[k]) continue;
      if (!st.gdef)
        fail_unsupported("{}: operator {} has no backward kernel, and it lies on the path from a trained parameter "
                         "to the loss (freeze the parameters before it, or exclude the node)",
                         st.node->label(), st.node->op_type);
      st.backward = true;
      st.wanted.assign(st.inputs.size(), 0);
      for (size_t i = 0; i < st.inputs.size(); ++i) {
        const int s = st.inputs[i];
        if (s >= 0 && requires_grad[static_cast<size_t>(s)] && in_mask(st.gdef->differentiable, i)) {
          st.wanted[i] = 1;
          reaches[static_cast<size_t>(s)] = 1;
        }
      }
    }
  }

  // The tensor slot `s` holds for the forward: a parameter, running state, a constant or a value.
  Tensor convert_cached(int s, const Tensor& t, DType to) {
    const bool constant = param_of_slot[static_cast<size_t>(s)] >= 0 || slot_values[static_cast<size_t>(s)]->has_initializer();
    auto convert = [&] {
      return dev ? dev->convert(t, to, slot_values[static_cast<size_t>(s)]->name(), "autocast") : grad_util::convert(t, to);
    };
    if (!constant) return convert();
    auto it = low_cache.find(s);
    if (it != low_cache.end() && it->second.dtype() == to) return it->second;
    Tensor c = convert();
    low_cache[s] = c;
    return c;
  }

  std::vector<Tensor> forward(const rt::Feeds& feeds) {
    rt::check_feeds(*model.graph, feeds);
    // Same bits at any thread count; oneDNN's convolutions in FP32 only (runtime/cpu/conv_common.h).
    rt::cpu::DeterministicBlas deterministic(options.amp == Amp::Off);
    // A forward without a backward leaves saved tensors behind; drop them first.
    for (Step& st : steps) clear_saved(st);
    input_grad_values.clear();
    env.assign(slot_values.size(), Tensor());
    slot_dtype.assign(slot_values.size(), DType::Undefined);
    low_cache.clear();
    for (const auto& [s, t] : constants) env[static_cast<size_t>(s)] = t;
    for (size_t s = 0; s < state_of_slot.size(); ++s)  // running state replaces its initializer
      if (state_of_slot[s] >= 0) env[s] = state[static_cast<size_t>(state_of_slot[s])].value;
    for (size_t s = 0; s < param_of_slot.size(); ++s)
      if (param_of_slot[s] >= 0) {
        const size_t p = static_cast<size_t>(param_of_slot[s]);
        env[s] = dev_params ? dev_params->value(p) : params[p].value;
      }
    for (int s : input_slots) {
      auto it = feeds.find(slot_values[static_cast<size_t>(s)]->name());
      if (it != feeds.end()) env[static_cast<size_t>(s)] = it->second;
    }
    for (size_t s = 0; s < env.size(); ++s)
      if (env[s].defined()) slot_dtype[s] = env[s].dtype();
    step_base = host_bytes_in_use();
    host_reset_peak();

    if (dev) {
      // Constants once per engine; running state and feeds every forward (parameters are on the
      // device already).
      for (size_t s = 0; s < env.size(); ++s) {
        if (!env[s].defined()) continue;
        const std::string& name = slot_values[s]->name();
        const bool constant = param_of_slot[s] < 0 && state_of_slot[s] < 0 && slot_values[s]->has_initializer() &&
                              !slot_values[s]->is_graph_input();  // a feed may replace an input's default
        if (constant) {
          Tensor& cached = dev->constants[static_cast<int>(s)];
          if (!cached.defined()) cached = dev->upload(env[s], name, "Initializer");
          env[s] = cached;
        } else {
          env[s] = dev->upload(env[s], name, "Input");
        }
      }
    }
    for (Step& st : steps)
      if (dev) dev->timed(st.node->op_type, [&] { run_forward_step_device(st); });
      else run_forward_step(st);
    have_forward = true;
    std::vector<Tensor> out;
    for (int s : output_slots) {
      if (!env[static_cast<size_t>(s)].defined())
        fail_input("output '{}' was not computed", slot_values[static_cast<size_t>(s)]->name());
      out.push_back(dev ? dev->download(env[static_cast<size_t>(s)], slot_values[static_cast<size_t>(s)]->name(), "Output")
                        : env[static_cast<size_t>(s)]);
    }
    return out;
  }

  // What a step's CPU kernel produced.
  struct CpuRun {
    std::vector<Tensor> outs;
    std::vector<Tensor> stash;
    std::vector<std::pair<size_t, Tensor>> updates;
  };

  // Runs the step's CPU kernel (or its training forward) on `ins`.
  CpuRun compute_on_cpu(Step& st, const std::vector<const Tensor*>& ins) {
    const ir::Node& n = *st.node;
    rt::KernelContext ctx(n, st.opset, pool, nullptr);
    ctx.mutable_inputs() = ins;
    ctx.mutable_outputs().resize(st.outputs.size());
    std::unique_ptr<TrainForwardKernel> train_kernel;
    if (st.gdef && st.gdef->train_forward) train_kernel = std::make_unique<TrainForwardKernel>(st.gdef->train_forward, options.training);
    try {
      rt::OpKernel& k = train_kernel ? static_cast<rt::OpKernel&>(*train_kernel) : *st.kernel;
      const bool native = !train_kernel && st.kdef->native_low_precision;
      if (!native && rt::any_low_precision(ins)) rt::run_in_float32(k, ctx);
      else k.compute(ctx);
    } catch (const Error& e) {
      const std::string label = n.label();
      if (std::string(e.what()).find(label) != std::string::npos) throw;
      throw Error(e.kind(), label + ": " + e.what());
    } catch (const std::bad_alloc&) {
      fail_input("{}: out of memory", n.label());
    }
    CpuRun r;
    r.outs = std::move(ctx.mutable_outputs());
    if (train_kernel) {
      r.stash = std::move(train_kernel->stash);
      r.updates = std::move(train_kernel->updates);
    }
    return r;
  }

  // The step's bookkeeping after its outputs exist: running state, what the backward keeps, the
  // values into the environment, releases.
  void record(Step& st, const std::vector<const Tensor*>& ins, CpuRun& r) {
    const ir::Node& n = *st.node;
    for (auto& [i, value] : r.updates) store_state(st, i, dev ? dev->download(value, n.name, "running state") : std::move(value));
    if (st.backward) {
      st.ran = true;
      st.present.assign(st.inputs.size(), 0);
      st.in_shapes.assign(st.inputs.size(), Shape{});
      st.seen_dtype.assign(st.inputs.size(), DType::Undefined);
      st.saved_in.assign(st.inputs.size(), Tensor());
      for (size_t i = 0; i < st.inputs.size(); ++i) {
        if (!ins[i]) continue;
        st.present[i] = 1;
        st.in_shapes[i] = ins[i]->shape();
        st.seen_dtype[i] = ins[i]->dtype();
        if (in_mask(st.gdef->saved_inputs, i)) st.saved_in[i] = *ins[i];
      }
      st.stash = std::move(r.stash);
      st.out_shapes.assign(st.outputs.size(), Shape{});
      st.saved_out.assign(st.outputs.size(), Tensor());
    }
    auto& outs = r.outs;
    for (size_t j = 0; j < st.outputs.size(); ++j) {
      const int s = st.outputs[j];
      if (s < 0) continue;
      if (j >= outs.size() || !outs[j].defined()) fail_internal("{}: kernel did not produce output {}", n.label(), j);
      if (st.backward) {
        st.out_shapes[j] = outs[j].shape();
        if (in_mask(st.gdef->saved_outputs, j)) st.saved_out[j] = outs[j];
      }
      slot_dtype[static_cast<size_t>(s)] = outs[j].dtype();
      env[static_cast<size_t>(s)] = std::move(outs[j]);
    }
    for (int s : st.release) env[static_cast<size_t>(s)] = Tensor();
  }

  // The host tensor of a constant (non-trained, non-state) initializer, for the device planner.
  const Tensor* host_constant(int s) const {
    if (s < 0) return nullptr;
    const ir::Value* v = slot_values[static_cast<size_t>(s)];
    if (!v->has_initializer() || v->is_graph_input() || param_of_slot[static_cast<size_t>(s)] >= 0 ||
        state_of_slot[static_cast<size_t>(s)] >= 0)
      return nullptr;
    return &v->initializer();
  }

  // Device mode: the node's planned kernel on device tensors, or its CPU kernel with copies.
  void run_forward_step_device(Step& st) {
    const ir::Node& n = *st.node;
    const size_t ni = st.inputs.size();
    std::vector<Tensor> ins(ni);
    for (size_t i = 0; i < ni; ++i) {
      const int s = st.inputs[i];
      if (s < 0) continue;
      ins[i] = env[static_cast<size_t>(s)];
      if (!ins[i].defined())
        fail_internal("{}: input '{}' has no value at run time", n.label(), slot_values[static_cast<size_t>(s)]->name());
    }
    std::vector<const Tensor*> ptrs(ni, nullptr);
    for (size_t i = 0; i < ni; ++i)
      if (ins[i].defined()) ptrs[i] = &ins[i];
    std::vector<char> converted(ni, 0);
    if (options.amp != Amp::Off) {
      // Autocast, as on the CPU: the converted inputs are what the node sees and the backward keeps.
      const AutocastDecision d = autocast(n, ptrs, options.amp);
      for (size_t i = 0; i < ni; ++i)
        if (d.cast_input[i]) {
          ins[i] = convert_cached(st.inputs[i], ins[i], d.compute);
          converted[i] = 1;
        }
    }
    // A node with FP16/BF16 inputs computes in FP32 on the device: its inputs widened here, its
    // float outputs rounded back to `low` below (runtime/low_precision.h's rule on the CPU).
    const DType low = rt::gpu::node_low_type(n, ins);
    std::vector<Tensor> wide = ins;
    if (low != DType::Undefined)
      for (Tensor& t : wide) t = dev->widen(t, n.name, "mixed precision");
    CpuRun r;
    std::string reason;
    bool done = false;
    bool all_on_device = true;
    for (const Tensor& t : ins)
      if (t.defined() && !dev->on_device(t)) all_on_device = false;
    if (!all_on_device) {
      reason = "an input lives on the host";
    } else if (n.domain.empty() && n.op_type == "BatchNormalization") {
      // BatchNormalization's training forward on the device: statistics, running-state updates
      // (downloaded into the state buffers by record()) and the stash for the backward.
      bool statistics_wanted = false;
      for (size_t j = 1; j < st.outputs.size(); ++j)
        if (st.outputs[j] >= 0) statistics_wanted = true;
      try {
        gpu::BatchNormForward f = gpu::run_batchnorm_forward(n, options.training, wide, statistics_wanted, *dev->runtime);
        r.outs.assign(st.outputs.size(), Tensor());
        r.outs[0] = std::move(f.y);
        r.stash = std::move(f.stash);
        if (options.training) {
          r.updates.emplace_back(3, std::move(f.new_mean));
          r.updates.emplace_back(4, std::move(f.new_var));
        }
        done = true;
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::Unsupported) throw;
        reason = e.what();
      }
    } else if (st.gdef && st.gdef->train_forward) {
      reason = "its training forward runs on the CPU";
    } else {
      std::vector<Shape> shapes(ni);
      std::vector<DType> dtypes(ni, DType::Undefined);
      std::vector<const Tensor*> known(ni, nullptr);
      for (size_t i = 0; i < ni; ++i) {
        if (!wide[i].defined()) continue;
        shapes[i] = wide[i].shape();
        dtypes[i] = wide[i].dtype();
        // A constant the autocast rounded no longer holds the initializer's values.
        if (!converted[i]) known[i] = host_constant(st.inputs[i]);
      }
      const rt::cuda_plan::NodeLaunch l = rt::cuda_plan::plan_node(n, st.opset, shapes, dtypes, known);
      if (l.kind == rt::cuda_plan::LaunchKind::Fallback) {
        reason = l.reason;
      } else {
        try {
          r.outs = rt::gpu::run_planned_node(l, n, wide, *dev->runtime);
          done = true;
        } catch (const Error& e) {
          if (e.kind() != ErrorKind::Unsupported) throw;
          reason = e.what();
        }
      }
    }
    if (done) rt::gpu::narrow_outputs_on_device(*dev->runtime, r.outs, low, n.name);
    if (!done) {
      dev->log->note(n.op_type, reason);
      std::vector<Tensor> host(ni);
      std::vector<const Tensor*> hptrs(ni, nullptr);
      for (size_t i = 0; i < ni; ++i)
        if (ins[i].defined()) {
          host[i] = dev->download(ins[i], n.name, n.op_type.c_str());
          hptrs[i] = &host[i];
        }
      r = compute_on_cpu(st, hptrs);
      for (Tensor& t : r.outs) t = dev->upload(t, n.name, n.op_type.c_str());
    }
    // The backward keeps the device inputs (the originals), not the host copies.
    record(st, ptrs, r);
  }

  void run_forward_step(Step& st) {
    const ir::Node& n = *st.node;
    std::vector<const Tensor*> ins(st.inputs.size(), nullptr);
    for (size_t i = 0; i < st.inputs.size(); ++i) {
      const int s = st.inputs[i];
      if (s < 0) continue;
      const Tensor& t = env[static_cast<size_t>(s)];
      if (!t.defined())
        fail_internal("{}: input '{}' has no value at run time", n.label(), slot_values[static_cast<size_t>(s)]->name());
      ins[i] = &t;
    }
    // Autocast: converted inputs live in `cast` for the duration of the step.
    std::vector<Tensor> cast(st.inputs.size());
    if (options.amp != Amp::Off) {
      const AutocastDecision d = autocast(n, ins, options.amp);
      for (size_t i = 0; i < ins.size(); ++i) {
        if (!d.cast_input[i]) continue;
        cast[i] = convert_cached(st.inputs[i], *ins[i], d.compute);
        ins[i] = &cast[i];
      }
    }
    CpuRun r = compute_on_cpu(st, ins);
    record(st, ins, r);
  }

  void store_state(const Step& st, size_t i, Tensor value) {
    if (i >= st.inputs.size() || st.inputs[i] < 0) return;
    const int s = st.inputs[i];
    const ir::Value* v = slot_values[static_cast<size_t>(s)];
    if (!v->has_initializer() || v->is_graph_input() || param_of_slot[static_cast<size_t>(s)] >= 0) return;
    int& k = state_of_slot[static_cast<size_t>(s)];
    if (dev) dev->constants.erase(s);  // running state: uploaded every forward from now on
    if (k < 0) {
      k = static_cast<int>(state.size());
      state.push_back({v->name(), Tensor()});
    }
    const DType t = v->initializer().dtype();
    state[static_cast<size_t>(k)].value = value.dtype() == t ? std::move(value) : grad_util::convert(value, t);
  }

  static void clear_saved(Step& st) {
    st.saved_in.clear();
    st.saved_out.clear();
    st.stash.clear();
    st.ran = false;
  }

  void backward(const std::vector<Tensor>& output_grads) {
    if (!have_forward) fail_internal("Autograd::backward called without a forward pass");
    rt::cpu::DeterministicBlas deterministic(options.amp == Amp::Off);
    have_forward = false;
    if (output_grads.size() != output_slots.size())
      fail_internal("Autograd::backward: {} output gradients for {} outputs", output_grads.size(), output_slots.size());
    std::vector<Tensor> grad(slot_values.size());
    for (size_t i = 0; i < output_slots.size(); ++i) {
      if (!output_grads[i].defined()) continue;
      const int s = output_slots[i];
      const Tensor& out = env[static_cast<size_t>(s)];
      if (output_grads[i].shape() != out.shape())
        fail_input("gradient of output '{}' has shape {}, the output has {}", output_names[i],
                   shape_str(output_grads[i].shape()), shape_str(out.shape()));
      Tensor g = grad_util::convert(output_grads[i], slot_dtype[static_cast<size_t>(s)]);
      if (dev) g = dev->upload(g, output_names[i], "output gradient");
      accumulate(grad, s, std::move(g));
    }
    env.clear();  // graph outputs and constants; saved values live in the steps
    low_cache.clear();

    for (size_t k = steps.size(); k-- > 0;) {
      Step& st = steps[k];
      if (!st.backward || !st.ran) continue;
      bool any = false;
      for (int s : st.outputs)
        if (s >= 0 && grad[static_cast<size_t>(s)].defined()) any = true;
      if (any) {
        if (dev) dev->timed(st.node->op_type + " (backward)", [&] { run_backward_step_device(st, grad); });
        else run_backward_step(st, grad);
      }
      for (int s : st.outputs)
        if (s >= 0) grad[static_cast<size_t>(s)] = Tensor();
      clear_saved(st);
    }
    if (options.input_grads) {
      input_grad_values.clear();
      for (int s : input_slots)
        input_grad_values.push_back(dev ? dev->download(grad[static_cast<size_t>(s)], slot_values[static_cast<size_t>(s)]->name(), "input gradient")
                                        : grad[static_cast<size_t>(s)]);
    }
    step_peak = host_peak_bytes() > step_base ? host_peak_bytes() - step_base : 0;
  }

  // The step's CPU backward kernel on host tensors (float32 or float64): the input gradients.
  std::vector<Tensor> cpu_backward(Step& st, std::vector<Tensor> ins, std::vector<Tensor> outs, std::vector<Tensor> gouts) {
    const ir::Node& n = *st.node;
    GradContext ctx(n, st.opset, pool);
    ctx.set_training(options.training);
    const size_t ni = st.inputs.size();
    ctx.mutable_inputs() = std::move(ins);
    ctx.mutable_outputs() = std::move(outs);
    ctx.mutable_grad_outputs() = std::move(gouts);
    ctx.mutable_stash() = st.stash;
    ctx.mutable_input_shapes() = st.in_shapes;
    ctx.mutable_output_shapes() = st.out_shapes;
    ctx.mutable_input_present() = st.present;
    auto& dtypes = ctx.mutable_input_dtypes();
    dtypes.resize(ni);
    for (size_t i = 0; i < ni; ++i) {
      const DType t = st.seen_dtype[i];
      dtypes[i] = (t == DType::Float16 || t == DType::BFloat16) ? DType::Float32 : t;
    }
    ctx.mutable_wanted() = st.wanted;
    ctx.mutable_grads().resize(ni);
    try {
      st.gdef->fn(ctx);
    } catch (const Error& e) {
      const std::string label = n.label();
      if (std::string(e.what()).find(label) != std::string::npos) throw;
      throw Error(e.kind(), label + " (backward): " + e.what());
    } catch (const std::bad_alloc&) {
      fail_input("{} (backward): out of memory", n.label());
    }
    std::vector<Tensor> g = std::move(ctx.mutable_grads());
    for (size_t i = 0; i < ni; ++i)
      if (st.wanted[i] && (i >= g.size() || !g[i].defined()))
        fail_internal("{} (backward): no gradient produced for input {}", n.label(), i);
    return g;
  }

  void run_backward_step(Step& st, std::vector<Tensor>& grad) {
    const size_t ni = st.inputs.size(), no = st.outputs.size();
    auto widen = [](const Tensor& t) { return t.defined() ? rt::widen_to_float32(t) : t; };
    std::vector<Tensor> ins(ni), outs(no), gouts(no);
    for (size_t i = 0; i < ni; ++i) ins[i] = widen(st.saved_in[i]);
    for (size_t j = 0; j < no; ++j) outs[j] = widen(st.saved_out[j]);
    for (size_t j = 0; j < no; ++j)
      if (st.outputs[j] >= 0) gouts[j] = widen(grad[static_cast<size_t>(st.outputs[j])]);
    std::vector<Tensor> g = cpu_backward(st, std::move(ins), std::move(outs), std::move(gouts));
    for (size_t i = 0; i < ni; ++i) {
      if (!st.wanted[i]) continue;
      const int s = st.inputs[i];
      // Through the autocast conversion: rounded to the type the kernel saw, then to the value's.
      Tensor gi = grad_util::convert(g[i], st.seen_dtype[i]);
      gi = grad_util::convert(gi, slot_dtype[static_cast<size_t>(s)]);
      accumulate(grad, s, std::move(gi));
    }
  }

  // Device mode: the node's backward through the backward runner, or its CPU backward kernel with
  // copies (logged once per op type).
  void run_backward_step_device(Step& st, std::vector<Tensor>& grad) {
    const ir::Node& n = *st.node;
    const size_t ni = st.inputs.size(), no = st.outputs.size();
    std::vector<Tensor> g;
    gpu::BackwardCall call;
    call.present = st.present;
    call.input_shapes = st.in_shapes;
    call.wanted = st.wanted;
    // FP16/BF16 values (mixed precision) go to the FP32 backward widened, as on the CPU.
    auto widen = [&](const Tensor& t) { return dev->widen(t, n.name, "mixed precision"); };
    call.inputs.resize(ni);
    for (size_t i = 0; i < ni; ++i) call.inputs[i] = widen(st.saved_in[i]);
    call.outputs.resize(no);
    for (size_t j = 0; j < no; ++j) call.outputs[j] = widen(st.saved_out[j]);
    call.grad_outputs.resize(no);
    for (size_t j = 0; j < no; ++j)
      if (st.outputs[j] >= 0) call.grad_outputs[j] = widen(grad[static_cast<size_t>(st.outputs[j])]);
    for (size_t i = 0; i < ni; ++i) {
      // A constant the autocast rounded no longer holds the initializer's values.
      const int s = st.inputs[i];
      const bool converted = s >= 0 && st.seen_dtype[i] != slot_dtype[static_cast<size_t>(s)];
      call.host_inputs.push_back(converted ? nullptr : host_constant(s));
    }
    call.stash = st.stash;
    call.training = options.training;
    bool on_device = true;
    for (const auto* list : {&call.inputs, &call.outputs, &call.grad_outputs, &call.stash})
      for (const Tensor& t : *list)
        if (t.defined() && !dev->on_device(t)) on_device = false;
    std::string reason = "a value it reads lives on the host";
    if (on_device) {
      try {
        g = gpu::run_backward_node(n, st.opset, call, *dev->runtime);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::Unsupported) throw;
        reason = e.what();
        on_device = false;
      }
    }
    if (!on_device) {
      dev->log->note(n.op_type + " (backward)", reason);
      std::vector<Tensor> ins(ni), outs(no), gouts(no);
      for (size_t i = 0; i < ni; ++i) ins[i] = dev->download(call.inputs[i], n.name, "saved input");
      for (size_t j = 0; j < no; ++j) outs[j] = dev->download(call.outputs[j], n.name, "saved output");
      for (size_t j = 0; j < no; ++j) gouts[j] = dev->download(call.grad_outputs[j], n.name, "gradient");
      for (Tensor& t : st.stash) t = dev->download(t, n.name, "stashed value");  // the CPU kernel reads it
      g = cpu_backward(st, std::move(ins), std::move(outs), std::move(gouts));
      for (Tensor& t : g) t = dev->upload(t, n.name, "gradient");
    }
    for (size_t i = 0; i < ni; ++i) {
      if (!st.wanted[i]) continue;
      if (i >= g.size() || !g[i].defined()) fail_internal("{} (backward): no gradient produced for input {}", n.label(), i);
      const int s = st.inputs[i];
      // Through the autocast conversion: rounded to the type the kernel saw, then to the value's.
      Tensor gi = dev->convert(g[i], st.seen_dtype[i], n.name, "mixed precision");
      gi = dev->convert(gi, slot_dtype[static_cast<size_t>(s)], n.name, "mixed precision");
      accumulate(grad, s, std::move(gi));
    }
  }

  void accumulate(std::vector<Tensor>& grad, int s, Tensor g) {
    const int p = param_of_slot[static_cast<size_t>(s)];
    if (p >= 0) {
      Parameter& param = params[static_cast<size_t>(p)];
      if (dev_params) {
        if (!dev->on_device(g)) g = dev->upload(g, param.name, "gradient");
        dev_params->accumulate_grad(static_cast<size_t>(p), std::move(g));  // kept, not copied, when no one else holds it
      } else grad_util::add_into(pool, param.grad, grad_util::convert(g, param.grad.dtype()));
      return;
    }
    if (!requires_grad[static_cast<size_t>(s)]) return;
    Tensor& acc = grad[static_cast<size_t>(s)];
    const std::string& name = slot_values[static_cast<size_t>(s)]->name();
    if (!acc.defined()) acc = std::move(g);
    else if (dev) acc = dev->add(dev->upload(acc, name, "gradient"), dev->upload(g, name, "gradient"), name);  // uploads only host values
    else acc = grad_util::add(pool, acc, g);
  }
};

Autograd::Autograd(const ir::Model& model, AutogradOptions options)
    : impl_(std::make_unique<Impl>(model, resolve_parameters(model, std::move(options)))) {}
Autograd::~Autograd() = default;

std::vector<Tensor> Autograd::forward(const rt::Feeds& feeds) { return impl_->forward(feeds); }
void Autograd::backward(const std::vector<Tensor>& output_grads) { impl_->backward(output_grads); }
std::vector<Parameter>& Autograd::parameters() {
  if (impl_->dev_params) impl_->dev_params->sync_host(/*will_modify=*/true);
  return impl_->params;
}
const std::vector<Parameter>& Autograd::parameters() const {
  if (impl_->dev_params) impl_->dev_params->sync_host(/*will_modify=*/false);
  return impl_->params;
}
DeviceUpdate* Autograd::device_update() { return impl_->dev_params.get(); }
Parameter* Autograd::find_parameter(const std::string& name) {
  for (Parameter& p : parameters())
    if (p.name == name) return &p;
  return nullptr;
}
std::vector<StateBuffer>& Autograd::state() { return impl_->state; }
const std::vector<StateBuffer>& Autograd::state() const { return impl_->state; }
const std::vector<Tensor>& Autograd::input_grads() const { return impl_->input_grad_values; }
const std::vector<std::string>& Autograd::output_names() const { return impl_->output_names; }
const ir::Graph& Autograd::graph() const { return *impl_->model.graph; }
rt::ThreadPool& Autograd::pool() { return impl_->pool; }
bool Autograd::training() const { return impl_->options.training; }
void Autograd::set_training(bool training) { impl_->options.training = training; }

void Autograd::zero_grad() {
  if (impl_->dev_params) impl_->dev_params->zero_grad();
  else
    for (Parameter& p : impl_->params) std::memset(p.grad.raw_data(), 0, p.grad.nbytes());
}

void Autograd::write_back(ir::Model& model) const {
  ir::Graph& g = *model.graph;
  auto store = [&](const std::string& name, const Tensor& t) {
    ir::Value* v = g.find(name);
    if (!v || !v->has_initializer()) fail_input("the model has no initializer '{}' to store a trained value in", name);
    if (v->initializer().shape() != t.shape())
      fail_input("initializer '{}' has shape {}, the trained value {}", name, shape_str(v->initializer().shape()),
                 shape_str(t.shape()));
    g.set_initializer(v, t.clone());
  };
  for (const Parameter& p : parameters()) store(p.name, p.value);
  for (const StateBuffer& b : impl_->state)
    if (b.value.defined()) store(b.name, b.value);
}

std::set<std::string> Autograd::device_fallbacks() const {
  return impl_->dev ? impl_->dev->log->ops() : std::set<std::string>{};
}

MemoryStats Autograd::memory() const {
  MemoryStats m;
  for (const Parameter& p : impl_->params) m.persistent_bytes += p.value.nbytes() + p.grad.nbytes();
  for (const StateBuffer& b : impl_->state) m.persistent_bytes += b.value.nbytes();
  m.peak_step_bytes = impl_->step_peak;
  return m;
}

}  // namespace mpq::train
