#pragma once
// Scale and zero point from a range. Zero is always exactly representable, and a zero, denormal
// or empty range never yields a zero or denormal scale.
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace mpq::calib {

struct QParams {
  float scale = 1.0f;
  int32_t zero_point = 0;
  DType dtype = DType::Int8;
  int32_t qmin = -128;
  int32_t qmax = 127;
};

// Activations, int8 symmetric: scale = amax / 127 (TensorRT's convention, -128 unused), zp = 0.
// reduce_range uses 7 bits (amax / 63) for hardware without VNNI.
QParams symmetric_int8(double amax, bool reduce_range = false);
// Activations, uint8 asymmetric over [min(lo, 0), max(hi, 0)]: scale = (hi - lo) / 255,
// zp = round(-lo / scale) clamped to [0, 255]. reduce_range: [0, 127].
QParams asymmetric_uint8(double lo, double hi, bool reduce_range = false);
// Int8 asymmetric (zero point may be non-zero) over [-128, 127].
QParams asymmetric_int8(double lo, double hi, bool reduce_range = false);
// Weights, int8 symmetric in [-127, 127], one scale per channel.
std::vector<float> weight_scales_per_channel(const std::vector<float>& channel_amax);
float weight_scale(double amax);

// The smallest scale mpq emits for a non-empty range: a range too small to be represented with a
// normal float scale is treated as all-zero and gets scale 1.0 (every value then quantizes to 0).
float safe_scale(double range, int32_t levels);

}  // namespace mpq::calib
