#include "passes/precision_policy.h"

#include <algorithm>
#include <unordered_map>

namespace mpq::passes::precision {

const char* op_class_name(OpClass c) {
  switch (c) {
    case OpClass::Low: return "low";
    case OpClass::Fp32: return "fp32";
    case OpClass::Follow: return "follow";
  }
  return "?";
}

namespace {

constexpr OpClass L = OpClass::Low;
constexpr OpClass F = OpClass::Fp32;
constexpr OpClass W = OpClass::Follow;

// Grouped by theme; the order is the order --list-policy prints.
const std::vector<PolicyEntry> kTable = {
    // Tensor-core work: the reason to convert at all. Accumulation is FP32 on real hardware.
    {"Conv", L, L, "tensor-core convolution, FP32 accumulation"},
    {"ConvTranspose", L, L, "tensor-core convolution, FP32 accumulation"},
    {"MatMul", L, L, "tensor-core GEMM, FP32 accumulation"},
    {"Gemm", L, L, "tensor-core GEMM, FP32 accumulation"},
    {"Einsum", L, L, "contraction, like MatMul"},
    {"LSTM", L, L, "gate GEMMs; states are bounded by tanh/sigmoid"},
    {"GRU", L, L, "gate GEMMs; states are bounded by tanh/sigmoid"},
    {"RNN", L, L, "gate GEMMs; states are bounded by tanh"},

    // Range: overflow or underflow FP16's 5-bit exponent (max 65504); BF16 has FP32's range.
    {"Exp", F, W, "e^x overflows FP16 above x = 11.09"},
    {"Pow", F, W, "x^2 overflows FP16 from |x| = 256"},
    {"Reciprocal", F, W, "1/x overflows FP16 below |x| = 1.5e-5"},
    {"Log", F, W, "inputs below 6.1e-5 are FP16 subnormals: log loses its accuracy"},
    {"Softplus", F, W, "log(1 + e^x): exp inside"},
    {"ReduceMean", F, W, "the sum behind the mean can overflow FP16 accumulation"},
    {"Cosh", F, W, "overflows FP16 above |x| = 11.8"},
    {"Sinh", F, W, "overflows FP16 above |x| = 11.8"},
    {"Tan", F, W, "unbounded near pi/2"},
    {"Acos", F, W, "steep near +-1 (autocast keeps it in FP32)"},
    {"Asin", F, W, "steep near +-1 (autocast keeps it in FP32)"},
    {"Acosh", F, W, "autocast keeps it in FP32"},
    {"Asinh", F, W, "autocast keeps it in FP32"},
    {"Atanh", F, W, "steep near +-1 (autocast keeps it in FP32)"},

    // Precision: exponentials of logits, statistics over many elements, long sums.
    {"Softmax", F, F, "exp and a sum over the axis; probabilities need FP32"},
    {"LogSoftmax", F, F, "exp and a sum over the axis; log-probabilities need FP32"},
    {"LayerNormalization", F, F, "mean and variance over the feature axis"},
    {"GroupNormalization", F, F, "mean and variance over each group"},
    {"InstanceNormalization", F, F, "mean and variance over each channel"},
    {"MeanVarianceNormalization", F, F, "mean and variance"},
    {"LpNormalization", F, F, "sum of powers"},
    {"LRN", F, F, "sum of squares over neighbouring channels"},
    {"ReduceSum", F, F, "long accumulation"},
    {"ReduceProd", F, F, "products of many values"},
    {"ReduceL1", F, F, "long accumulation"},
    {"ReduceL2", F, F, "sum of squares"},
    {"ReduceSumSquare", F, F, "sum of squares"},
    {"ReduceLogSum", F, F, "long accumulation, then log"},
    {"ReduceLogSumExp", F, F, "exp and a long accumulation"},
    {"CumSum", F, F, "running sum grows with the length"},
    {"LpPool", F, F, "sum of powers over the window"},
    {"GlobalLpPool", F, F, "sum of powers over the plane"},
    {"Det", F, F, "products of many values"},
    {"NegativeLogLikelihoodLoss", F, F, "loss: long reduction"},
    {"SoftmaxCrossEntropyLoss", F, F, "loss: softmax and a long reduction"},

    // Structure: indices, coordinates and counts that FP16 cannot hold exactly.
    {"Range", F, F, "start + i*delta: FP16 integers are exact only to 2048"},
    {"TopK", F, F, "ordering of near-equal values must match FP32 (indices are outputs)"},
    {"NonMaxSuppression", F, F, "box coordinates and scores (float only in ONNX)"},
    {"RoiAlign", F, F, "region coordinates in pixels"},
    {"MaxRoiPool", F, F, "region coordinates in pixels"},
    {"GridSample", F, F, "sampling coordinates in [-1, 1] lose sub-pixel accuracy"},
    {"AffineGrid", F, F, "sampling coordinates"},
    {"DFT", F, F, "long sums of rotated values"},
    {"STFT", F, F, "long sums of rotated values"},
    {"MelWeightMatrix", F, F, "filter bank generator"},
    {"QuantizeLinear", F, F, "scales and zero points must stay exact"},
    {"DequantizeLinear", F, F, "scales must stay exact"},
    {"DynamicQuantizeLinear", F, F, "scales must stay exact"},
    {"RandomNormal", F, F, "generator: output type given by attribute"},
    {"RandomUniform", F, F, "generator: output type given by attribute"},
    {"RandomNormalLike", F, F, "generator: output type given by attribute or input"},
    {"RandomUniformLike", F, F, "generator: output type given by attribute or input"},
    {"Bernoulli", F, F, "generator: output type given by attribute or input"},
    {"Multinomial", F, F, "generator: sampling from probabilities"},
    {"EyeLike", F, F, "generator: output type given by attribute or input"},

    // Follow the inputs: element-wise math, activations, pooling, data movement.
    {"Resize", W, W, "data follows its input; roi and scales stay FP32"},
    {"Upsample", W, W, "data follows its input; scales stay FP32"},
    {"BatchNormalization", W, W, "inference BN is an affine map"},
    {"Add", W, W, "element-wise"},
    {"Sub", W, W, "element-wise"},
    {"Mul", W, W, "element-wise"},
    {"Div", W, W, "element-wise"},
    {"Sqrt", W, W, "element-wise, range-reducing"},
    {"Relu", W, W, "activation"},
    {"LeakyRelu", W, W, "activation"},
    {"PRelu", W, W, "activation"},
    {"Elu", W, W, "activation (exp of negative inputs only)"},
    {"Selu", W, W, "activation (exp of negative inputs only)"},
    {"Celu", W, W, "activation (exp of negative inputs only)"},
    {"Sigmoid", W, W, "bounded activation"},
    {"HardSigmoid", W, W, "bounded activation"},
    {"HardSwish", W, W, "activation"},
    {"Tanh", W, W, "bounded activation"},
    {"Erf", W, W, "bounded activation"},
    {"Gelu", W, W, "activation"},
    {"Mish", W, W, "activation"},
    {"Clip", W, W, "element-wise"},
    {"MaxPool", W, W, "selects values"},
    {"AveragePool", W, W, "window mean, bounded by its inputs"},
    {"GlobalAveragePool", W, W, "plane mean, bounded by its inputs"},
    {"GlobalMaxPool", W, W, "selects values"},
    {"ReduceMax", W, W, "selects values"},
    {"ReduceMin", W, W, "selects values"},
    {"Concat", W, W, "data movement"},
    {"Reshape", W, W, "data movement"},
    {"Transpose", W, W, "data movement"},
    {"Slice", W, W, "data movement"},
    {"Gather", W, W, "data movement"},
    {"Flatten", W, W, "data movement"},
    {"Squeeze", W, W, "data movement"},
    {"Unsqueeze", W, W, "data movement"},
    {"Split", W, W, "data movement"},
    {"Pad", W, W, "data movement"},
    {"Expand", W, W, "data movement"},
    {"Tile", W, W, "data movement"},
    {"Identity", W, W, "data movement"},
    {"Where", W, W, "selects values"},
    {"Cast", W, W, "retargeted: casts to float32 produce whatever precision their consumers need"},
    {"Shape", W, W, "reads only the shape: never gets a Cast"},
    {"Size", W, W, "reads only the shape: never gets a Cast"},
};

}  // namespace

const std::vector<PolicyEntry>& policy_table() { return kTable; }

const PolicyEntry* policy_entry(std::string_view op) {
  static const std::unordered_map<std::string_view, const PolicyEntry*> index = [] {
    std::unordered_map<std::string_view, const PolicyEntry*> m;
    for (const PolicyEntry& e : kTable) m.emplace(e.op, &e);
    return m;
  }();
  auto it = index.find(op);
  return it == index.end() ? nullptr : it->second;
}

OpClass policy_class(std::string_view domain, std::string_view op, DType low) {
  if (!domain.empty()) return OpClass::Fp32;
  const PolicyEntry* e = policy_entry(op);
  if (!e) return OpClass::Follow;
  return low == DType::BFloat16 ? e->bf16 : e->fp16;
}

bool input_stays_fp32(std::string_view op, size_t index) {
  if (op == "Resize") return index == 1 || index == 2;
  if (op == "Upsample") return index == 1;
  if (op == "RoiAlign") return index == 1;
  if (op == "Dropout") return index == 1;
  if (op == "NonMaxSuppression") return index == 0 || index == 1 || index == 4;
  if (op == "GridSample") return index == 1;
  return false;
}

bool inputs_pinned_fp32(std::string_view op) {
  return op == "RandomNormalLike" || op == "RandomUniformLike" || op == "Bernoulli" || op == "EyeLike" ||
         op == "Multinomial";
}

double low_max(DType low) { return low == DType::BFloat16 ? 3.3895313892515355e38 : 65504.0; }

const char* low_suffix(DType low) { return low == DType::BFloat16 ? "bf16" : "fp16"; }

}  // namespace mpq::passes::precision
