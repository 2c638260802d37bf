#pragma once
// IEEE binary16 and bfloat16 conversions with round-to-nearest-even, inf/NaN preserved.
// Overflow gives inf (as FP16 hardware does), which is what the FP16 checks must see.
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace mpq {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_half_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0u));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (absx < 0x38800000u) {                                               // below smallest normal half
    if (absx < 0x33000000u) return static_cast<uint16_t>(sign);          // < half of smallest subnormal
    // Subnormal: shift mantissa (with implicit bit) into place, round half to even.
    uint32_t exp = absx >> 23;
    uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126 - exp;  // 14 + (112 - exp) + ... : maps exponent to subnormal position
    uint32_t result = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t half_point = 1u << (shift - 1);
    if (rem > half_point || (rem == half_point && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  // Normal: rebias exponent (127 -> 15), round mantissa 23 -> 10 bits half to even.
  uint32_t result = ((absx - 0x38000000u) >> 13);
  uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
  return static_cast<uint16_t>(sign | result);
}

inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    // Subnormal: value = mant * 2^-24.
    float v = static_cast<float>(mant) * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>((x + rounding) >> 16);
}

inline float bf16_bits_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

inline Float16 to_half(float f) { return Float16{float_to_half_bits(f)}; }
inline float to_float(Float16 h) { return half_bits_to_float(h.bits); }
inline BFloat16 to_bf16(float f) { return BFloat16{float_to_bf16_bits(f)}; }
inline float to_float(BFloat16 b) { return bf16_bits_to_float(b.bits); }

// Largest finite FP16 value; a tensor above it becomes inf in FP16 storage.
inline constexpr float kHalfMax = 65504.0f;
// Smallest positive normal FP16 value.
inline constexpr float kHalfMinNormal = 6.103515625e-05f;

}  // namespace mpq
