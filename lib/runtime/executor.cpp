#include "runtime/executor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "core/half.h"
#include "runtime/batch_rows.h"
#include "runtime/concat_in_place.h"
#include "runtime/shape_value_cache.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/cuda/context.h"
#include "runtime/cuda/graph_runner.h"
#include "runtime/low_precision.h"
#include "runtime/thread_pool.h"

namespace mpq::rt {

namespace {

struct Step {
  const ir::Node* node = nullptr;
  const KernelDef* def = nullptr;
  std::unique_ptr<OpKernel> kernel;
  int opset = 0;
  std::vector<int> inputs;   // slot per node input, -1 for omitted
  std::vector<int> outputs;  // slot per node output, -1 for omitted
  std::vector<int> release;  // slots whose last reader is this step
  // Per input: its value dies here, is read once by this node and is no graph input or constant,
  // so a kernel may reuse its buffer (KernelContext::input_reusable checks the rest at run time).
  std::vector<uint8_t> reusable;
};

struct GraphPlan {
  const ir::Graph* graph = nullptr;
  std::unordered_map<std::string, int> slot_of;
  std::vector<const ir::Value*> slot_values;
  std::vector<Step> steps;
  std::vector<int> input_slots;   // graph inputs in order
  std::vector<int> output_slots;  // graph outputs in order
  std::vector<int> outer_slots;   // values read from enclosing scopes
  std::vector<std::pair<int, Tensor>> constants;  // initializers (incl. overridable input defaults)
};

int domain_opset(const ir::Model& model, const std::string& domain) {
  int64_t v = model.opset(domain);
  if (v == 0 && domain.empty()) v = 1;
  if (v == 0) v = 1;
  return static_cast<int>(v);
}

}  // namespace

struct Executor::Impl : SubgraphRunner {
  const ir::Model& model;
  ExecOptions options;
  const OpRegistry& registry;
  ThreadPool pool;
  std::unordered_map<const ir::Graph*, std::unique_ptr<GraphPlan>> plans;
  Observer* observer = nullptr;
  // set_profiling: calls and seconds per step of the top-level graph's plan (grouped by op type
  // only when profile() is asked, so that the timed loop does no string or map work).
  bool profiling = false;
  std::vector<std::pair<int64_t, double>> step_times;

  // Whole-graph batch splitting (runtime/batch_rows.h): whether the graph keeps rows apart, decided
  // at the first batch that could be split (-1 until then), and one single-thread executor per
  // part, made then.
  int rows_split = -1;
  std::vector<std::unique_ptr<Executor>> row_executors;

  // The top-level graph's Concats that its producers may write in place (runtime/concat_in_place.h).
  InPlaceConcats concats;
  // The top-level graph's values computed from shapes, kept between runs
  // (runtime/shape_value_cache.h); empty where the option is off.
  ShapeValueCache shape_values;
  static constexpr size_t kMaxSplitWeightBytes = size_t{128} << 20;  // over all the parts' copies

  // Runtime scope chain for subgraphs.
  struct Frame {
    const GraphPlan* plan;
    std::vector<Tensor>* env;
    const Frame* parent;
  };
  const Frame* current = nullptr;

  Impl(const ir::Model& m, const ExecOptions& o)
      : model(m), options(o), registry(o.registry ? *o.registry : OpRegistry::global()), pool(o.threads) {
    const GraphPlan& top = plan_graph(*model.graph);
    // The top-level plan's steps, for the in-place Concats and the kept shape values. The backend
    // is always CPU here (a CUDA Executor gives its CPU fallbacks this Impl), and run_steps runs the
    // top-level graph only where the whole model runs on the CPU.
    std::vector<const ir::Node*> nodes;
    std::vector<std::vector<int>> ins, outs;
    for (const Step& step : top.steps) {
      nodes.push_back(step.node);
      ins.push_back(step.inputs);
      outs.push_back(step.outputs);
    }
    if (options.concat_in_place && concat_in_place_enabled())
      concats.plan(nodes, ins, outs, top.slot_values.size(), top.output_slots);
    if (options.shape_value_cache && shape_value_cache_enabled())
      shape_values.plan(nodes, ins, outs, top.slot_values.size(), top.constants, top.output_slots);
  }

