#pragma once
// Internal helpers shared by the quantization kernels (quant.cpp, quant_gemm.cpp). The scalar
// ground truth for every formula here is lib/calib/quant_ref.{h,cpp}; tests compare bit for bit.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/cpu/common.h"

namespace mpq::rt::cpu::quant {

struct QRange {
  int32_t qmin;
  int32_t qmax;
};

// Integer types a QuantizeLinear may produce / a DequantizeLinear may read.
bool is_quant_int_type(DType t);  // int8, uint8, int16, uint16, int32, int4, uint4
bool is_float8(DType t);
QRange qrange_of(DType t);        // fails_internal for non-integer types

// All elements of an integer tensor (packed int4/uint4 included) widened to int32.
std::vector<int32_t> read_int32(const Tensor& t);
// Unpack / pack ONNX's 4-bit layout: element i lives in byte i/2, low nibble for even i.
void unpack_int4(const uint8_t* packed, int64_t n, bool is_signed, int8_t* out);
void pack_int4(const int8_t* values, int64_t n, uint8_t* packed);

// Every scale must be finite and > 0 (a zero scale would divide by zero, a negative one is
// meaningless for these ops); fails naming the node and the input.
void check_scales(const KernelContext& ctx, const float* scale, int64_t n, const char* what);
// A float32 (or, before executor widening, float) scale tensor as float values.
std::vector<float> read_scales(const KernelContext& ctx, const Tensor& t, const char* what);

// Magic-number rounding: for |v| <= 2^22, (v + 1.5 * 2^23) - 1.5 * 2^23 rounds v to the nearest
// integer with ties to even under the default rounding mode, and unlike nearbyint it vectorises
// with plain SSE2. Callers clamp v to the (small) integer range first. The project compiles in
// ISO C++ mode (-ffp-contract=off), so no multiply is fused into the addition.
inline constexpr float kRoundMagic = 12582912.0f;

// One element of mpq::FakeQuant (fake_quant.cpp) with one scale s and the range [lo, hi] =
// [qmin - zp, qmax - zp]: v = x / s, NaN to 0, clamped (the bounds are integers, so clamping
// before rounding equals clamping after), rounded half to even, times s; the pair quantize_run and
// dequantize computes. kWide: a bound beyond 2^22 (kMagicRoundLimit), where the magic-number
// rounding is not exact and nearbyint rounds. mpq::FusedConv's fused fake quantization
// (passes/fuse_conv_fake_quant) uses it too.
inline constexpr float kMagicRoundLimit = 4194304.0f;
inline bool fake_quant_wide(float lo, float hi) { return lo < -kMagicRoundLimit || hi > kMagicRoundLimit; }
template <bool kWide>
inline float fake_quantize_value(float x, float s, float lo, float hi) {
  float v = x / s;
  v = v != v ? 0.0f : v;
  v = v < lo ? lo : v;
  v = v > hi ? hi : v;
  // Both give +0 for a rounded zero: nearbyint keeps -0, so + 0.0f; the magic sum never yields -0.
  v = kWide ? std::nearbyint(v) + 0.0f : (v + kRoundMagic) - kRoundMagic;
  return v * s;
}

// y[i] = saturate(round_half_to_even(x[i] / scale) + zp), one scale for the run.
template <typename Q>
inline void quantize_run(const float* __restrict x, int64_t n, float scale, int32_t zp, QRange r, Q* __restrict y) {
  const float lo = static_cast<float>(r.qmin - zp), hi = static_cast<float>(r.qmax - zp);
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] / scale;
    v = v != v ? 0.0f : v;  // NaN -> the zero point
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    v = (v + kRoundMagic) - kRoundMagic;
    y[i] = static_cast<Q>(static_cast<int32_t>(v) + zp);
  }
}

// Same with a scale and zero point per element.
template <typename Q>
inline void quantize_run_vec(const float* __restrict x, int64_t n, const float* __restrict scale,
                             const int32_t* __restrict zp, QRange r, Q* __restrict y) {
  const float qmin = static_cast<float>(r.qmin), qmax = static_cast<float>(r.qmax);
  for (int64_t i = 0; i < n; ++i) {
    const float z = static_cast<float>(zp[i]);
    const float lo = qmin - z, hi = qmax - z;  // exact: small integers
    float v = x[i] / scale[i];
    v = v != v ? 0.0f : v;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    v = (v + kRoundMagic) - kRoundMagic;
    y[i] = static_cast<Q>(static_cast<int32_t>(v) + zp[i]);
  }
}

// y[i] = (q[i] - zp) * scale.
template <typename Q>
inline void dequantize_run(const Q* __restrict q, int64_t n, float scale, int32_t zp, float* __restrict y) {
  if constexpr (sizeof(Q) >= 4) {
    for (int64_t i = 0; i < n; ++i)
      y[i] = static_cast<float>(static_cast<int64_t>(q[i]) - static_cast<int64_t>(zp)) * scale;
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<int32_t>(q[i]) - zp) * scale;
  }
}

template <typename Q>
inline void dequantize_run_vec(const Q* __restrict q, int64_t n, const float* __restrict scale,
                               const int32_t* __restrict zp, float* __restrict y) {
  if constexpr (sizeof(Q) >= 4) {
    for (int64_t i = 0; i < n; ++i)
      y[i] = static_cast<float>(static_cast<int64_t>(q[i]) - static_cast<int64_t>(zp[i])) * scale[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<int32_t>(q[i]) - zp[i]) * scale[i];
  }
}

// Requantize int32 accumulators: y[i] = saturate(round_half_to_even(float(acc[i] + bias) * mult) + zp).
template <typename Q>
inline void requantize_run(const int32_t* __restrict acc, int64_t n, int32_t bias, float mult, int32_t zp, QRange r,
                           Q* __restrict y) {
  const float lo = static_cast<float>(r.qmin - zp), hi = static_cast<float>(r.qmax - zp);
  for (int64_t i = 0; i < n; ++i) {
    // Wrapping int32 addition, as ONNX Runtime's int32 arithmetic (no UB on overflow).
    const int32_t a = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) + static_cast<uint32_t>(bias));
    float v = static_cast<float>(a) * mult;
    v = v != v ? 0.0f : v;
    v = v < lo ? lo : v;
    v = v > hi ? hi : v;
    v = (v + kRoundMagic) - kRoundMagic;
    y[i] = static_cast<Q>(static_cast<int32_t>(v) + zp);
  }
}

// Run fn with the C++ storage type of an 8/16/32-bit quantized type.
template <typename F>
decltype(auto) visit_quant_storage(DType t, F&& f) {
  switch (t) {
    case DType::Int8: return f(TypeTag<int8_t>{});
    case DType::UInt8: return f(TypeTag<uint8_t>{});
    case DType::Int16: return f(TypeTag<int16_t>{});
    case DType::UInt16: return f(TypeTag<uint16_t>{});
    case DType::Int32: return f(TypeTag<int32_t>{});
    default: fail_unsupported("quantized element type {} is not supported here", dtype_name(t));
  }
}

// QLinearMatMul / MatMulInteger / QLinearConv / ConvInteger (quant_gemm.cpp).
void register_quant_gemm(OpRegistry& r);

}  // namespace mpq::rt::cpu::quant
