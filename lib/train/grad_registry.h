#pragma once
// Backward kernels. A backward kernel is the gradient of one op family: given the forward node,
// the forward values it asked to keep and the gradients of the node's outputs, it computes the
// gradients of the inputs the engine asks for. Like forward kernels (runtime/kernel.h) they are
// pure functions, registered once per (domain, op, opset range, backend) in a registry that rejects
// duplicates, listed explicitly in register_all_grads() (train/grads/register_all_grads.cpp).
//
// Numbers: every floating-point tensor a backward kernel sees has one type, float32 or float64
// (float64 serves the finite-difference gradient checks). The engine widens FP16/BF16 values and
// gradients to float32 before the call and rounds the input gradients back afterwards, exactly as
// the executor does for forward kernels, so a kernel is written once for float and double.
#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "ir/graph.h"
#include "runtime/kernel.h"

namespace mpq::rt {
class ThreadPool;
}

namespace mpq::train {

constexpr uint32_t bit(int i) { return uint32_t{1} << i; }
inline constexpr uint32_t kAllInputs = 0xffffffffu;
// Whether input/output i is in a mask; kAllInputs covers every index (Concat, Split with many).
constexpr bool in_mask(uint32_t mask, size_t i) { return mask == kAllInputs || (i < 32 && ((mask >> i) & 1u)); }

class GradContext {
 public:
  GradContext(const ir::Node& node, int opset, rt::ThreadPool& pool) : node_(node), opset_(opset), pool_(pool) {}

  const ir::Node& node() const { return node_; }
  int opset() const { return opset_; }
  rt::ThreadPool& pool() { return pool_; }

  // ---- forward values
  size_t num_inputs() const { return in_shapes_.size(); }
  // The node has input i (not omitted).
  bool has_input(size_t i) const { return i < in_present_.size() && in_present_[i]; }
  // A forward input the op's GradDef saves (fails naming the node otherwise).
  const Tensor& input(size_t i) const;
  // Shapes and types of every present input and output are always known, saved or not.
  const Shape& input_shape(size_t i) const;
  DType input_dtype(size_t i) const;
  size_t num_outputs() const { return out_shapes_.size(); }
  const Tensor& output(size_t i) const;
  const Shape& output_shape(size_t i) const;
  // Tensors the op's training forward stashed for its backward (BatchNormalization's batch mean and
  // inverse standard deviation).
  const std::vector<Tensor>& stash() const { return stash_; }

  // ---- gradients
  // dL/dY_i reached output i (outputs that do not lead to the loss have none).
  bool has_grad_output(size_t i) const { return i < grad_out_.size() && grad_out_[i].defined(); }
  const Tensor& grad_output(size_t i) const;
  // The engine wants dL/dX_i.
  bool needs_grad(size_t i) const { return i < wanted_.size() && wanted_[i]; }
  // dL/dX_i: same shape as input i and the float type of the call. Ignored when not wanted.
  void set_grad(size_t i, Tensor g);
  // True while the forward ran in training mode (batch statistics for BatchNormalization).
  bool training() const { return training_; }

  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw Error(ErrorKind::BadInput, node_.label() + " (backward): " + fmt::format(f, std::forward<Args>(args)...));
  }
  template <typename... Args>
  [[noreturn]] void fail_unsupported(fmt::format_string<Args...> f, Args&&... args) const {
    throw Error(ErrorKind::Unsupported, node_.label() + " (backward): " + fmt::format(f, std::forward<Args>(args)...));
  }

  // ---- filled by the engine (and by tests that drive a backward kernel directly)
  std::vector<Tensor>& mutable_inputs() { return inputs_; }
  std::vector<Tensor>& mutable_outputs() { return outputs_; }
  std::vector<Tensor>& mutable_grad_outputs() { return grad_out_; }
  std::vector<Tensor>& mutable_grads() { return grads_; }
  std::vector<Tensor>& mutable_stash() { return stash_; }
  std::vector<Shape>& mutable_input_shapes() { return in_shapes_; }
  std::vector<DType>& mutable_input_dtypes() { return in_dtypes_; }
  std::vector<char>& mutable_input_present() { return in_present_; }
  std::vector<Shape>& mutable_output_shapes() { return out_shapes_; }
  std::vector<char>& mutable_wanted() { return wanted_; }
  void set_training(bool t) { training_ = t; }

 private:
  const ir::Node& node_;
  int opset_;
  rt::ThreadPool& pool_;
  bool training_ = false;
  std::vector<Tensor> inputs_, outputs_, grad_out_, grads_, stash_;
  std::vector<Shape> in_shapes_, out_shapes_;
  std::vector<DType> in_dtypes_;
  std::vector<char> in_present_, wanted_;
};

using GradFn = void (*)(GradContext&);

// A forward that replaces the inference kernel while training (BatchNormalization with batch
// statistics). It computes the node's outputs, may stash tensors for its backward, and may hand
// back new values for constant inputs that are running state (the running mean and variance).
class TrainForwardContext {
 public:
  TrainForwardContext(rt::KernelContext& kernel, bool training) : kernel_(kernel), training_(training) {}
  rt::KernelContext& kernel() { return kernel_; }
  bool training() const { return training_; }
  std::vector<Tensor>& stash() { return stash_; }
  // New value for input i (the engine stores it when input i is a running-state initializer).
  void update_state(size_t i, Tensor value) { updates_.emplace_back(i, std::move(value)); }
  std::vector<std::pair<size_t, Tensor>>& updates() { return updates_; }

 private:
  rt::KernelContext& kernel_;
  bool training_;
  std::vector<Tensor> stash_;
  std::vector<std::pair<size_t, Tensor>> updates_;
};
using TrainForwardFn = void (*)(TrainForwardContext&);

struct GradDef {
  std::string domain;  // "" for the default ONNX domain
  std::string op_type;
  int since = 1;
  int until = rt::kMaxOpset;
  rt::BackendKind backend = rt::BackendKind::CPU;
  GradFn fn = nullptr;
  // Inputs that can carry a gradient (bit i = input i). The others (shapes, axes, indices, Resize
  // scales, Clip bounds, Pow exponents, running statistics) never get one.
  uint32_t differentiable = 0;
  // Forward values the backward reads (bit i = input / output i). Everything else is released as
  // soon as the forward no longer needs it.
  uint32_t saved_inputs = 0;
  uint32_t saved_outputs = 0;
  // Optional forward used while training instead of the inference kernel.
  TrainForwardFn train_forward = nullptr;
};

class GradRegistry {
 public:
  // Rejects a second backward for the same (domain, op, backend) whose opset range overlaps.
  void add(GradDef def);
  const GradDef* find(const std::string& domain, const std::string& op_type, int opset, rt::BackendKind backend) const;
  std::vector<const GradDef*> all() const;
  size_t size() const { return defs_.size(); }
  // Every built-in backward kernel (filled by register_all_grads on first use).
  static const GradRegistry& global();

 private:
  std::vector<std::unique_ptr<GradDef>> defs_;
};

// Explicit list of every backward family (train/grads/register_all_grads.cpp).
void register_all_grads(GradRegistry& registry);

}  // namespace mpq::train
