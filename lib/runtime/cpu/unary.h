#pragma once
// Element-wise unary kernels (unary.cpp). Each runs one loop compiled three times: for the
// baseline ISA (SSE2), AVX2 and AVX-512, picked at run time; the three give the same bits (no FMA
// contraction in that file; a NaN result may differ in its sign bit), which tests check by
// forcing each.

#include <cstdint>

namespace mpq::rt::cpu {

enum class UnaryIsa { Auto, Avx512, Avx2, Baseline };

// For tests: makes the element-wise unary kernels use `isa` (or the next narrower one this CPU
// has) from now on, process-wide; returns the one that will run. Auto restores the default.
UnaryIsa force_unary_isa(UnaryIsa isa);

// The ISA the element-wise loops run with now: the forced one (or the next narrower one this CPU
// has), else the widest this CPU has. Softmax's rows and LayerNormalization's float rows follow it too.
UnaryIsa unary_isa();

// Gelu (approximate "tanh" or "none") over n floats on the calling thread, with the Gelu kernel's
// arithmetic and ISA choice: the same bits as the kernel (mpq::GeluMlp, runtime/cpu/mlp.cpp).
void gelu_range(bool tanh, const float* in, float* out, int64_t n);

}  // namespace mpq::rt::cpu
