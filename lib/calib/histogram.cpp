#include "calib/histogram.h"

#include <algorithm>
#include <atomic>
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

bool have_avx512() {
  static const bool ok = have_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
  return ok;
}
#endif

std::atomic<int> g_forced_binning{static_cast<int>(BinningKernel::Auto)};

#ifdef MPQ_CALIB_X86

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

// ---- binning: bin index floor(x * scale) + bins, clamped to the 2*bins signed bins, counted into
// kLaneCopies interleaved copies of the counters (copy c at lanes + c * 2 * bins)

// The scalar kernel multiplies in double: exact for every float and a scale bins / R (R a power of
// two, bins an int of fewer than 30 bits), so it also serves scales past float's range (a tensor of
// denormals) and the tails of the vector kernels.
uint64_t bin_scalar(const float* data, int64_t n, double scale, int bins, uint32_t* lanes) {
  const int nbins = 2 * bins;
  uint64_t zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    zeros += data[i] == 0.0f;
    const double y = static_cast<double>(data[i]) * scale;
    // Clamped before the conversion: a value past the range must not overflow the int.
    int idx = static_cast<int>(std::clamp(std::floor(y), -1.0 - bins, static_cast<double>(bins))) + bins;
    idx = idx < 0 ? 0 : (idx >= nbins ? nbins - 1 : idx);
    ++lanes[static_cast<size_t>(idx) + static_cast<size_t>(i % Histogram::kLaneCopies) * static_cast<size_t>(nbins)];
  }
  return zeros;
}

#ifdef MPQ_CALIB_X86
// Bin indices are computed 8 at a time; lane k of the vector counts into copy k % kLaneCopies, so
// neighbouring values that land in one bin (a ReLU's zeros, a smooth feature map) increment
// different counters: incrementing one counter back to back waits on the previous store each time.
// Where all 8 land in one bin (a constant image background) they are counted with one add.
// x * scale is rounded to nearest in float; a negative x whose product underflows to -0 belongs
// in bin -1 all the same, and is moved there.
__attribute__((target("avx2,popcnt"))) uint64_t bin_avx2(const float* data, int64_t n, float scale, int bins,
                                                          uint32_t* lanes) {
  static_assert(8 % Histogram::kLaneCopies == 0, "lane copies must divide the vector width");
  const __m256 vscale = _mm256_set1_ps(scale);
  const __m256 zero = _mm256_setzero_ps();
  const __m256i vbins = _mm256_set1_epi32(bins);
  const __m256i first = _mm256_setzero_si256();
  const __m256i last = _mm256_set1_epi32(2 * bins - 1);
  const __m256i minus_one = _mm256_set1_epi32(-1);
  alignas(32) int32_t offsets[8];
  for (int k = 0; k < 8; ++k) offsets[k] = (k % Histogram::kLaneCopies) * 2 * bins;
  const __m256i voffsets = _mm256_load_si256(reinterpret_cast<const __m256i*>(offsets));
  uint64_t zeros = 0;
  int64_t i = 0;
  alignas(32) int32_t lane[8];
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(data + i);
    const __m256 y = _mm256_mul_ps(v, vscale);
    __m256i b = _mm256_cvttps_epi32(_mm256_floor_ps(y));
    const __m256 underflowed = _mm256_and_ps(_mm256_cmp_ps(y, zero, _CMP_EQ_OQ), _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
    b = _mm256_add_epi32(b, _mm256_and_si256(_mm256_castps_si256(underflowed), minus_one));
    b = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(b, vbins), first), last);
    zeros += static_cast<uint64_t>(__builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(v, zero, _CMP_EQ_OQ)))));
    const __m256i lane0 = _mm256_permutevar8x32_epi32(b, first);
    if (_mm256_movemask_epi8(_mm256_cmpeq_epi32(b, lane0)) == -1) {
      lanes[_mm256_cvtsi256_si32(b)] += 8;
      continue;
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(lane), _mm256_add_epi32(b, voffsets));
    for (int k = 0; k < 8; ++k) ++lanes[lane[k]];
  }
  return zeros + bin_scalar(data + i, n - i, static_cast<double>(scale), bins, lanes);
}
#endif

