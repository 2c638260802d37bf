#include "calib/histogram.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "runtime/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MPQ_CALIB_X86 1
#endif

namespace mpq::calib {

namespace {

// ---- min/max scan

MinMaxScan scan_scalar(const float* data, int64_t n) {
  MinMaxScan s;
  uint32_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = data[i];
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);  // exponent all ones: inf or NaN
    s.lo = v < s.lo ? v : s.lo;
    s.hi = v > s.hi ? v : s.hi;
  }
  s.all_finite = bad == 0;
  return s;
}

#ifdef MPQ_CALIB_X86
bool have_avx2() {
  // Checked at run time: the build targets baseline x86-64.
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
  return ok;
}

__attribute__((target("avx2"))) MinMaxScan scan_avx2(const float* data, int64_t n) {
  __m256 lo0 = _mm256_set1_ps(std::numeric_limits<float>::infinity()), lo1 = lo0;
  __m256 hi0 = _mm256_set1_ps(-std::numeric_limits<float>::infinity()), hi1 = hi0;
  const __m256i exponent = _mm256_set1_epi32(0x7f800000);
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  // Two accumulators each hide the latency of min/max; NaN makes these results meaningless, but
  // then `bad` is set and the caller takes the path that counts NaN/inf.
  for (; i + 16 <= n; i += 16) {
    const __m256 a = _mm256_loadu_ps(data + i), b = _mm256_loadu_ps(data + i + 8);
    lo0 = _mm256_min_ps(lo0, a);
    lo1 = _mm256_min_ps(lo1, b);
    hi0 = _mm256_max_ps(hi0, a);
    hi1 = _mm256_max_ps(hi1, b);
    const __m256i ea = _mm256_and_si256(_mm256_castps_si256(a), exponent);
    const __m256i eb = _mm256_and_si256(_mm256_castps_si256(b), exponent);
    bad = _mm256_or_si256(bad, _mm256_or_si256(_mm256_cmpeq_epi32(ea, exponent), _mm256_cmpeq_epi32(eb, exponent)));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_loadu_ps(data + i);
    lo0 = _mm256_min_ps(lo0, a);
    hi0 = _mm256_max_ps(hi0, a);
    bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(a), exponent), exponent));
  }
  alignas(32) float lo[8], hi[8];
  _mm256_store_ps(lo, _mm256_min_ps(lo0, lo1));
  _mm256_store_ps(hi, _mm256_max_ps(hi0, hi1));
  MinMaxScan s = scan_scalar(data + i, n - i);
  for (int k = 0; k < 8; ++k) {
    s.lo = lo[k] < s.lo ? lo[k] : s.lo;
    s.hi = hi[k] > s.hi ? hi[k] : s.hi;
  }
  s.all_finite = s.all_finite && _mm256_testz_si256(bad, bad);
  return s;
}
#endif

// ---- binning: bin index floor(x * scale) + bins, clamped to the 2*bins signed bins

uint64_t bin_scalar(const float* data, int64_t n, float scale, int bins, uint64_t* counts) {
  const int nbins = 2 * bins;
  uint64_t zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    zeros += data[i] == 0.0f;
    const float y = data[i] * scale;
    int fl = static_cast<int>(y);
    fl -= (static_cast<float>(fl) > y) ? 1 : 0;
    int idx = fl + bins;
    idx = idx < 0 ? 0 : (idx >= nbins ? nbins - 1 : idx);
    ++counts[idx];
  }
  return zeros;
}

#ifdef MPQ_CALIB_X86
// Bin indices are computed 8 at a time. Where all 8 land in one bin (a constant image background,
// every feature map over it, the zeros of a ReLU) they are counted with one add: incrementing one
// counter 8 times back to back would wait on the previous store each time.
__attribute__((target("avx2,popcnt"))) uint64_t bin_avx2(const float* data, int64_t n, float scale, int bins,
                                                          uint64_t* counts) {
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256 zero = _mm256_setzero_ps();
  const __m256i vbins = _mm256_set1_epi32(bins);
  const __m256i first = _mm256_setzero_si256();
  const __m256i last = _mm256_set1_epi32(2 * bins - 1);
  uint64_t zeros = 0;
  int64_t i = 0;
  alignas(32) int32_t lane[8];
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(data + i);
    __m256i b = _mm256_cvttps_epi32(_mm256_floor_ps(_mm256_mul_ps(v, vscale)));
    b = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(b, vbins), first), last);
    zeros += static_cast<uint64_t>(__builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_EQ_OQ)))));
    const __m256i lane0 = _mm256_permutevar8x32_epi32(b, first);
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(b, lane0)) == -1) {
      counts[_mm256_cvtsi256_si32(b)] += 8;
      continue;
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(lane), b);
    for (int k = 0; k < 8; ++k) ++counts[lane[k]];
  }
  return zeros + bin_scalar(data + i, n - i, scale, bins, counts);
}
#endif

uint64_t bin_values(const float* data, int64_t n, float scale, int bins, uint64_t* counts) {
#ifdef MPQ_CALIB_X86
  if (have_avx2()) return bin_avx2(data, n, scale, bins, counts);
#endif
  return bin_scalar(data, n, scale, bins, counts);
}

// Chunks for splitting one tensor over a pool: below this, thread hand-off costs more than it saves.
constexpr int64_t kMinParallelValues = int64_t{1} << 17;

int64_t chunk_count(const rt::ThreadPool* pool, int64_t n) {
  if (!pool || pool->size() <= 1 || n < kMinParallelValues) return 1;
  return std::min<int64_t>(pool->size(), n / (kMinParallelValues / 2));
}

}  // namespace

