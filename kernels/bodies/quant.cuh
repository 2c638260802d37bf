#pragma once
// Quantization bodies: QuantizeLinear / DequantizeLinear (per tensor or per axis), FakeQuant
// forward, its backward (straight-through estimator for X, LSQ slope for the scale; chunk_sum.cuh
// adds the slope's terms per channel), and the calibration statistics (min/max in
// two passes, histogram). The arithmetic is calib/quant_ref.cpp's, step for step, so the results
// are bit-identical to the reference (true division, ties to even, saturation in double).
#include "kernels/bodies/chunk_sum.cuh"
#include "kernels/device_helpers.cuh"
#include "kernels/hd.h"

namespace mpq::cuda {

MPQ_HD inline int64_t ql_numel(const QuantLayout& l) { return l.outer * l.channels * l.inner; }
MPQ_HD inline int64_t ql_channel(const QuantLayout& l, int64_t i) { return (i / l.inner) % l.channels; }
MPQ_HD inline int32_t ql_zp(const QuantLayout& l, int64_t c) { return l.zero_point ? l.zero_point[c] : 0; }

MPQ_HD inline int32_t hd_quantize(float x, float scale, int32_t zp, int32_t qmin, int32_t qmax) {
  const float v = x / scale;
  if (hd_isnan(v)) return zp < qmin ? qmin : (zp > qmax ? qmax : zp);
  const double q = static_cast<double>(hd_round_half_even(v)) + static_cast<double>(zp);
  if (q <= qmin) return qmin;
  if (q >= qmax) return qmax;
  return static_cast<int32_t>(q);
}

MPQ_HD inline float hd_dequantize(int32_t q, float scale, int32_t zp) {
  return static_cast<float>(static_cast<int64_t>(q) - static_cast<int64_t>(zp)) * scale;
}

template <typename Q>
struct QuantizeBody {
  QuantLayout l;
  const float* x;
  Q* q;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t n = ql_numel(l);
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      const int64_t c = ql_channel(l, i);
      q[i] = static_cast<Q>(hd_quantize(x[i], l.scale[c], ql_zp(l, c), l.qmin, l.qmax));
    }
  }
};

template <typename Q>
struct DequantizeBody {
  QuantLayout l;
  const Q* q;
  float* y;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t n = ql_numel(l);
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      const int64_t c = ql_channel(l, i);
      y[i] = hd_dequantize(static_cast<int32_t>(q[i]), l.scale[c], ql_zp(l, c));
    }
  }
};

// mpq FakeQuantBias (runtime/cpu/fake_quant.cpp's fake_quantize_bias, step for step): each bias
// value rounded to a multiple of s = input_scale * weight_scale[c] (one weight scale or one per
// channel), as an int32 would hold it; if any channel's b / s rounds outside int32 (or is NaN), the
// whole bias passes through unchanged. Pass 1 flags each channel (1.0 where it overflows), a
// chunked maximum (chunk_sum.cuh) folds the flags, pass 2 writes every channel.
MPQ_HD inline float fq_bias_scale(const float* input_scale, const float* weight_scales, int64_t n_weight_scales, int64_t c) {
  return input_scale[0] * weight_scales[n_weight_scales == 1 ? 0 : c];
}
struct FakeQuantBiasFlagBody {
  const float* b;
  const float* input_scale;
  const float* weight_scales;
  int64_t n, n_weight_scales;
  double* flags;  // n
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t c = t.global(); c < n; c += t.stride()) {
      const float s = fq_bias_scale(input_scale, weight_scales, n_weight_scales, c);
      const double r = rint(static_cast<double>(b[c]) / static_cast<double>(s));
      flags[c] = fabs(r) <= 2147483647.0 ? 0.0 : 1.0;  // then pass 2's float quotient fits too (fake_quant.cpp)
    }
  }
};
struct FakeQuantBiasApplyBody {
  const float* b;
  const float* input_scale;
  const float* weight_scales;
  int64_t n, n_weight_scales;
  const double* any_overflow;  // one value: > 0 when a channel overflows
  float* y;
  MPQ_HD void operator()(const Thread& t) const {
    const bool pass_through = *any_overflow > 0.0;
    for (int64_t c = t.global(); c < n; c += t.stride()) {
      if (pass_through) {
        y[c] = b[c];
        continue;
      }
      const float s = fq_bias_scale(input_scale, weight_scales, n_weight_scales, c);
      y[c] = static_cast<float>(static_cast<int32_t>(rintf(b[c] / s))) * s;
    }
  }
};

