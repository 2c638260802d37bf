#pragma once
// One node's backward on the device: given what a training engine kept from the node's forward
// (device tensors) and the gradients of its outputs, computes the gradients of the inputs it asks
// for with the shared backward bodies and the cuDNN / cuBLASLt backward entries, through a kernel
// table (runtime/cuda/node_runner.h's KernelRuntime). The derivatives are those of mpq's CPU
// backward kernels (lib/train/grads); tests/cuda/backward_runner_test.cpp runs every op below with
// the host kernel table and host memory against them, given exactly what the CPU engine keeps.
//
// Ops with a device backward: the unary ops of the forward planner (Relu, Sigmoid, Tanh, Exp, Log,
// Neg, Abs, Sqrt, Erf, Gelu, Reciprocal, HardSigmoid, HardSwish), Identity / Flatten / Reshape /
// Squeeze / Unsqueeze, Add / Sub / Mul / Div (numpy broadcasting), Concat, mpq::FakeQuant (the
// STE mask and LSQ's scale gradient) and mpq::FakeQuantBias, Conv (1-3-D, cuDNN backward-data and
// backward-filter; bias per channel), Gemm (alpha = beta = 1) and MatMul (equal batches, or a 2-D B),
// 2-D MaxPool / AveragePool, GlobalAveragePool / GlobalMaxPool, Softmax / LogSoftmax, Clip (bounds
// known on the host), ReduceSum / ReduceMean (axes known on the host), Transpose,
// LayerNormalization (over the last axis; statistics recomputed), Gather (through an inverse index
// built on the host from the downloaded indices), Slice, Pad
// (constant mode, pads >= 0), Expand, PRelu, Where, Resize (2-D nearest / linear, as the
// forward planner takes it) and BatchNormalization (from the stash of run_batchnorm_forward below). Anything else,
// or a case outside what the forward planner takes, throws Unsupported naming the node: the engine
// then runs the CPU backward kernel with explicit copies.
//
// Not yet run on a GPU (written after the H100 session; docs/gpu.md). The training engine's device
// mode (AutogradOptions::device = CUDA) calls it for every node on a gradient path.
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"
#include "runtime/cuda/node_runner.h"

namespace mpq::train::gpu {

using rt::gpu::KernelRuntime;

// What the engine kept from the node's forward. Vectors are per input / output of the node.
struct BackwardCall {
  std::vector<Tensor> inputs;              // saved forward inputs, device (undefined: not kept or omitted)
  std::vector<char> present;               // the node has input i
  std::vector<Shape> input_shapes;         // every present input's shape
  std::vector<const Tensor*> host_inputs;  // inputs known on the host (axes, shapes, Clip bounds), else null
  std::vector<Tensor> outputs;             // saved forward outputs, device
  std::vector<Tensor> grad_outputs;        // dL/dY_j, device (undefined: none reached output j)
  std::vector<char> wanted;                // dL/dX_i is wanted
  std::vector<Tensor> stash;               // what a training forward stashed (BatchNormalization: mean, inv std), device
  bool training = true;                    // the engine's mode (BatchNormalization: batch or running statistics)
};

// BatchNormalization's forward as the training engine runs it (train/grads/norm_grad.cpp's
// training forward): batch statistics in training, with the running mean and variance moved as
// PyTorch moves them (new device tensors), the running ones in eval; the mean and inverse std
// used are stashed for the backward. Unsupported (the engine then runs the CPU's) when a statistics
// output is wanted or the parameters are not one per channel.
struct BatchNormForward {
  Tensor y;
  std::vector<Tensor> stash;  // mean, inv std [C]
  Tensor new_mean, new_var;   // training only
};
BatchNormForward run_batchnorm_forward(const ir::Node& node, bool training, const std::vector<Tensor>& inputs,
                                       bool statistics_wanted, KernelRuntime& rt);

// dL/dX_i (device, FP32) for every wanted input, undefined elsewhere.
std::vector<Tensor> run_backward_node(const ir::Node& node, int opset, const BackwardCall& call, KernelRuntime& rt);

}  // namespace mpq::train::gpu