MinMaxScan scan_min_max(const float* data, int64_t n) {
#ifdef MPQ_CALIB_X86
  if (have_avx2()) return scan_avx2(data, n);
#endif
  return scan_scalar(data, n);
}

MinMaxScan scan_min_max_ref(const float* data, int64_t n) {
  MinMaxScan s;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(data[i])) {
      s.all_finite = false;
      continue;
    }
    s.lo = std::min(s.lo, data[i]);
    s.hi = std::max(s.hi, data[i]);
  }
  return s;
}

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

bool Histogram::prepare(int64_t n, float max_abs) {
  if (n <= 0) return false;
  total_ += static_cast<uint64_t>(n);
  if (max_abs == 0.0f && range_ == 0.0) {
    zeros_before_range_ += static_cast<uint64_t>(n);
    exact_zeros_ += static_cast<uint64_t>(n);
    return false;
  }
  // Strict: a value equal to R would fall past the last bin.
  if (max_abs >= range_) widen_to(std::nextafter(static_cast<double>(max_abs), INFINITY));
  return true;
}

void Histogram::add(const float* data, int64_t n, float max_abs) {
  if (!prepare(n, max_abs)) return;
  // bins / R is a power of two, so x * scale is exact and its floor is the exact bin offset from
  // the centre: this matches add_ref() bit for bit.
  exact_zeros_ += bin_values(data, n, static_cast<float>(bins_ / range_), bins_, counts_.data());
}

void Histogram::add_parallel(const float* data, int64_t n, float max_abs, rt::ThreadPool& pool) {
  const int64_t chunks = chunk_count(&pool, n);
  if (chunks <= 1) return add(data, n, max_abs);
  if (!prepare(n, max_abs)) return;
  const float scale = static_cast<float>(bins_ / range_);
  const size_t nbins = counts_.size();
  // Chunk 0 bins straight into the histogram; the others into their own counts, summed after.
  std::vector<uint64_t> local(static_cast<size_t>(chunks - 1) * nbins, 0);
  std::vector<uint64_t> zeros(static_cast<size_t>(chunks), 0);
  const int64_t per = (n + chunks - 1) / chunks;
  pool.parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t begin = k * per, len = std::min(n, begin + per) - begin;
      uint64_t* out = k == 0 ? counts_.data() : local.data() + static_cast<size_t>(k - 1) * nbins;
      zeros[static_cast<size_t>(k)] = bin_values(data + begin, len, scale, bins_, out);
    }
  });
  for (int64_t k = 1; k < chunks; ++k) {
    const uint64_t* src = local.data() + static_cast<size_t>(k - 1) * nbins;
    for (size_t j = 0; j < nbins; ++j) counts_[j] += src[j];
  }
  for (uint64_t z : zeros) exact_zeros_ += z;
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

void TensorStats::add(const float* data, int64_t n, rt::ThreadPool* pool) {
  if (n <= 0) return;
  const int64_t chunks = chunk_count(pool, n);
  MinMaxScan s;
  if (chunks > 1) {
    std::vector<MinMaxScan> parts(static_cast<size_t>(chunks));
    const int64_t per = (n + chunks - 1) / chunks;
    pool->parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) {
        const int64_t begin = k * per;
        parts[static_cast<size_t>(k)] = scan_min_max(data + begin, std::min(n, begin + per) - begin);
      }
    });
    for (const MinMaxScan& p : parts) {
      s.lo = std::min(s.lo, p.lo);
      s.hi = std::max(s.hi, p.hi);
      s.all_finite = s.all_finite && p.all_finite;
    }
  } else {
    s = scan_min_max(data, n);
  }
  if (!s.all_finite) return add_with_nonfinite(data, n);  // rare: counted and filtered on one thread
  // -0 and +0 compare equal and the vector and scalar scans may keep either: record +0.
  if (s.lo == 0.0f) s.lo = 0.0f;
  if (s.hi == 0.0f) s.hi = 0.0f;
  min = std::min(min, static_cast<double>(s.lo));
  max = std::max(max, static_cast<double>(s.hi));
  count += static_cast<uint64_t>(n);
  if (!has_histogram) return;
  const float max_abs = std::max(std::fabs(s.lo), std::fabs(s.hi));
  if (chunks > 1) {
    histogram.add_parallel(data, n, max_abs, *pool);
  } else {
    histogram.add(data, n, max_abs);
  }
}

void TensorStats::add_with_nonfinite(const float* data, int64_t n) {
  float lo = std::numeric_limits<float>::infinity(), hi = -std::numeric_limits<float>::infinity();
  std::vector<float> clean;
  clean.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float v = data[i];
    if (std::isnan(v)) {
      ++nan_count;
    } else if (std::isinf(v)) {
      ++inf_count;
    } else {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      clean.push_back(v);
    }
  }
  if (clean.empty()) return;
  min = std::min(min, static_cast<double>(lo));
  max = std::max(max, static_cast<double>(hi));
  count += clean.size();
  if (has_histogram) histogram.add(clean.data(), static_cast<int64_t>(clean.size()), std::max(std::fabs(lo), std::fabs(hi)));
}

void TensorStats::add_ref(const float* data, int64_t n) {
  std::vector<float> clean;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(data[i])) {
      ++nan_count;
    } else if (std::isinf(data[i])) {
      ++inf_count;
    } else {
      clean.push_back(data[i]);
    }
  }
  if (clean.empty()) return;
  for (float v : clean) {
    min = std::min(min, static_cast<double>(v));
    max = std::max(max, static_cast<double>(v));
  }
  count += clean.size();
  if (has_histogram) histogram.add_ref(clean.data(), static_cast<int64_t>(clean.size()));
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