// Values per round: AVX-512 stages this many bin indices (4 KiB, stays in L1) before counting them,
// and add_scanned() scans and bins a tensor this many values at a time.
constexpr int64_t kStage = 1024;

#ifdef MPQ_CALIB_X86
// Counts staged bin indices, consecutive entries into different lane copies.
void count_staged(const int32_t* stage, int m, int bins, uint32_t* lanes) {
  static_assert(Histogram::kLaneCopies == 4, "the counting loop is unrolled for 4 lane copies");
  const size_t nbins = static_cast<size_t>(2 * bins);
  uint32_t* copy0 = lanes;
  uint32_t* copy1 = lanes + nbins;
  uint32_t* copy2 = lanes + 2 * nbins;
  uint32_t* copy3 = lanes + 3 * nbins;
  int j = 0;
  for (; j + 4 <= m; j += 4) {
    ++copy0[stage[j]];
    ++copy1[stage[j + 1]];
    ++copy2[stage[j + 2]];
    ++copy3[stage[j + 3]];
  }
  for (; j < m; ++j) ++copy0[stage[j]];
}

// Bin indices of data[0, n) (n <= kStage), 16 at a time; those of non-zero values are packed
// (vpcompressd) into `stage`, to be counted by count_staged(), a branch-free loop; the zeros (often
// half of the values: ReLU outputs, image backgrounds) are only counted, and added to the centre
// bin at once. No data-dependent branch and about half the increments. The last partial vector
// is masked. Also returns per-lane min/max and whether any value was NaN or inf (then the staged
// indices are meaningless).
struct StagedRound {
  int staged = 0;
  uint64_t zeros = 0;
  alignas(64) float lo[16];
  alignas(64) float hi[16];
  bool all_finite = true;
};
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized reports
// inside the intrinsic headers (a known false positive); silenced for this function only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Not inlined, and called only from code built for the baseline ISA: it ends every use of the
// 512-bit registers with its own vzeroupper. GCC 12 did not place one on every path out of the
// inlined version (the reductions of min/max ran after it), and the dirty upper halves made
// every SSE instruction that ran later on the thread slow: the entropy search after calibration
// took 10x as long.
//
// Few vector instructions per 16 values, since only two ports run 512-bit ones (this loop was
// half of the binning's time):
// - the index is floor(x * scale) + bins by a multiply and a conversion, both rounding toward
//   -inf: the rounded product is never above the exact one, nor below the integer under it
//   (integers this small are floats), so its floor is exact for any scale; a product below
//   float's range rounds to the denormal below it, never up to -0 (a tiny negative x stays in
//   bin -1, as in the double-precision scalar kernel);
// - one unsigned min keeps every index inside the counters: an in-range index needs no clamp
//   (|x| < R, so |x * scale| < bins), and a negative one (NaN, or a value past the range in a round
//   the caller then discards) wraps to a huge unsigned value;
// - NaN and inf are found by accumulating x * 0, which is NaN exactly for those, instead of
//   testing exponent bits per vector;
// - the zeros are n minus the values staged, counted once per round.
__attribute__((target("avx512f,avx512vl,avx2,popcnt"), noinline)) void stage_avx512(const float* data, int64_t n,
                                                                                    float scale, int bins,
                                                                                    int32_t* stage, StagedRound* r) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512i vbins = _mm512_set1_epi32(bins);
  const __m512i last = _mm512_set1_epi32(2 * bins - 1);
  const __m512 zero = _mm512_setzero_ps();
  __m512 lo = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __m512 hi = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 nonfinite = zero;  // sum of x * 0: NaN once any x was NaN or inf
  int staged = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 valid = n - i >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(valid, data + i);  // masked-off lanes read as 0
    lo = _mm512_mask_min_ps(lo, valid, lo, v);
    hi = _mm512_mask_max_ps(hi, valid, hi, v);
    nonfinite = _mm512_fmadd_ps(v, zero, nonfinite);
    const __mmask16 nonzero = _mm512_mask_cmp_ps_mask(valid, v, zero, _CMP_NEQ_UQ);
    const __m512 y = _mm512_mul_round_ps(v, vscale, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512i b = _mm512_cvt_roundps_epi32(y, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    b = _mm512_min_epu32(_mm512_add_epi32(b, vbins), last);
    // A full store past the staged count is fine: the buffer has 16 spare entries and the next
    // store starts at the new count.
    _mm512_storeu_si512(stage + staged, _mm512_maskz_compress_epi32(nonzero, b));
    staged += __builtin_popcount(static_cast<unsigned>(nonzero));
  }
  _mm512_store_ps(r->lo, lo);
  _mm512_store_ps(r->hi, hi);
  r->staged = staged;
  r->zeros = static_cast<uint64_t>(n - staged);
  r->all_finite = _mm512_cmp_ps_mask(nonfinite, nonfinite, _CMP_UNORD_Q) == 0;
  asm volatile("vzeroupper" ::: "memory");
}
#pragma GCC diagnostic pop