  // Runs the batch in parts, part k on pool thread k by its own single-thread executor, and joins
  // the outputs; false, having run nothing, where the graph or the feed does not allow it. Each
  // part's rows are copied on the thread that convolves them, so they start in its core's cache.
  bool run_by_rows(const Feeds& feeds, std::vector<Tensor>& out) {
    const int threads = pool.size();
    // Inside a parallel loop the parts would run one after the other on this thread.
    if (threads < 2 || !options.split_rows || options.backend != BackendKind::CPU || !batch_split_enabled() ||
        cpu::deterministic_blas() || ThreadPool::inside_parallel_loop())
      return false;
    if (feeds.size() != model.graph->inputs().size()) return false;
    int64_t rows = -1;
    for (const auto& [name, t] : feeds) {
      if (t.rank() == 0 || t.dtype() == DType::String || (rows >= 0 && t.shape()[0] != rows)) return false;
      rows = t.shape()[0];
    }
    const std::vector<int64_t> parts = row_parts(rows, threads);
    if (parts.empty()) return false;
    if (rows_split < 0) {
      std::string why;
      rows_split = rows_independent(model, &why) ? 1 : 0;
      // Each part's executor keeps its own copy of what the kernels derive from the weights
      // (oneDNN's reordered weights): past this size, the convolutions' own split, which shares
      // one copy, costs less memory.
      size_t weight_bytes = 0;
      for (ir::Value* v : model.graph->initializers()) weight_bytes += v->initializer().nbytes();
      if (rows_split && weight_bytes * parts.size() > kMaxSplitWeightBytes) {
        rows_split = 0;
        why = fmt::format("{} MiB of weights would be kept once per thread", weight_bytes >> 20);
      }
      if (!rows_split) spdlog::debug("batches run whole: {}", why);
    }
    if (!rows_split) return false;
    if (row_executors.size() != parts.size()) {
      row_executors.clear();
      ExecOptions one = options;
      one.threads = 1;
      for (size_t k = 0; k < parts.size(); ++k) row_executors.push_back(std::make_unique<Executor>(model, one));
    }
    std::vector<std::vector<Tensor>> results(parts.size());
    try {
      pool.run_per_thread(static_cast<int>(parts.size()), [&](int task) {
        const auto k = static_cast<size_t>(task);
        int64_t begin = 0;
        for (size_t j = 0; j < k; ++j) begin += parts[j];
        Feeds part;
        for (const auto& [name, t] : feeds) part.emplace(name, slice_rows(t, begin, parts[k]));
        results[k] = row_executors[k]->run(part);
      });
      out.clear();
      const auto& outputs = model.graph->outputs();
      for (size_t o = 0; o < outputs.size(); ++o) {
        std::vector<Tensor> pieces;
        for (const auto& r : results) pieces.push_back(r[o]);
        out.push_back(concat_rows(pieces, fmt::format("output '{}'", outputs[o]->name())));
      }
    } catch (const std::exception&) {
      // A part's error would name the part's shapes; the whole batch, run next, fails with its own.
      // A kernel that takes the whole batch but not a part of it (a parameter shaped like the
      // batch that the rules above did not see) would fail on every call: stop splitting.
      rows_split = 0;
      out.clear();
      return false;
    }
    note_row_split();
    return true;
  }

