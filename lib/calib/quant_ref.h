#pragma once
// Scalar reference implementation of every quantization primitive: the ground truth that the fast
// CPU kernels (lib/runtime/cpu/quant*.cpp) and the CUDA kernels are tested against bit for bit.
// Written for clarity, not speed; nothing here depends on the FPU rounding mode.
//
// Conventions (ONNX, and ONNX Runtime bit for bit):
//   quantize(x)   = saturate(round_half_to_even(x / scale) + zero_point)   (a true division)
//   dequantize(q) = (q - zero_point) * scale                                (in float32)
// NaN quantizes to the zero point (so it dequantizes to 0); +-inf saturate to qmax / qmin.
#include <cstdint>

namespace mpq::calib {

// Nearest integer, ties to even (2.5 -> 2, 3.5 -> 4, -2.5 -> -2). NaN and +-inf are returned as is.
float round_half_to_even(float x);

// The integer range of a quantized type ([-128, 127] for int8, [0, 255] for uint8, ...).
struct QRange {
  int32_t qmin;
  int32_t qmax;
};
inline constexpr QRange kInt8Range{-128, 127};
inline constexpr QRange kUInt8Range{0, 255};
inline constexpr QRange kInt16Range{-32768, 32767};
inline constexpr QRange kUInt16Range{0, 65535};
inline constexpr QRange kInt4Range{-8, 7};
inline constexpr QRange kUInt4Range{0, 15};

// saturate(round_half_to_even(x / scale) + zero_point) into [qmin, qmax].
int32_t quantize_ref(float x, float scale, int32_t zero_point, int32_t qmin, int32_t qmax);
// (q - zero_point) * scale, the difference taken exactly (int64) and converted to float once.
float dequantize_ref(int32_t q, float scale, int32_t zero_point);
// dequantize_ref(quantize_ref(x, ...), ...).
float fake_quantize_ref(float x, float scale, int32_t zero_point, int32_t qmin, int32_t qmax);

// Backward of fake quantization (quantization-aware training). With v = x / scale and
// q = round_half_to_even(v) + zero_point before saturation:
//  - the straight-through estimator passes the gradient where qmin <= q <= qmax and blocks it where
//    the value was clipped;
//  - LSQ (Esser et al., "Learned Step Size Quantization") differentiates y = (sat(q) - zp) * scale
//    by the scale with round() treated as identity: round(v) - v inside the range, qmin - zp below
//    it, qmax - zp above it; the sum over the elements sharing a scale is multiplied by
//    1 / sqrt(N * Qp), N those elements and Qp = qmax - zero_point, so the step size learns at the
//    pace of the weights.
bool fake_quantize_passes_ref(float x, float scale, int32_t zero_point, int32_t qmin, int32_t qmax);
float fake_quantize_scale_slope_ref(float x, float scale, int32_t zero_point, int32_t qmin, int32_t qmax);
double lsq_grad_scale_ref(int64_t elements_per_scale, int32_t zero_point, int32_t qmax);

// Requantization of an int32 accumulator (QLinearConv / QLinearMatMul):
// saturate(round_half_to_even(float(acc) * multiplier) + zero_point), with
// multiplier = in_scale * weight_scale / out_scale computed in float32 in that order.
float requant_multiplier_ref(float in_scale, float weight_scale, float out_scale);
int32_t requantize_ref(int32_t acc, float multiplier, int32_t zero_point, int32_t qmin, int32_t qmax);

// Per-axis variants over a buffer viewed as [outer, channels, inner]: element (o, c, i) uses
// scale[c] and zero_point[c] (zero_point may be nullptr: all zeros). channels == 1 is per-tensor.
void quantize_per_axis_ref(const float* x, int64_t outer, int64_t channels, int64_t inner, const float* scale,
                           const int32_t* zero_point, int32_t qmin, int32_t qmax, int32_t* q);
void dequantize_per_axis_ref(const int32_t* q, int64_t outer, int64_t channels, int64_t inner, const float* scale,
                             const int32_t* zero_point, float* y);
void fake_quantize_per_axis_ref(const float* x, int64_t outer, int64_t channels, int64_t inner, const float* scale,
                                const int32_t* zero_point, int32_t qmin, int32_t qmax, float* y);

// Blocked variants (ONNX opset 21 block_size) over [outer, channels, inner]: element (o, c, i)
// uses the parameters at (o, c / block_size, i) of a [outer, ceil(channels / block_size), inner]
// scale (and zero_point, may be nullptr) buffer.
void quantize_blocked_ref(const float* x, int64_t outer, int64_t channels, int64_t inner, int64_t block_size,
                          const float* scale, const int32_t* zero_point, int32_t qmin, int32_t qmax, int32_t* q);
void dequantize_blocked_ref(const int32_t* q, int64_t outer, int64_t channels, int64_t inner, int64_t block_size,
                            const float* scale, const int32_t* zero_point, float* y);

}  // namespace mpq::calib
