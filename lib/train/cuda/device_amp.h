#pragma once
// Mixed precision on the CUDA path of the training engine (AutogradOptions::device == CUDA with
// amp fp16/bf16), with the CPU engine's semantics (train/amp.h, runtime/low_precision.h): autocast
// converts a node's inputs to the type it runs in; a node with FP16/BF16 inputs computes in FP32
// inside (its inputs widened, the FP32 device kernels, its float outputs rounded back to the low
// type), so underflow and overflow happen where the CPU engine and a GPU show them. Activations
// and the values kept for the backward are stored in the low type; parameters stay FP32 masters.
// The conversions are the shared ConvertBody (kernels/bodies/elementwise.cuh), bit-identical to
// core/half.h's.
#include <string>

#include "runtime/cuda/node_runner.h"

namespace mpq::train::gpu {

// `t` (a device tensor) stored as `to`: FP32 <-> FP16 / BF16 (FP16 <-> BF16 through FP32); `t`
// itself when it already is `to` or is not a float tensor. Errors name `name` and `what`.
Tensor convert_on_device(rt::gpu::KernelRuntime& rt, const Tensor& t, DType to, const std::string& name, const char* what);

// FP16 or BF16 device tensor widened to FP32; any other tensor as it is.
Tensor widen_on_device(rt::gpu::KernelRuntime& rt, const Tensor& t, const std::string& name, const char* what);

// The low type of the first FP16/BF16 tensor in `ts` (defined ones), or Undefined.
DType first_low_type(const std::vector<Tensor>& ts);

}  // namespace mpq::train::gpu
