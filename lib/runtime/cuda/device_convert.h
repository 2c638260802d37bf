#pragma once
// Float type conversions of device tensors (FP32 <-> FP16 / BF16) through the shared ConvertBody
// (kernels/bodies/elementwise.cuh), bit-identical to core/half.h's. Used where a node with
// FP16/BF16 values computes in FP32 on the device, as runtime/low_precision.h's rule does on the
// CPU: by the CUDA graph runner (FP16/BF16 models) and the training engine's mixed precision
// (train/cuda/device_amp.h).
#include <string>
#include <vector>

#include "runtime/cuda/node_runner.h"

namespace mpq::rt::gpu {

// `t` (a device tensor) stored as `to`: FP32 <-> FP16 / BF16 (FP16 <-> BF16 through FP32); `t`
// itself when it already is `to` or is not a float tensor. Errors name `name` and `what`.
Tensor convert_on_device(KernelRuntime& rt, const Tensor& t, DType to, const std::string& name, const char* what);

// FP16 or BF16 device tensor widened to FP32; any other tensor as it is.
Tensor widen_on_device(KernelRuntime& rt, const Tensor& t, const std::string& name, const char* what);

// The low type of the first FP16/BF16 tensor in `ts` (defined ones), or Undefined.
DType first_low_type(const std::vector<Tensor>& ts);

// runtime/low_precision.h's rule for a node run by an FP32 plan on the device: the type its float
// outputs are rounded back to, the first FP16/BF16 input's (Undefined: none, or a Cast, which
// converts between the float types itself).
DType node_low_type(const ir::Node& node, const std::vector<Tensor>& inputs);

// Every FP32 tensor of `ts` rounded to `low` on the device (nothing when `low` is Undefined).
void narrow_outputs_on_device(KernelRuntime& rt, std::vector<Tensor>& ts, DType low, const std::string& name);

}  // namespace mpq::rt::gpu
