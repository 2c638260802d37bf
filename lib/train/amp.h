#pragma once
// Automatic mixed precision for training, as PyTorch's autocast does it, with the op classes of
// the precision policy table that `mpq convert` uses (passes/precision_policy.h):
//  - "low" ops (Conv, ConvTranspose, Gemm, MatMul, ...) run in FP16/BF16: their float inputs are
//    cast down (weights from their FP32 master copies, once per forward);
//  - "fp32" ops (Softmax, norms, Exp/Log/Pow, large reductions, losses) run in FP32: low inputs are
//    cast up;
//  - the others follow their inputs; mixed inputs take the widest type. Single-element constants
//    (0.5, eps, sqrt(2)) do not take part, as Python scalars do not in PyTorch's type promotion, and
//    BatchNormalization takes its data input's type with FP32 statistics, as cuDNN's does.
// Every op still computes in FP32 inside and rounds its outputs to its type (runtime/low_precision.h),
// so underflow and overflow happen where they would on a GPU.
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"

namespace mpq::train {

enum class Amp { Off, Fp16, Bf16 };

const char* amp_name(Amp amp);  // "off", "fp16", "bf16"
// Parses "off" / "fp16" / "bf16" (BadInput otherwise).
Amp parse_amp(std::string_view name);
// Float16 or BFloat16 (Undefined for Off).
DType amp_low_type(Amp amp);

struct AutocastDecision {
  DType compute = DType::Undefined;  // Undefined: run the node as its inputs are
  std::vector<char> cast_input;      // inputs to convert to `compute`
};

// The type a node runs in under `amp` and the inputs that must be converted to it. `inputs` are
// the node's input values (nullptr for omitted ones).
AutocastDecision autocast(const ir::Node& node, const std::vector<const Tensor*>& inputs, Amp amp);

}  // namespace mpq::train
