#include "calib/histogram.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace mpq::calib {

Histogram::Histogram(int bins) : bins_(bins) {
  if (bins < 2 || bins % 2 != 0) fail_internal("Histogram: bins must be even and >= 2, got {}", bins);
  counts_.assign(static_cast<size_t>(2 * bins), 0);
}

void Histogram::widen_to(double max_abs) {
  if (range_ == 0.0) {
    // First non-zero data: the range starts at its magnitude (next power of two keeps later
    // doublings aligned and the edges exact).
    range_ = std::exp2(std::ceil(std::log2(max_abs)));
    if (range_ < max_abs) range_ *= 2;
    if (zeros_before_range_) counts_[static_cast<size_t>(bins_)] += zeros_before_range_;
    zeros_before_range_ = 0;
    return;
  }
  while (range_ < max_abs) {
    // Double R: the old [-R, R) occupies the middle half; pairs of old bins merge into one.
    std::vector<uint64_t> merged(counts_.size(), 0);
    const int n = 2 * bins_;
    for (int i = 0; i < n; ++i) merged[static_cast<size_t>(n / 4 + i / 2)] += counts_[static_cast<size_t>(i)];
    counts_.swap(merged);
    range_ *= 2;
  }
}

void Histogram::add(const float* data, int64_t n, float max_abs) {
  if (n <= 0) return;
  total_ += static_cast<uint64_t>(n);
  if (max_abs == 0.0f && range_ == 0.0) {
    zeros_before_range_ += static_cast<uint64_t>(n);
    exact_zeros_ += static_cast<uint64_t>(n);
    return;
  }
  // Strict: a value equal to R would fall past the last bin.
  if (max_abs >= range_) widen_to(std::nextafter(static_cast<double>(max_abs), INFINITY));
  const int nbins = 2 * bins_;
  // bins / R is a power of two, so x * scale is exact and its floor is the exact bin offset from
  // the centre: this matches add_ref() bit for bit.
  const float scale = static_cast<float>(bins_ / range_);
  uint64_t* c = counts_.data();
  uint64_t zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    zeros += data[i] == 0.0f;
    float y = data[i] * scale;
    int fl = static_cast<int>(y);
    fl -= (static_cast<float>(fl) > y) ? 1 : 0;
    int idx = fl + bins_;
    idx = idx < 0 ? 0 : (idx >= nbins ? nbins - 1 : idx);
    ++c[idx];
  }
  exact_zeros_ += zeros;
}

void Histogram::add_ref(const float* data, int64_t n) {
  float max_abs = 0;
  for (int64_t i = 0; i < n; ++i) max_abs = std::max(max_abs, std::fabs(data[i]));
  total_ += static_cast<uint64_t>(n);
  for (int64_t i = 0; i < n; ++i) exact_zeros_ += data[i] == 0.0f;
  if (max_abs == 0.0f && range_ == 0.0) {
    zeros_before_range_ += static_cast<uint64_t>(n);
    return;
  }
  if (max_abs >= range_) widen_to(std::nextafter(static_cast<double>(max_abs), INFINITY));
  for (int64_t i = 0; i < n; ++i) {
    double pos = (static_cast<double>(data[i]) + range_) / (2.0 * range_) * (2 * bins_);
    int idx = std::clamp(static_cast<int>(std::floor(pos)), 0, 2 * bins_ - 1);
    ++counts_[static_cast<size_t>(idx)];
  }
}

std::vector<uint64_t> Histogram::abs_counts(bool skip_zeros) const {
  std::vector<uint64_t> out(static_cast<size_t>(bins_), 0);
  for (int j = 0; j < bins_; ++j)
    out[static_cast<size_t>(j)] = counts_[static_cast<size_t>(bins_ + j)] + counts_[static_cast<size_t>(bins_ - 1 - j)];
  if (range_ == 0.0) out[0] += zeros_before_range_;
  if (skip_zeros) out[0] -= exact_zeros_;
  return out;
}

void TensorStats::add(const float* data, int64_t n) {
  float lo = std::numeric_limits<float>::infinity(), hi = -std::numeric_limits<float>::infinity();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    float v = data[i];
    if (!std::isfinite(v)) {
      ++bad;
      continue;
    }
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  if (bad) {
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(data[i])) ++nan_count;
      else if (std::isinf(data[i])) ++inf_count;
    }
  }
  const int64_t finite = n - bad;
  if (finite == 0) return;
  min = std::min(min, static_cast<double>(lo));
  max = std::max(max, static_cast<double>(hi));
  count += static_cast<uint64_t>(finite);
  if (!has_histogram) return;
  const float max_abs = std::max(std::fabs(lo), std::fabs(hi));
  if (bad == 0) {
    histogram.add(data, n, max_abs);
  } else {
    std::vector<float> clean;
    clean.reserve(static_cast<size_t>(finite));
    for (int64_t i = 0; i < n; ++i)
      if (std::isfinite(data[i])) clean.push_back(data[i]);
    histogram.add(clean.data(), finite, max_abs);
  }
}

double TensorStats::amax() const {
  if (count == 0) return 0.0;
  return std::max(std::fabs(min), std::fabs(max));
}

void channel_min_max(const float* w, int64_t outer, int64_t channels, int64_t inner, std::vector<float>& mins,
                     std::vector<float>& maxs) {
  mins.assign(static_cast<size_t>(channels), std::numeric_limits<float>::infinity());
  maxs.assign(static_cast<size_t>(channels), -std::numeric_limits<float>::infinity());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c) {
      const float* p = w + (o * channels + c) * inner;
      float lo = mins[static_cast<size_t>(c)], hi = maxs[static_cast<size_t>(c)];
      for (int64_t i = 0; i < inner; ++i) {
        lo = std::min(lo, p[i]);
        hi = std::max(hi, p[i]);
      }
      mins[static_cast<size_t>(c)] = lo;
      maxs[static_cast<size_t>(c)] = hi;
    }
  for (int64_t c = 0; c < channels; ++c)
    if (mins[static_cast<size_t>(c)] > maxs[static_cast<size_t>(c)]) mins[static_cast<size_t>(c)] = maxs[static_cast<size_t>(c)] = 0.0f;
}

}  // namespace mpq::calib
