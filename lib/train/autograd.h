#pragma once
// Reverse-mode automatic differentiation over an ir::Graph.
//
// forward() runs the graph with the forward kernels of the executor's registry, keeping only what
// the backward kernels of the nodes on a gradient path asked for (GradDef::saved_*); every other
// value is released after its last forward reader, as in the executor. backward() walks those
// nodes in reverse topological order, accumulating gradients where a value fans out, and releases
// each saved value and gradient as soon as its last backward user has run. Nodes off every path
// from a trainable parameter to the loss (shape arithmetic, constants) get no gradient work; an op
// without a backward kernel on such a path is an error naming the node, raised when the engine is
// built.
//
// Parameters are owned FP32 (or float64) master copies of the model's initializers that the
// optimizers update in place; write_back() stores them (and BatchNormalization's running
// statistics) into a model. Under mixed precision (train/amp.h) the forward uses low-precision
// copies made once per forward, and gradients reach the masters through the same casts, rounded to
// the low type on the way, as PyTorch's autocast does.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"
#include "runtime/executor.h"
#include "train/amp.h"
#include "train/grad_registry.h"

namespace mpq::cuda {
struct OpsTable;
}
namespace mpq::rt::gpu {
struct DeviceMemoryBackend;
}

namespace mpq::train {

class DeviceUpdate;

struct AutogradOptions {
  int threads = 0;  // <= 0: one per hardware thread
  Amp amp = Amp::Off;
  // Training mode: BatchNormalization normalises with batch statistics and updates its running
  // statistics. Off: the frozen (eval-mode) affine form.
  bool training = true;
  // Initializer names to train; empty selects default_trainable() unless default_parameters is off.
  std::vector<std::string> trainable;
  bool default_parameters = true;
  // Also compute gradients of the (float) graph inputs, for tests.
  bool input_grads = false;
  // CPU, AMP off: LayerNorm and GELU as exporters write them before opsets 17 and 20 (nine and
  // five nodes) train as one mpq::LayerNormalization / mpq::Gelu node each, forward and backward
  // (passes/fuse_layer_norm.h, fuse_gelu.h), on a copy of the model; parameter names, inputs and
  // outputs are unchanged. Off: every node as written (tests compare the two).
  bool fuse = true;
  const rt::OpRegistry* kernels = nullptr;  // nullptr: rt::OpRegistry::global()
  const GradRegistry* grads = nullptr;      // nullptr: GradRegistry::global()
  // BackendKind::CUDA: forward and backward on the GPU (the CUDA plugin's context; with
  // MPQ_CUDA_EMULATE=host its host kernel table and host memory). Each node runs its planned
  // kernel (runtime/cuda/node_runner.h; BatchNormalization's training forward through
  // train/cuda/backward_runner.h's run_batchnorm_forward) and its backward through
  // train/cuda/backward_runner.h,
  // activations and gradients stay in device memory; a node either cannot take runs its CPU
  // kernel with explicit copies. Parameters and their gradients live in device memory too
  // (train/cuda/device_parameters.h), updated there through device_update(); parameters() is a
  // host mirror synchronised on access. FP32 only (amp must be off).
  rt::BackendKind device = rt::BackendKind::CPU;
  // Tests: a kernel table and memory in place of the plugin's (both or neither).
  const cuda::OpsTable* cuda_ops = nullptr;
  rt::gpu::DeviceMemoryBackend* cuda_memory = nullptr;
};

struct Parameter {
  std::string name;
  Tensor value;  // master copy, updated in place by the optimizers
  Tensor grad;   // same type and shape; accumulates over backward() calls until zero_grad()
};

// Running state a training forward updates (BatchNormalization's running mean and variance).
struct StateBuffer {
  std::string name;
  Tensor value;
};

struct MemoryStats {
  size_t persistent_bytes = 0;  // parameters, gradients and running state
  size_t peak_step_bytes = 0;   // largest activation + gradient memory during the last step
};

// The float initializers a training run updates unless told otherwise: those that reach a
// differentiable input of a node (through Identity, Reshape, Transpose, ...), leaving out
// single-element constants (eps, 0.5, sqrt(2)) unless they are the weight or bias of a
// Conv/ConvTranspose/Gemm/MatMul or the scale or bias of a normalisation.
std::vector<std::string> default_trainable(const ir::Model& model, const GradRegistry& grads = GradRegistry::global());

class Autograd {
 public:
  // The model must outlive the engine and must not change while it exists.
  explicit Autograd(const ir::Model& model, AutogradOptions options = {});
  ~Autograd();
  Autograd(const Autograd&) = delete;
  Autograd& operator=(const Autograd&) = delete;

  // Runs the forward pass and returns the graph outputs (in their computed type: FP16/BF16 under
  // mixed precision when a low-precision op produced them).
  std::vector<Tensor> forward(const rt::Feeds& feeds);
  // Backpropagates gradients of the graph outputs (one per output in order; an undefined tensor
  // means none) through the last forward, accumulating into the parameters' gradients.
  void backward(const std::vector<Tensor>& output_grads);

  // In device mode these bring the host copies up to date (a download when the device changed
  // them); the non-const forms also mark the host copies as changed, so the next device use uploads
  // them. A training loop keeps off them and goes through device_update().
  std::vector<Parameter>& parameters();
  const std::vector<Parameter>& parameters() const;
  // Device mode: where the optimizer, GradScaler and clipping update the parameters in device
  // memory (train/device_update.h). Null on the CPU.
  DeviceUpdate* device_update();
  Parameter* find_parameter(const std::string& name);
  std::vector<StateBuffer>& state();
  const std::vector<StateBuffer>& state() const;
  // Gradients of the graph inputs after backward() (with options.input_grads), in input order.
  const std::vector<Tensor>& input_grads() const;
  void zero_grad();
  // Stores the current parameters and running state into `model`'s initializers (by name).
  void write_back(ir::Model& model) const;

  MemoryStats memory() const;
  // Device mode: the op types that ran on the CPU with copies ("Op" for a forward, "Op (backward)"
  // for a backward), each logged once. Empty on the CPU.
  std::set<std::string> device_fallbacks() const;
  const std::vector<std::string>& output_names() const;
  // The graph the engine runs: the model's own, or its copy with LayerNorm and GELU fused
  // (AutogradOptions::fuse).
  const ir::Graph& graph() const;
  rt::ThreadPool& pool();
  bool training() const;
  void set_training(bool training);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace mpq::train