  const GraphPlan& plan_graph(const ir::Graph& g) {
    auto it = plans.find(&g);
    if (it != plans.end()) return *it->second;
    auto plan = std::make_unique<GraphPlan>();
    plan->graph = &g;
    auto slot = [&](const ir::Value* v) {
      auto [pos, inserted] = plan->slot_of.emplace(v->name(), static_cast<int>(plan->slot_values.size()));
      if (inserted) plan->slot_values.push_back(v);
      return pos->second;
    };
    for (ir::Value* v : g.values()) slot(v);
    for (ir::Value* v : g.inputs()) plan->input_slots.push_back(slot(v));
    for (ir::Value* v : g.outputs()) plan->output_slots.push_back(slot(v));
    for (ir::Value* v : g.initializers()) plan->constants.emplace_back(slot(v), v->initializer());
    for (ir::Value* v : g.values())
      if (v->is_outer_scope()) plan->outer_slots.push_back(slot(v));

    // Nodes in the stored order must already be topological (import and passes keep it so);
    // verify rather than silently reorder a graph the caller holds.
    std::vector<char> ready(plan->slot_values.size(), 0);
    for (ir::Value* v : g.values())
      if (v->is_graph_input() || v->has_initializer() || v->is_outer_scope()) ready[static_cast<size_t>(slot(v))] = 1;

    std::vector<int> last_reader(plan->slot_values.size(), -1);
    for (const auto& np : g.nodes()) {
      const ir::Node& n = *np;
      Step step;
      step.node = &n;
      step.opset = domain_opset(model, n.domain);
      step.def = registry.find(n.domain, n.op_type, step.opset, options.backend);
      if (!step.def) {
        fail_unsupported("{}: operator {}{} (opset {}) is not supported on {}", n.label(),
                         n.domain.empty() ? "" : n.domain + "::", n.op_type, step.opset, backend_name(options.backend));
      }
      step.kernel = step.def->factory(n, step.opset);
      const int index = static_cast<int>(plan->steps.size());
      for (ir::Value* v : n.inputs()) {
        if (!v) {
          step.inputs.push_back(-1);
          continue;
        }
        int s = slot(v);
        if (!ready[static_cast<size_t>(s)])
          fail_input("{}: reads '{}' before it is computed (graph is not in topological order)", n.label(), v->name());
        step.inputs.push_back(s);
        last_reader[static_cast<size_t>(s)] = index;
      }
      // Values the node's subgraphs read from this scope stay alive until the node has run.
      for (ir::Graph* sub : n.subgraphs()) {
        for (const std::string& name : ir::outer_references(*sub)) {
          auto found = plan->slot_of.find(name);
          if (found != plan->slot_of.end()) last_reader[static_cast<size_t>(found->second)] = index;
        }
        plan_graph(*sub);
      }
      for (ir::Value* v : n.outputs()) {
        if (!v) {
          step.outputs.push_back(-1);
          continue;
        }
        int s = slot(v);
        step.outputs.push_back(s);
        ready[static_cast<size_t>(s)] = 1;
      }
      plan->steps.push_back(std::move(step));
    }
    std::set<int> keep(plan->output_slots.begin(), plan->output_slots.end());
    for (size_t s = 0; s < last_reader.size(); ++s) {
      if (last_reader[s] >= 0 && !keep.count(static_cast<int>(s)))
        plan->steps[static_cast<size_t>(last_reader[s])].release.push_back(static_cast<int>(s));
    }
    // Outputs nobody reads are released right after they are produced.
    for (size_t i = 0; i < plan->steps.size(); ++i)
      for (int s : plan->steps[i].outputs)
        if (s >= 0 && last_reader[static_cast<size_t>(s)] < 0 && !keep.count(s)) plan->steps[i].release.push_back(s);
    std::set<int> not_reusable(plan->input_slots.begin(), plan->input_slots.end());
    not_reusable.insert(plan->outer_slots.begin(), plan->outer_slots.end());
    for (const auto& c : plan->constants) not_reusable.insert(c.first);
    for (Step& step : plan->steps) {
      step.reusable.assign(step.inputs.size(), 0);
      for (size_t i = 0; i < step.inputs.size(); ++i) {
        const int s = step.inputs[i];
        if (s < 0 || not_reusable.count(s) || std::count(step.inputs.begin(), step.inputs.end(), s) != 1) continue;
        if (std::find(step.release.begin(), step.release.end(), s) != step.release.end()) step.reusable[i] = 1;
      }
    }
    const GraphPlan& ref = *plan;
    plans.emplace(&g, std::move(plan));
    return ref;
  }