uint64_t bin_avx512(const float* data, int64_t n, float scale, int bins, uint32_t* lanes) {
  alignas(64) int32_t stage[kStage + 16];
  StagedRound r;
  uint64_t zeros = 0;
  for (int64_t i = 0; i < n; i += kStage) {
    stage_avx512(data + i, std::min(kStage, n - i), scale, bins, stage, &r);
    count_staged(stage, r.staged, bins, lanes);
    zeros += r.zeros;
  }
  // Exact zeros, +0 and -0, fall in bin floor(0 * scale) + bins = bins.
  lanes[bins] += static_cast<uint32_t>(zeros);
  return zeros;
}

// Scans and bins data[0, n) (n <= kStage) in one pass, with the range fixed in advance: the
// indices are staged first and counted only when every value was finite and |x| < limit, else
// nothing is counted and the caller scans and widens first.
bool scan_and_bin_avx512(const float* data, int64_t n, float scale, int bins, float limit, uint32_t* lanes,
                         uint64_t* zeros, MinMaxScan* scan) {
  alignas(64) int32_t stage[kStage + 16];
  StagedRound r;
  stage_avx512(data, n, scale, bins, stage, &r);
  if (!r.all_finite) return false;
  float lo = r.lo[0], hi = r.hi[0];
  for (int k = 1; k < 16; ++k) {
    lo = std::min(lo, r.lo[k]);
    hi = std::max(hi, r.hi[k]);
  }
  if (std::max(std::fabs(lo), std::fabs(hi)) >= limit) return false;
  count_staged(stage, r.staged, bins, lanes);
  lanes[bins] += static_cast<uint32_t>(r.zeros);
  *zeros = r.zeros;
  scan->lo = lo;
  scan->hi = hi;
  return true;
}
#endif

// Whether the vector kernels can multiply by `scale` in float (not when the range is so small that
// bins / R is past float's range).
bool float_scale(double scale) { return scale <= static_cast<double>(std::numeric_limits<float>::max()); }

uint64_t bin_values(const float* data, int64_t n, double scale, int bins, uint32_t* lanes) {
  const auto forced = static_cast<BinningKernel>(g_forced_binning.load(std::memory_order_relaxed));
#ifdef MPQ_CALIB_X86
  if (float_scale(scale)) {
    const float s = static_cast<float>(scale);
    if ((forced == BinningKernel::Auto || forced == BinningKernel::Avx512) && have_avx512())
      return bin_avx512(data, n, s, bins, lanes);
    // The AVX2 kernel rounds x * scale to nearest before its floor: exact only for a power-of-two
    // scale, so for a power-of-two bin count (R always is one). AVX-512 rounds toward -inf, which
    // keeps the floor exact for any scale.
    if (forced != BinningKernel::Scalar && have_avx2() && (bins & (bins - 1)) == 0) return bin_avx2(data, n, s, bins, lanes);
  }
#endif
  (void)forced;
  return bin_scalar(data, n, scale, bins, lanes);
}

