#include "runtime/low_precision.h"

#include "core/half.h"

namespace mpq::rt {

bool any_low_precision(const std::vector<const Tensor*>& inputs) {
  for (const Tensor* t : inputs)
    if (t && (t->dtype() == DType::Float16 || t->dtype() == DType::BFloat16)) return true;
  return false;
}

void half_to_float(const Float16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = half_bits_to_float(src[i].bits);
}
void float_to_half(const float* src, Float16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i].bits = float_to_half_bits(src[i]);
}
void bf16_to_float(const BFloat16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_bits_to_float(src[i].bits);
}
void float_to_bf16(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i].bits = float_to_bf16_bits(src[i]);
}

Tensor widen_to_float32(const Tensor& t) {
  if (t.dtype() == DType::Float16) {
    Tensor out(DType::Float32, t.shape());
    half_to_float(t.data<Float16>(), out.data<float>(), t.numel());
    return out;
  }
  if (t.dtype() == DType::BFloat16) {
    Tensor out(DType::Float32, t.shape());
    bf16_to_float(t.data<BFloat16>(), out.data<float>(), t.numel());
    return out;
  }
  return t;
}

Tensor narrow_from_float32(const Tensor& t, DType low) {
  Tensor out(low, t.shape());
  if (low == DType::Float16) float_to_half(t.data<float>(), out.data<Float16>(), t.numel());
  else float_to_bf16(t.data<float>(), out.data<BFloat16>(), t.numel());
  return out;
}

void run_in_float32(OpKernel& kernel, KernelContext& ctx) {
  auto& ins = ctx.mutable_inputs();
  DType low = DType::Undefined;
  std::vector<Tensor> widened(ins.size());
  std::vector<const Tensor*> original = ins;
  for (size_t i = 0; i < ins.size(); ++i) {
    if (!ins[i]) continue;
    DType d = ins[i]->dtype();
    if (d == DType::Float16 || d == DType::BFloat16) {
      if (low == DType::Undefined) low = d;
      widened[i] = widen_to_float32(*ins[i]);
      ins[i] = &widened[i];
    }
  }
  try {
    kernel.compute(ctx);
  } catch (...) {
    ins = original;
    throw;
  }
  ins = original;
  for (Tensor& out : ctx.mutable_outputs())
    if (out.defined() && out.dtype() == DType::Float32) out = narrow_from_float32(out, low);
}

}  // namespace mpq::rt