  const Tensor* lookup_outer(const std::string& name, const Frame* frame) const {
    for (const Frame* f = frame; f; f = f->parent) {
      auto it = f->plan->slot_of.find(name);
      if (it == f->plan->slot_of.end()) continue;
      const Tensor& t = (*f->env)[static_cast<size_t>(it->second)];
      if (t.defined()) return &t;
      const ir::Value* v = f->plan->slot_values[static_cast<size_t>(it->second)];
      if (!v->is_outer_scope()) return nullptr;
    }
    return nullptr;
  }

  void run_steps(const GraphPlan& plan, std::vector<Tensor>& env, const std::set<int>* keep_extra, bool observe) {
    Frame frame{&plan, &env, current};
    const Frame* saved = current;
    current = &frame;
    struct Restore {
      const Frame*& cur;
      const Frame* saved;
      ~Restore() { cur = saved; }
    } restore{current, saved};

    // The contexts' input and output lists, kept across steps so that a step allocates neither.
    std::vector<const Tensor*> ins_store;
    std::vector<Tensor> outs_store;
    const bool top_level = plan.graph == model.graph.get();
    const bool in_place = top_level && !concats.empty();
    const bool kept_values = top_level && !shape_values.empty();
    std::vector<Tensor> preferred;
    if (in_place) concats.begin_run();
    for (const Step& step : plan.steps) {
      KernelContext ctx(*step.node, step.opset, pool, this);
      auto& ins = ctx.mutable_inputs();
      ins.swap(ins_store);
      ins.assign(step.inputs.size(), nullptr);
      for (size_t i = 0; i < step.inputs.size(); ++i) {
        int s = step.inputs[i];
        if (s < 0) continue;
        const Tensor& t = env[static_cast<size_t>(s)];
        if (!t.defined())
          fail_internal("{}: input '{}' has no value at run time", step.node->label(), plan.slot_values[static_cast<size_t>(s)]->name());
        ins[i] = &t;
      }
      ctx.mutable_outputs().swap(outs_store);
      ctx.mutable_outputs().resize(step.outputs.size());
      std::vector<uint8_t> reusable_here;  // only with kept extra values: those are not reusable
      if (!keep_extra) {
        ctx.set_reusable(&step.reusable);
      } else {
        reusable_here = step.reusable;
        for (size_t i = 0; i < reusable_here.size(); ++i)
          if (reusable_here[i] && keep_extra->count(step.inputs[i])) reusable_here[i] = 0;
        ctx.set_reusable(&reusable_here);
      }
      const bool timed = profiling && top_level;
      const size_t step_index = static_cast<size_t>(&step - plan.steps.data());
      // A step the plan found computing from shapes stays out of the in-place Concats even once it
      // is no longer kept, so that those decisions never change between runs.
      const bool planned = kept_values && shape_values.planned_step(static_cast<int>(step_index));
      const bool kept = planned && shape_values.kept_step(static_cast<int>(step_index));
      const int concat = in_place && !planned ? concats.concat_at(static_cast<int>(step_index)) : -1;
      const auto t0 = timed ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      try {
        if (kept && shape_values.reuse(static_cast<int>(step_index), ins, ctx.mutable_outputs())) {
          // The same shapes (and sizes computed from them) as when these outputs were kept.
        } else {
          if (!planned && in_place && concats.prefer_outputs(static_cast<int>(step_index), step.outputs, preferred))
            ctx.set_preferred_outputs(&preferred);
          if (concat >= 0 && concats.try_join(concat, ins, ctx.mutable_outputs()[0])) {
            // Every input already sits in its slice of the output.
          } else if (!step.def->native_low_precision && any_low_precision(ins)) {
            run_in_float32(*step.kernel, ctx);
          } else {
            step.kernel->compute(ctx);
          }
          if (kept) shape_values.remember(static_cast<int>(step_index), ins, ctx.mutable_outputs());
        }
        if (concat >= 0) concats.remember(concat, ins, ctx.mutable_outputs()[0]);
        // An unused view would keep the Concat's buffer owned twice (no in-place Z into it).
        preferred.clear();
        if (timed) {
          if (step_times.size() != plan.steps.size()) step_times.assign(plan.steps.size(), {0, 0.0});
          auto& [calls, seconds] = step_times[step_index];
          ++calls;
          seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
      } catch (const Error& e) {
        std::string label = step.node->label();
        if (std::string(e.what()).find(label) != std::string::npos) throw;
        throw Error(e.kind(), label + ": " + e.what());
      } catch (const std::bad_alloc&) {
        fail_input("{}: out of memory", step.node->label());
      } catch (const std::exception& e) {
        fail_internal("{}: {}", step.node->label(), e.what());
      }
      auto& outs = ctx.mutable_outputs();
      for (size_t i = 0; i < step.outputs.size(); ++i) {
        int s = step.outputs[i];
        if (s < 0) continue;
        if (!outs[i].defined()) fail_internal("{}: kernel did not produce output {}", step.node->label(), i);
        env[static_cast<size_t>(s)] = std::move(outs[i]);
        if (observe && observer && *observer) (*observer)(*plan.slot_values[static_cast<size_t>(s)], env[static_cast<size_t>(s)]);
      }
      for (int s : step.release)
        if (!keep_extra || !keep_extra->count(s)) env[static_cast<size_t>(s)] = Tensor();
      outs.clear();  // moved-from tensors; the capacity stays
      outs_store.swap(outs);
      ins_store.swap(ins);
    }
  }

  std::vector<Tensor> run_subgraph(const ir::Graph& g, const std::vector<Tensor>& inputs) override {
    const GraphPlan& plan = plan_graph(g);
    std::vector<Tensor> env(plan.slot_values.size());
    for (const auto& [s, t] : plan.constants) env[static_cast<size_t>(s)] = t;
    if (inputs.size() > plan.input_slots.size())
      fail_input("subgraph '{}' takes {} inputs, got {}", g.name, plan.input_slots.size(), inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) env[static_cast<size_t>(plan.input_slots[i])] = inputs[i];
    for (int s : plan.outer_slots) {
      const std::string& name = plan.slot_values[static_cast<size_t>(s)]->name();
      const Tensor* t = lookup_outer(name, current);
      if (!t) fail_input("subgraph '{}': outer value '{}' is not available", g.name, name);
      env[static_cast<size_t>(s)] = *t;
    }
    run_steps(plan, env, nullptr, false);
    std::vector<Tensor> out;
    for (int s : plan.output_slots) {
      if (!env[static_cast<size_t>(s)].defined())
        fail_input("subgraph '{}': output '{}' was not computed", g.name, plan.slot_values[static_cast<size_t>(s)]->name());
      out.push_back(env[static_cast<size_t>(s)]);
    }
    return out;
  }
};

// BackendKind::CUDA: the plugin's context (stream, caching allocator) or, in tests, a given kernel
// table and memory; the initializers' device copies are kept across runs.
struct Executor::CudaPath {
  std::unique_ptr<gpu::CudaContext> context;            // the plugin (GPU)
  std::unique_ptr<gpu::CachingAllocator> test_allocator;  // ExecOptions::cuda_memory (tests)
  std::unique_ptr<gpu::KernelRuntime> runtime;
  gpu::FallbackLog own_log;
  gpu::FallbackLog* log = &own_log;
  std::unordered_map<const ir::Value*, Tensor> constants;

