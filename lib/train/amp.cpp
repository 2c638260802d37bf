#include "train/amp.h"

#include "core/error.h"
#include "passes/precision_policy.h"

namespace mpq::train {

namespace precision = passes::precision;

const char* amp_name(Amp amp) {
  switch (amp) {
    case Amp::Off: return "off";
    case Amp::Fp16: return "fp16";
    case Amp::Bf16: return "bf16";
  }
  return "?";
}

Amp parse_amp(std::string_view name) {
  if (name == "off" || name == "fp32") return Amp::Off;
  if (name == "fp16") return Amp::Fp16;
  if (name == "bf16") return Amp::Bf16;
  fail_input("mixed precision must be fp16, bf16 or off, got '{}'", name);
}

DType amp_low_type(Amp amp) {
  if (amp == Amp::Fp16) return DType::Float16;
  if (amp == Amp::Bf16) return DType::BFloat16;
  return DType::Undefined;
}

namespace {

bool is_amp_float(DType t) { return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16; }

// Widest of two float types (FP32 above FP16/BF16; FP16 with BF16 gives FP32, as in PyTorch).
DType widest(DType a, DType b) {
  if (a == DType::Undefined) return b;
  if (b == DType::Undefined || a == b) return a;
  return DType::Float32;
}

}  // namespace

AutocastDecision autocast(const ir::Node& node, const std::vector<const Tensor*>& inputs, Amp amp) {
  AutocastDecision d;
  d.cast_input.assign(inputs.size(), 0);
  if (amp == Amp::Off) return d;
  const DType low = amp_low_type(amp);
  const std::string& op = node.op_type;
  if (node.domain.empty() && (op == "Shape" || op == "Size" || op == "Cast" || op == "CastLike")) return d;

  std::vector<size_t> floats;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i] && is_amp_float(inputs[i]->dtype()) && !precision::input_stays_fp32(op, i)) floats.push_back(i);
  if (floats.empty()) return d;

  switch (precision::policy_class(node.domain, op, low)) {
    case precision::OpClass::Low: d.compute = low; break;
    case precision::OpClass::Fp32: d.compute = DType::Float32; break;
    case precision::OpClass::Follow: {
      if (node.domain.empty() && op == "BatchNormalization") {
        // Data in its own type, statistics and affine parameters in FP32: nothing to convert.
        return d;
      }
      DType t = DType::Undefined;
      for (size_t i : floats)
        if (inputs[i]->numel() > 1) t = widest(t, inputs[i]->dtype());
      if (t == DType::Undefined)  // only single-element operands: the widest of them
        for (size_t i : floats) t = widest(t, inputs[i]->dtype());
      d.compute = t;
      break;
    }
  }
  for (size_t i : floats) {
    const bool scalar_follower =
        precision::policy_class(node.domain, op, low) == precision::OpClass::Follow && inputs[i]->numel() <= 1;
    if (inputs[i]->dtype() != d.compute && !scalar_follower) d.cast_input[i] = 1;
  }
  return d;
}

}  // namespace mpq::train
