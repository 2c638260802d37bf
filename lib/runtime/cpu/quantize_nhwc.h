#pragma once
// The input of an int8 convolution (runtime/cpu/conv_onednn.cpp, DnnlConvShape::int8) quantized
// into oneDNN's int8 source layout, channels-last: q[n, h, w, c] = saturate(round_half_even(
// x[n, c, h, w] * inv)) as int8, x float32 in plain NCHW or in NHWC. oneDNN's quantizing reorder
// computes the same values (the product rounded to float, then converted with rounding to nearest
// even and saturated), but its NCHW -> NHWC one took about 1 ns per value: 34 us for U-Net's
// 32 x 32 x 32 decoder input, 15% of an INT8 U-Net run on one thread with its 64 x 16 x 16 sibling.
// A NaN gives -128 (X is never NaN there: it comes from a FakeQuant, which maps NaN to 0).
#include <cstdint>

namespace mpq::rt::cpu {

// x is [n, c, h, w] (channels_last false) or [n, h, w, c]; q is [n, h, w, c].
void quantize_to_nhwc_s8(const float* x, bool channels_last, int64_t n, int64_t c, int64_t h, int64_t w, float inv,
                         int8_t* q);

// The scalar reference the fast version is tested against.
void quantize_to_nhwc_s8_ref(const float* x, bool channels_last, int64_t n, int64_t c, int64_t h, int64_t w, float inv,
                             int8_t* q);

// Whether quantize_to_nhwc_s8 runs its AVX-512 build now; while a ScopedQuantizeNhwcScalar lives it
// runs the scalar reference everywhere (tests).
bool quantize_nhwc_avx512();
class ScopedQuantizeNhwcScalar {
 public:
  ScopedQuantizeNhwcScalar();
  ~ScopedQuantizeNhwcScalar();
  ScopedQuantizeNhwcScalar(const ScopedQuantizeNhwcScalar&) = delete;
  ScopedQuantizeNhwcScalar& operator=(const ScopedQuantizeNhwcScalar&) = delete;

 private:
  bool previous_;
};

}  // namespace mpq::rt::cpu