  bool whole_model_on_cpu = false;  // the runner does not take subgraphs (If/Loop/Scan) yet

  explicit CudaPath(const ExecOptions& o) {
    if ((o.cuda_ops == nullptr) != (o.cuda_memory == nullptr))
      fail_internal("ExecOptions: cuda_ops and cuda_memory go together");
    if (o.cuda_ops) {
      test_allocator = std::make_unique<gpu::CachingAllocator>(*o.cuda_memory);
      runtime.reset(new gpu::KernelRuntime{*o.cuda_ops, *test_allocator, *o.cuda_memory, nullptr});
    } else {
      context = std::make_unique<gpu::CudaContext>();
      runtime.reset(new gpu::KernelRuntime{context->ops(), context->allocator(), context->backend(), context->stream()});
      runtime->staging = &context->staging();
      log = &context->fallbacks();
    }
    runtime->plan.allow_tf32 = o.allow_tf32;
  }
  ~CudaPath() {
    constants.clear();  // device buffers go back before the allocator and stream do
    runtime.reset();
  }
};

Executor::Executor(const ir::Model& model, ExecOptions options) : model_(model), options_(options) {
  if (options.backend == BackendKind::CUDA) {
    cuda_ = std::make_unique<CudaPath>(options);
    // CPU kernels for the nodes the CUDA path hands back (and for pool()).
    options.backend = BackendKind::CPU;
  }
  impl_ = std::make_unique<Impl>(model, options);
  if (cuda_) {
    cuda_->runtime->cpu_pool = &impl_->pool;
    for (const auto& n : model.graph->nodes())
      if (!n->subgraphs().empty()) {
        cuda_->whole_model_on_cpu = true;
        spdlog::warn("{}: the CUDA path does not run subgraphs (If/Loop/Scan) yet; this model runs on the CPU",
                     n->label());
        break;
      }
  }
  for (ir::Value* v : model.graph->inputs()) input_names_.push_back(v->name());
  for (ir::Value* v : model.graph->outputs()) output_names_.push_back(v->name());
}

Executor::~Executor() = default;

ThreadPool& Executor::pool() { return impl_->pool; }

std::vector<OpTime> Executor::profile(bool by_node) const {
  std::map<std::string, OpTime> by_op;
  std::vector<OpTime> out;
  const GraphPlan& plan = impl_->plan_graph(*model_.graph);
  for (size_t i = 0; i < impl_->step_times.size() && i < plan.steps.size(); ++i) {
    const auto& [calls, seconds] = impl_->step_times[i];
    if (calls == 0) continue;
    const ir::Node& n = *plan.steps[i].node;
    const std::string op = n.domain.empty() ? n.op_type : n.domain + "::" + n.op_type;
    if (by_node) {
      out.push_back(OpTime{op, n.name.empty() ? fmt::format("#{}", i) : n.name, calls, seconds});
      continue;
    }
    OpTime& t = by_op[op];
    t.op = op;
    t.calls += calls;
    t.seconds += seconds;
  }
  for (const auto& [op, t] : by_op) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.seconds > b.seconds; });
  return out;
}

