#pragma once
// The kernel interface. An op kernel is a pure function of its input tensors and the node's
// attributes: it allocates its outputs through the context and never keeps state between calls,
// so the executor can run it for inference, observers can see every output, and a backward pass
// can be paired with it for training.
#include <fmt/format.h>

#include <climits>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace mpq::rt {

enum class BackendKind { CPU = 0, CUDA = 1 };
const char* backend_name(BackendKind b);

class ThreadPool;

// Lets control-flow kernels (If, Loop, Scan) run a subgraph with the enclosing scope visible.
class SubgraphRunner {
 public:
  virtual ~SubgraphRunner() = default;
  // `inputs` bind to the subgraph's formal inputs in order; returns its outputs in order.
  virtual std::vector<Tensor> run_subgraph(const ir::Graph& graph, const std::vector<Tensor>& inputs) = 0;
};

class KernelContext {
 public:
  KernelContext(const ir::Node& node, int opset, ThreadPool& pool, SubgraphRunner* runner)
      : node_(node), opset_(opset), pool_(pool), runner_(runner) {}

  const ir::Node& node() const { return node_; }
  // Opset version of the node's domain imported by the model.
  int opset() const { return opset_; }
  ThreadPool& pool() { return pool_; }
  SubgraphRunner& subgraphs();

  size_t num_inputs() const { return inputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i] != nullptr; }
  // Fails with the node's name when the input is absent.
  const Tensor& input(size_t i) const;
  const Tensor* input_or_null(size_t i) const { return has_input(i) ? inputs_[i] : nullptr; }

  size_t num_outputs() const { return outputs_.size(); }
  // Whether the model uses output i (omitted optional outputs need not be computed).
  bool output_wanted(size_t i) const { return i < outputs_.size() && node_.output(i) != nullptr; }
  // Allocate output i (uninitialized host memory). Where the executor prefers a buffer for it of
  // this dtype and shape (a slice of a Concat's output: runtime/concat_in_place.h), that view.
  Tensor& alloc_output(size_t i, DType dtype, Shape shape);
  // Hand over a ready tensor (for example a reshaped view of an input). Inputs are never written,
  // except one that input_reusable says may become an output's buffer.
  void set_output(size_t i, Tensor t);
  // Whether input i's buffer may be written and handed over as an output (an in-place residual
  // sum): the executor marked this step as the value's last reader, the value is no graph input,
  // output, constant or kept extra value, it is read once by this node, and nothing else holds
  // the buffer now (no view, no observer's copy, no caller's feed).
  bool input_reusable(size_t i) const;
  Tensor& output(size_t i) { return outputs_.at(i); }

  // BadInput error prefixed with the node's label.
  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw Error(ErrorKind::BadInput, node_.label() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  [[noreturn]] void fail_unsupported(fmt::format_string<Args...> f, Args&&... args) const {
    throw Error(ErrorKind::Unsupported, node_.label() + ": " + fmt::format(f, std::forward<Args>(args)...));
  }

  // Used by the executor.
  std::vector<const Tensor*>& mutable_inputs() { return inputs_; }
  std::vector<Tensor>& mutable_outputs() { return outputs_; }
  void set_reusable(const std::vector<uint8_t>* per_input) { reusable_ = per_input; }
  void set_preferred_outputs(const std::vector<Tensor>* per_output) { preferred_ = per_output; }

 private:
  const ir::Node& node_;
  int opset_;
  ThreadPool& pool_;
  SubgraphRunner* runner_;
  std::vector<const Tensor*> inputs_;
  std::vector<Tensor> outputs_;
  const std::vector<uint8_t>* reusable_ = nullptr;  // per input: the plan allows reuse (input_reusable)
  const std::vector<Tensor>* preferred_ = nullptr;   // per output: a view alloc_output hands out
};

class OpKernel {
 public:
  virtual ~OpKernel() = default;
  virtual void compute(KernelContext& ctx) = 0;
};

using KernelFn = void (*)(KernelContext&);
// Builds a kernel for one node (parse attributes once here).
using KernelFactory = std::function<std::unique_ptr<OpKernel>(const ir::Node& node, int opset)>;

inline constexpr int kMaxOpset = INT_MAX;

struct KernelDef {
  std::string domain;  // "" for the default ONNX domain
  std::string op_type;
  int since = 1;             // first model opset this kernel serves
  int until = kMaxOpset;     // last model opset (inclusive)
  BackendKind backend = BackendKind::CPU;
  KernelFactory factory;
  // The kernel reads and writes float16/bfloat16 itself. Otherwise the executor runs it on
  // float32 copies of low-precision inputs and rounds its float outputs back (FP16 storage with
  // FP32 arithmetic inside one op, as FP16 hardware does with FP32 accumulation).
  bool native_low_precision = false;
};

class OpRegistry {
 public:
  // Rejects a second kernel for the same (domain, op, backend) whose opset range overlaps.
  void add(KernelDef def);
  // Convenience for stateless kernels that read attributes from ctx.node() on each call.
  void add_fn(const std::string& domain, const std::string& op_type, int since, int until, BackendKind backend,
              KernelFn fn, bool native_low_precision = false);
  const KernelDef* find(const std::string& domain, const std::string& op_type, int opset, BackendKind backend) const;
  std::vector<const KernelDef*> all() const;
  size_t size() const { return defs_.size(); }

  // The process-wide registry with every built-in kernel (filled by register_all on first use).
  static const OpRegistry& global();

 private:
  std::vector<std::unique_ptr<KernelDef>> defs_;
};

// Explicit list of every kernel family (runtime/cpu/register_all.cpp); no static-init magic.
void register_all(OpRegistry& registry);

}  // namespace mpq::rt