// One pass of scan and binning over at most kStage values when the CPU has AVX-512 (see
// scan_and_bin_avx512); false when it did nothing.
bool scan_and_bin(const float* data, int64_t n, double scale, int bins, float limit, uint32_t* lanes, uint64_t* zeros,
                  MinMaxScan* scan) {
#ifdef MPQ_CALIB_X86
  if (Histogram::one_pass_available() && float_scale(scale))
    return scan_and_bin_avx512(data, n, static_cast<float>(scale), bins, limit, lanes, zeros, scan);
#endif
  (void)data, (void)n, (void)scale, (void)bins, (void)limit, (void)lanes, (void)zeros, (void)scan;
  return false;
}

// Adds the lane copies into 64-bit counts and clears them.
void fold_lanes(uint32_t* lanes, int64_t nbins, uint64_t* counts) {
  for (int c = 0; c < Histogram::kLaneCopies; ++c) {
    uint32_t* copy = lanes + c * nbins;
    for (int64_t j = 0; j < nbins; ++j) counts[j] += copy[j];
    std::fill(copy, copy + nbins, 0u);
  }
}

// Chunks for splitting one tensor over a pool: below this, thread hand-off costs more than it saves.
constexpr int64_t kMinParallelValues = int64_t{1} << 17;

int64_t chunk_count(const rt::ThreadPool* pool, int64_t n) {
  if (!pool || pool->size() <= 1 || n < kMinParallelValues) return 1;
  return std::min<int64_t>(pool->size(), n / (kMinParallelValues / 2));
}

// A value for the recorded min/max: -0 and +0 compare equal, and which one a scan keeps depends on
// the kernel and on the order the zeros come in, so a zero is recorded as +0 on every path.
double recorded(float v) { return v == 0.0f ? 0.0 : static_cast<double>(v); }

}  // namespace

BinningKernel force_binning_kernel(BinningKernel kernel) {
  g_forced_binning.store(static_cast<int>(kernel), std::memory_order_relaxed);
#ifdef MPQ_CALIB_X86
  if ((kernel == BinningKernel::Auto || kernel == BinningKernel::Avx512) && have_avx512()) return BinningKernel::Avx512;
  if (kernel != BinningKernel::Scalar && have_avx2()) return BinningKernel::Avx2;
#endif
  return BinningKernel::Scalar;
}

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
  fold();
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

uint32_t* Histogram::lanes_for(int64_t n) {
  if (lanes_.empty()) lanes_.assign(static_cast<size_t>(kLaneCopies) * counts_.size(), 0u);
  if (pending_ + static_cast<uint64_t>(n) > std::numeric_limits<uint32_t>::max()) fold();
  pending_ += static_cast<uint64_t>(n);
  return lanes_.data();
}

void Histogram::fold() const {
  if (pending_ == 0) return;
  fold_lanes(lanes_.data(), static_cast<int64_t>(counts_.size()), counts_.data());
  pending_ = 0;
}

void Histogram::add(const float* data, int64_t n, float max_abs) {
  if (!prepare(n, max_abs)) return;
  // Every kernel takes the exact floor of x * bins / R (the bin offset from the centre), so this
  // matches add_ref() bit for bit for any even bin count.
  const double scale = bins_ / range_;
  constexpr int64_t kPiece = int64_t{1} << 31;  // a 32-bit lane copy holds any one piece
  for (int64_t begin = 0; begin < n; begin += kPiece) {
    const int64_t len = std::min(kPiece, n - begin);
    exact_zeros_ += bin_values(data + begin, len, scale, bins_, lanes_for(len));
  }
}

bool Histogram::one_pass_available() {
#ifdef MPQ_CALIB_X86
  const auto forced = static_cast<BinningKernel>(g_forced_binning.load(std::memory_order_relaxed));
  return (forced == BinningKernel::Auto || forced == BinningKernel::Avx512) && have_avx512();
#else
  return false;
#endif
}