void Executor::clear_profile() { impl_->step_times.clear(); }

void Executor::set_profiling(bool on) { impl_->profiling = on; }

void Executor::check_feeds(const Feeds& feeds) const { rt::check_feeds(*model_.graph, feeds); }

void check_feeds(const ir::Graph& g, const Feeds& feeds) {
  for (ir::Value* v : g.inputs()) {
    auto it = feeds.find(v->name());
    if (it == feeds.end()) {
      if (v->has_initializer()) continue;
      fail_input("no data for model input '{}' ({})", v->name(), v->type.str());
    }
    const Tensor& t = it->second;
    const ir::ValueType& vt = v->type;
    if (!vt.is_tensor()) continue;
    if (vt.elem != DType::Undefined && t.dtype() != vt.elem)
      fail_input("input '{}': model expects {}, data is {}{}", v->name(), vt.str(), dtype_name(t.dtype()),
                 shape_str(t.shape()));
    if (vt.has_shape) {
      if (static_cast<size_t>(t.rank()) != vt.dims.size())
        fail_input("input '{}': model expects rank {} ({}), data has shape {}", v->name(), vt.dims.size(), vt.str(),
                   shape_str(t.shape()));
      for (size_t i = 0; i < vt.dims.size(); ++i)
        if (vt.dims[i].known() && vt.dims[i].value != t.shape()[i])
          fail_input("input '{}': model expects {}, data has shape {}", v->name(), vt.str(), shape_str(t.shape()));
    }
  }
  for (const auto& [name, t] : feeds) {
    ir::Value* v = g.find(name);
    if (!v || !v->is_graph_input()) fail_input("data names '{}', which is not an input of the model", name);
  }
}

