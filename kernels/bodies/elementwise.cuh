#pragma once
// Elementwise kernel bodies: unary ops over a flat index, binary ops with numpy broadcasting.
// (nvcc only: see kernels/params.h.)
#include "kernels/hd.h"

namespace mpq::cuda {

MPQ_HD inline float unary_apply(UnaryOp op, float x, float alpha = 0.0f, float beta = 0.0f) {
  switch (op) {
    case UnaryOp::Relu: return x > 0.0f ? x : 0.0f;
    case UnaryOp::Sigmoid: return 1.0f / (1.0f + expf(-x));
    case UnaryOp::Tanh: return tanhf(x);
    case UnaryOp::Exp: return expf(x);
    case UnaryOp::Log: return logf(x);
    case UnaryOp::Neg: return -x;
    case UnaryOp::Abs: return fabsf(x);
    case UnaryOp::Sqrt: return sqrtf(x);
    case UnaryOp::Erf: return erff(x);
    case UnaryOp::Gelu: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case UnaryOp::Reciprocal: return 1.0f / x;
    case UnaryOp::Identity: return x;
    // NaN stays NaN, as on the CPU (fminf/fmaxf would return the bound).
    case UnaryOp::HardSigmoid: return hd_isnan(x) ? x : fmaxf(0.0f, fminf(1.0f, alpha * x + beta));
    case UnaryOp::HardSwish: return x * fmaxf(0.0f, fminf(1.0f, alpha * x + beta));
  }
  return x;
}

MPQ_HD inline float binary_apply(BinaryOp op, float a, float b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    // NaN propagates, as in ONNX Max/Min.
    case BinaryOp::Max: return hd_isnan(a) || hd_isnan(b) ? a + b : (a > b ? a : b);
    case BinaryOp::Min: return hd_isnan(a) || hd_isnan(b) ? a + b : (a < b ? a : b);
    case BinaryOp::Pow: return powf(a, b);
    // d(A^B)/dA = B * A^(B-1), with the exact forms the CPU's backward uses for the squares and
    // square roots of written-out LayerNorm and GELU (train/grads/binary_grad.cpp).
    case BinaryOp::PowSlope:
      if (b == 2.0f) return 2.0f * a;
      if (b == 1.0f) return 1.0f;
      if (b == 3.0f) return 3.0f * a * a;
      if (b == 0.5f) return 0.5f / sqrtf(a);
      return b * powf(a, b - 1.0f);
  }
  return a;
}

// Float storage conversion (kernels/params.h's FloatConvert): x and y are float or uint16_t arrays
// as the direction says.
struct ConvertBody {
  FloatConvert kind;
  const void* x;
  void* y;
  int64_t n;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      switch (kind) {
        case FloatConvert::F32ToF16: static_cast<uint16_t*>(y)[i] = hd_float_to_half_bits(static_cast<const float*>(x)[i]); break;
        case FloatConvert::F16ToF32: static_cast<float*>(y)[i] = hd_half_bits_to_float(static_cast<const uint16_t*>(x)[i]); break;
        case FloatConvert::F32ToBF16: static_cast<uint16_t*>(y)[i] = hd_float_to_bf16_bits(static_cast<const float*>(x)[i]); break;
        case FloatConvert::BF16ToF32: static_cast<float*>(y)[i] = hd_bf16_bits_to_float(static_cast<const uint16_t*>(x)[i]); break;
      }
    }
  }
};

struct UnaryBody {
  UnaryOp op;
  float alpha, beta;
  const float* x;
  float* y;
  int64_t n;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) y[i] = unary_apply(op, x[i], alpha, beta);
  }
};

// Offsets into A and B of output element i (row-major).
MPQ_HD inline void broadcast_offsets(const Broadcast2& bc, int64_t i, int64_t& oa, int64_t& ob) {
  oa = 0;
  ob = 0;
  for (int d = bc.rank - 1; d >= 0; --d) {
    const int64_t c = i % bc.dims[d];
    i /= bc.dims[d];
    oa += c * bc.a_stride[d];
    ob += c * bc.b_stride[d];
  }
}

struct BinaryBody {
  BinaryOp op;
  Broadcast2 bc;
  const float* a;
  const float* b;
  float* y;
  int64_t n;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      int64_t oa, ob;
      broadcast_offsets(bc, i, oa, ob);
      y[i] = binary_apply(op, a[oa], b[ob]);
    }
  }
};

}  // namespace mpq::cuda
