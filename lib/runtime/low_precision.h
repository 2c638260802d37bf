#pragma once
// FP16/BF16 execution for kernels written for float32: inputs are widened, the kernel runs in
// float32, and float outputs are rounded back to the low-precision type. Every op therefore rounds
// its result to FP16 storage (overflow to inf included), which is what real FP16 hardware shows;
// inside one op the arithmetic is float32, like FP16 tensor cores accumulating in FP32.
#include <vector>

#include "runtime/kernel.h"

namespace mpq::rt {

bool any_low_precision(const std::vector<const Tensor*>& inputs);
void run_in_float32(OpKernel& kernel, KernelContext& ctx);

// Bulk conversions (vectorisable loops).
void half_to_float(const Float16* src, float* dst, int64_t n);
void float_to_half(const float* src, Float16* dst, int64_t n);
void bf16_to_float(const BFloat16* src, float* dst, int64_t n);
void float_to_bf16(const float* src, BFloat16* dst, int64_t n);
// Float32 copy of a float16/bfloat16 tensor (other tensors returned as is).
Tensor widen_to_float32(const Tensor& t);
// Round a float32 tensor to `low` (Float16 or BFloat16).
Tensor narrow_from_float32(const Tensor& t, DType low);

}  // namespace mpq::rt
