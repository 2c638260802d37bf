#include "calib/qparams.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "calib/quant_ref.h"

namespace mpq::calib {

float safe_scale(double range, int32_t levels) {
  double s = range / static_cast<double>(levels);
  if (!std::isfinite(s) || !(s >= static_cast<double>(FLT_MIN))) return 1.0f;
  if (s > static_cast<double>(FLT_MAX)) return FLT_MAX;
  return static_cast<float>(s);
}

QParams symmetric_int8(double amax, bool reduce_range) {
  QParams q;
  q.dtype = DType::Int8;
  q.qmin = reduce_range ? -64 : -128;
  q.qmax = reduce_range ? 63 : 127;
  q.scale = safe_scale(std::fabs(amax), q.qmax);
  q.zero_point = 0;
  return q;
}

namespace {
QParams asymmetric(double lo, double hi, int32_t qmin, int32_t qmax, DType dtype) {
  QParams q;
  q.dtype = dtype;
  q.qmin = qmin;
  q.qmax = qmax;
  lo = std::min(lo, 0.0);
  hi = std::max(hi, 0.0);
  q.scale = safe_scale(hi - lo, qmax - qmin);
  // Zero must map to an integer exactly: zp = qmin - lo / scale, rounded and clamped.
  double zp = static_cast<double>(qmin) - lo / static_cast<double>(q.scale);
  q.zero_point = static_cast<int32_t>(std::clamp<double>(round_half_to_even(static_cast<float>(zp)), qmin, qmax));
  return q;
}
}  // namespace

QParams asymmetric_uint8(double lo, double hi, bool reduce_range) {
  return asymmetric(lo, hi, 0, reduce_range ? 127 : 255, DType::UInt8);
}

QParams asymmetric_int8(double lo, double hi, bool reduce_range) {
  return asymmetric(lo, hi, reduce_range ? -64 : -128, reduce_range ? 63 : 127, DType::Int8);
}

float weight_scale(double amax) { return safe_scale(std::fabs(amax), 127); }

std::vector<float> weight_scales_per_channel(const std::vector<float>& channel_amax) {
  std::vector<float> out;
  out.reserve(channel_amax.size());
  for (float a : channel_amax) out.push_back(weight_scale(a));
  return out;
}

}  // namespace mpq::calib