std::vector<Tensor> Executor::run(const Feeds& feeds) { return run(feeds, {}, nullptr); }

std::vector<Tensor> Executor::run(const Feeds& feeds, const std::vector<std::string>& extra_values,
                                  std::vector<Tensor>* extra_out) {
  if (cuda_ && !cuda_->whole_model_on_cpu) {  // run_graph checks the feeds itself
    gpu::GraphRunHooks hooks;
    hooks.observer = &observer_;
    hooks.extra_values = extra_values;
    hooks.extra_out = extra_out;
    hooks.constants = &cuda_->constants;
    return gpu::run_graph(model_, feeds, *cuda_->runtime, *cuda_->log, nullptr, &hooks);
  }
  check_feeds(feeds);
  // A batch whose rows the graph keeps apart runs as one part per thread (runtime/batch_rows.h),
  // unless something watches the whole run: an observer, the profile, kept values.
  std::vector<Tensor> joined;
  if (extra_values.empty() && !extra_out && !observer_ && !impl_->profiling && impl_->run_by_rows(feeds, joined))
    return joined;
  const GraphPlan& plan = impl_->plan_graph(*model_.graph);
  std::vector<Tensor> env(plan.slot_values.size());
  for (const auto& [s, t] : plan.constants) env[static_cast<size_t>(s)] = t;
  impl_->observer = &observer_;
  for (int s : plan.input_slots) {
    const ir::Value* v = plan.slot_values[static_cast<size_t>(s)];
    auto it = feeds.find(v->name());
    if (it != feeds.end()) env[static_cast<size_t>(s)] = it->second;
    if (observer_ && env[static_cast<size_t>(s)].defined()) observer_(*v, env[static_cast<size_t>(s)]);
  }
  std::set<int> keep;
  for (const std::string& name : extra_values) {
    auto it = plan.slot_of.find(name);
    if (it == plan.slot_of.end()) fail_input("no value named '{}' in the model", name);
    keep.insert(it->second);
  }
  impl_->current = nullptr;
  impl_->run_steps(plan, env, keep.empty() ? nullptr : &keep, true);
  // A result that shares a kept value's buffer (a view of it, or the value itself as an extra
  // value) goes to the caller as a copy: what the caller writes must not reach a later run.
  auto handed_out = [&](const Tensor& t) {
    return !impl_->shape_values.empty() && t.numel() <= ShapeValueCache::kMaxValues && impl_->shape_values.shares_buffer(t)
               ? t.clone()
               : t;
  };
  std::vector<Tensor> out;
  for (int s : plan.output_slots) {
    if (!env[static_cast<size_t>(s)].defined())
      fail_input("output '{}' was not computed", plan.slot_values[static_cast<size_t>(s)]->name());
    out.push_back(handed_out(env[static_cast<size_t>(s)]));
  }
  if (extra_out) {
    extra_out->clear();
    for (const std::string& name : extra_values)
      extra_out->push_back(handed_out(env[static_cast<size_t>(plan.slot_of.at(name))]));
  }
  return out;
}

namespace {
void collect_unsupported(const ir::Model& model, const ir::Graph& g, BackendKind backend, std::set<std::string>& out) {
  const OpRegistry& reg = OpRegistry::global();
  for (const auto& n : g.nodes()) {
    int opset = domain_opset(model, n->domain);
    if (!reg.find(n->domain, n->op_type, opset, backend))
      out.insert(n->domain.empty() ? n->op_type : n->domain + "::" + n->op_type);
    for (ir::Graph* sub : n->subgraphs()) collect_unsupported(model, *sub, backend, out);
  }
}
}  // namespace

std::vector<std::string> unsupported_ops(const ir::Model& model, BackendKind backend) {
  std::set<std::string> out;
  collect_unsupported(model, *model.graph, backend, out);
  return {out.begin(), out.end()};
}

}  // namespace mpq::rt
