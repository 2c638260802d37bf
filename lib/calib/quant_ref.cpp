#include "calib/quant_ref.h"

#include <algorithm>
#include <cmath>

namespace mpq::calib {

namespace {

int32_t saturate(double v, int32_t qmin, int32_t qmax) {
  if (v <= qmin) return qmin;
  if (v >= qmax) return qmax;
  return static_cast<int32_t>(v);
}

}  // namespace

float round_half_to_even(float x) {
  if (!std::isfinite(x)) return x;
  float r = std::round(x);  // ties away from zero; exact for every float
  // r - x is exact here (|r - x| <= 0.5 and both lie in the same or adjacent binades).
  if (std::fabs(r - x) == 0.5f) r = 2.0f * std::round(x * 0.5f);  // a tie: take the even neighbour
  return r;
}

int32_t quantize_ref(float x, float scale, int32_t zero_point, int32_t qmin, int32_t qmax) {
  const float v = x / scale;
  if (std::isnan(v)) return std::clamp(zero_point, qmin, qmax);
  // double holds every int32 sum exactly and survives +-inf.
  return saturate(static_cast<double>(round_half_to_even(v)) + static_cast<double>(zero_point), qmin, qmax);
}

float dequantize_ref(int32_t q, float scale, int32_t zero_point) {
  return static_cast<float>(static_cast<int64_t>(q) - static_cast<int64_t>(zero_point)) * scale;
}

float fake_quantize_ref(float x, float scale, int32_t zero_point, int32_t qmin, int32_t qmax) {
  return dequantize_ref(quantize_ref(x, scale, zero_point, qmin, qmax), scale, zero_point);
}

bool fake_quantize_passes_ref(float x, float scale, int32_t zero_point, int32_t qmin, int32_t qmax) {
  const float v = x / scale;
  if (std::isnan(v)) return false;
  const double q = static_cast<double>(round_half_to_even(v)) + static_cast<double>(zero_point);
  return q >= qmin && q <= qmax;
}

float fake_quantize_scale_slope_ref(float x, float scale, int32_t zero_point, int32_t qmin, int32_t qmax) {
  const float v = x / scale;
  if (std::isnan(v)) return 0.0f;
  const double q = static_cast<double>(round_half_to_even(v)) + static_cast<double>(zero_point);
  if (q < qmin) return static_cast<float>(qmin - zero_point);
  if (q > qmax) return static_cast<float>(qmax - zero_point);
  return round_half_to_even(v) - v;
}

double lsq_grad_scale_ref(int64_t elements_per_scale, int32_t zero_point, int32_t qmax) {
  const double qp = std::max(1.0, static_cast<double>(qmax) - static_cast<double>(zero_point));
  return 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(elements_per_scale, 1)) * qp);
}

float requant_multiplier_ref(float in_scale, float weight_scale, float out_scale) {
  const float prod = in_scale * weight_scale;
  return prod / out_scale;
}

int32_t requantize_ref(int32_t acc, float multiplier, int32_t zero_point, int32_t qmin, int32_t qmax) {
  const float v = static_cast<float>(acc) * multiplier;
  if (std::isnan(v)) return std::clamp(zero_point, qmin, qmax);
  return saturate(static_cast<double>(round_half_to_even(v)) + static_cast<double>(zero_point), qmin, qmax);
}

void quantize_per_axis_ref(const float* x, int64_t outer, int64_t channels, int64_t inner, const float* scale,
                           const int32_t* zero_point, int32_t qmin, int32_t qmax, int32_t* q) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (o * channels + c) * inner + i;
        q[k] = quantize_ref(x[k], scale[c], zero_point ? zero_point[c] : 0, qmin, qmax);
      }
}

void dequantize_per_axis_ref(const int32_t* q, int64_t outer, int64_t channels, int64_t inner, const float* scale,
                             const int32_t* zero_point, float* y) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (o * channels + c) * inner + i;
        y[k] = dequantize_ref(q[k], scale[c], zero_point ? zero_point[c] : 0);
      }
}

void fake_quantize_per_axis_ref(const float* x, int64_t outer, int64_t channels, int64_t inner, const float* scale,
                                const int32_t* zero_point, int32_t qmin, int32_t qmax, float* y) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (o * channels + c) * inner + i;
        y[k] = fake_quantize_ref(x[k], scale[c], zero_point ? zero_point[c] : 0, qmin, qmax);
      }
}

void quantize_blocked_ref(const float* x, int64_t outer, int64_t channels, int64_t inner, int64_t block_size,
                          const float* scale, const int32_t* zero_point, int32_t qmin, int32_t qmax, int32_t* q) {
  const int64_t blocks = (channels + block_size - 1) / block_size;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (o * channels + c) * inner + i;
        const int64_t p = (o * blocks + c / block_size) * inner + i;
        q[k] = quantize_ref(x[k], scale[p], zero_point ? zero_point[p] : 0, qmin, qmax);
      }
}

void dequantize_blocked_ref(const int32_t* q, int64_t outer, int64_t channels, int64_t inner, int64_t block_size,
                            const float* scale, const int32_t* zero_point, float* y) {
  const int64_t blocks = (channels + block_size - 1) / block_size;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (o * channels + c) * inner + i;
        const int64_t p = (o * blocks + c / block_size) * inner + i;
        y[k] = dequantize_ref(q[k], scale[p], zero_point ? zero_point[p] : 0);
      }
}

}  // namespace mpq::calib