struct FakeQuantBody {
  QuantLayout l;
  const float* x;
  float* y;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t n = ql_numel(l);
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      const int64_t c = ql_channel(l, i);
      const int32_t zp = ql_zp(l, c);
      y[i] = hd_dequantize(hd_quantize(x[i], l.scale[c], zp, l.qmin, l.qmax), l.scale[c], zp);
    }
  }
};

// Backward, per element: dx = dy where the value was not clipped (STE), else 0; and the LSQ term
// dy * d(y)/d(scale) (round() taken as identity) into `scale_terms` (may be null), which
// ChannelSumBody then sums per channel.
struct FakeQuantBackwardBody {
  QuantLayout l;
  const float* x;
  const float* dy;
  float* dx;
  double* scale_terms;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t n = ql_numel(l);
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      const int64_t c = ql_channel(l, i);
      const int32_t zp = ql_zp(l, c);
      const float v = x[i] / l.scale[c];
      float slope = 0.0f;
      bool passes = false;
      if (!hd_isnan(v)) {
        const float r = hd_round_half_even(v);
        const double q = static_cast<double>(r) + static_cast<double>(zp);
        passes = q >= l.qmin && q <= l.qmax;
        slope = q < l.qmin ? static_cast<float>(l.qmin - zp) : (q > l.qmax ? static_cast<float>(l.qmax - zp) : r - v);
      }
      dx[i] = passes ? dy[i] : 0.0f;
      if (scale_terms) scale_terms[i] = static_cast<double>(dy[i]) * static_cast<double>(slope);
    }
  }
};

// Min/max pass 1: thread k of the launch scans its grid-stride elements into partial[k] (lo, hi,
// and a count of non-finite values). Pass 2 (MinMaxFinalBody, one thread) folds the partials.
// Two passes instead of shared-memory trees keep it host-runnable and deterministic.
struct MinMaxPartialBody {
  const float* x;
  int64_t n;
  MinMaxPartial* partial;  // one per launched thread
  MPQ_HD void operator()(const Thread& t) const {
    MinMaxPartial p{__builtin_huge_valf(), -__builtin_huge_valf(), 0ULL};
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      const float v = x[i];
      if (!hd_isfinite(v)) {
        ++p.nonfinite;
        continue;
      }
      p.lo = hd_min(p.lo, v);
      p.hi = hd_max(p.hi, v);
    }
    partial[t.global()] = p;
  }
};

struct MinMaxFinalBody {
  const MinMaxPartial* partial;
  int64_t count;
  MinMaxPartial* out;
  MPQ_HD void operator()(const Thread& t) const {
    if (t.global() != 0) return;
    MinMaxPartial r{__builtin_huge_valf(), -__builtin_huge_valf(), 0ULL};
    for (int64_t k = 0; k < count; ++k) {
      r.lo = hd_min(r.lo, partial[k].lo);
      r.hi = hd_max(r.hi, partial[k].hi);
      r.nonfinite += partial[k].nonfinite;
    }
    *out = r;
  }
};

// Signed histogram of calib::Histogram: bin floor(x * scale) + bins, clamped to [0, 2*bins), with
// scale = bins / R; finite values only (the caller filtered NaN/inf, as calib::TensorStats does).
// The scale must be a finite float: calib bins a range whose bins / R is past float's range (a
// tensor of denormals) on the CPU in double.
struct HistogramBody {
  const float* x;
  int64_t n;
  float scale;
  int bins;
  unsigned long long* counts;  // 2 * bins
  MPQ_HD void operator()(const Thread& t) const {
    const int nbins = 2 * bins;
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      float v = x[i] * scale;
      // Kept inside int's range before converting (a scale past float's range gives inf, or NaN
      // for a zero: both then land in an end bin instead of being undefined).
      if (!(v > static_cast<float>(-nbins))) v = static_cast<float>(-nbins);
      if (!(v < static_cast<float>(nbins))) v = static_cast<float>(nbins);
      int fl = static_cast<int>(v);
      fl -= (static_cast<float>(fl) > v) ? 1 : 0;
      // A negative x whose product underflowed to -0 belongs in bin -1, as calib's exact kernels put it.
      if (v == 0.0f && x[i] < 0.0f) fl = -1;
      int idx = fl + bins;
      idx = idx < 0 ? 0 : (idx >= nbins ? nbins - 1 : idx);
      hd_atomic_increment(&counts[idx]);
    }
  }
};

}  // namespace mpq::cuda