int64_t Histogram::add_scanned(const float* data, int64_t n, MinMaxScan& scan) {
  int64_t done = 0;
  while (done < n) {
    const int64_t len = std::min(kStage, n - done);
    const float* round = data + done;
    MinMaxScan r;
    uint64_t zeros = 0;
    // Once a range exists, most rounds fit it: then one pass does both (AVX-512).
    if (range_ > 0.0 && scan_and_bin(round, len, bins_ / range_, bins_, static_cast<float>(range_),
                                     lanes_for(len), &zeros, &r)) {
      total_ += static_cast<uint64_t>(len);
      exact_zeros_ += zeros;
    } else {
      r = scan_min_max(round, len);
      if (!r.all_finite) break;
      add(round, len, std::max(std::fabs(r.lo), std::fabs(r.hi)));
    }
    scan.lo = std::min(scan.lo, r.lo);
    scan.hi = std::max(scan.hi, r.hi);
    done += len;
  }
  return done;
}

void Histogram::add_parallel(const float* data, int64_t n, float max_abs, rt::ThreadPool& pool) {
  const int64_t chunks = chunk_count(&pool, n);
  if (chunks <= 1 || n > std::numeric_limits<uint32_t>::max()) return add(data, n, max_abs);
  if (!prepare(n, max_abs)) return;
  const double scale = bins_ / range_;
  const int64_t nbins = static_cast<int64_t>(counts_.size());
  const size_t lane_size = static_cast<size_t>(kLaneCopies * nbins);
  // Chunk 0 bins straight into the histogram's lanes; the others into their own, folded after.
  uint32_t* own = lanes_for(n);
  std::vector<uint32_t> local(static_cast<size_t>(chunks - 1) * lane_size, 0u);
  std::vector<uint64_t> zeros(static_cast<size_t>(chunks), 0);
  const int64_t per = (n + chunks - 1) / chunks;
  pool.parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t begin = k * per, len = std::min(n, begin + per) - begin;
      uint32_t* out = k == 0 ? own : local.data() + static_cast<size_t>(k - 1) * lane_size;
      zeros[static_cast<size_t>(k)] = bin_values(data + begin, len, scale, bins_, out);
    }
  });
  for (int64_t k = 1; k < chunks; ++k) fold_lanes(local.data() + static_cast<size_t>(k - 1) * lane_size, nbins, counts_.data());
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
    // Signed bin i covers [-R + i * R / bins, -R + (i + 1) * R / bins). x * (bins / R) is exact in
    // double (a power-of-two scale of a float), so its floor is the exact bin offset from the centre.
    const double offset = std::floor(static_cast<double>(data[i]) * (bins_ / range_));
    int idx = static_cast<int>(std::clamp(offset + bins_, 0.0, 2.0 * bins_ - 1));
    ++counts_[static_cast<size_t>(idx)];
  }
}

std::vector<uint64_t> Histogram::abs_counts(bool skip_zeros) const {
  fold();
  std::vector<uint64_t> out(static_cast<size_t>(bins_), 0);
  for (int j = 0; j < bins_; ++j)
    out[static_cast<size_t>(j)] = counts_[static_cast<size_t>(bins_ + j)] + counts_[static_cast<size_t>(bins_ - 1 - j)];
  if (range_ == 0.0) out[0] += zeros_before_range_;
  if (skip_zeros) out[0] -= exact_zeros_;
  return out;
}

void TensorStats::record(const MinMaxScan& s, int64_t n) {
  min = std::min(min, recorded(s.lo));
  max = std::max(max, recorded(s.hi));
  count += static_cast<uint64_t>(n);
}

void TensorStats::add(const float* data, int64_t n, rt::ThreadPool* pool) {
  if (n <= 0) return;
  const int64_t chunks = chunk_count(pool, n);
  MinMaxScan s;
  if (chunks <= 1 && has_histogram && Histogram::one_pass_available()) {
    // One pass in L1-sized rounds; a round with NaN or inf and everything after it take the
    // counting path. Stats are sums over values, so splitting the tensor there changes nothing.
    const int64_t done = histogram.add_scanned(data, n, s);
    if (done > 0) record(s, done);
    if (done < n) add_with_nonfinite(data + done, n - done);
    return;
  }
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
  record(s, n);
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
  min = std::min(min, recorded(lo));
  max = std::max(max, recorded(hi));
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
    min = std::min(min, recorded(v));
    max = std::max(max, recorded(v));
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
