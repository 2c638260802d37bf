#pragma once
// Streaming per-tensor statistics: running min/max, NaN/inf counts and a signed histogram over a
// symmetric range [-R, R] that widens (R doubles, neighbouring bins merge pairwise) when later data
// exceeds it. Merging keeps every earlier count in a bin that still covers its value, so nothing
// is invalidated and memory stays fixed however many samples stream through.
//
// Calibration reads every float activation once more after the executor produced it, so the two
// passes here (min/max scan, then binning) are vectorized (binning with AVX-512 or AVX2, the scan
// with AVX2, whichever the CPU has) and can be split over a thread pool for large tensors; the
// plain loops stay as `*_ref` ground truth.
#include <cstdint>
#include <limits>
#include <vector>

namespace mpq::rt {
class ThreadPool;
}

namespace mpq::calib {

// One pass over `n` floats: min and max of the data and whether every value is finite. When
// `all_finite` is false, lo/hi are unspecified (callers take the slow path that counts NaN/inf).
struct MinMaxScan {
  float lo = std::numeric_limits<float>::infinity();
  float hi = -std::numeric_limits<float>::infinity();
  bool all_finite = true;
};
MinMaxScan scan_min_max(const float* data, int64_t n);
MinMaxScan scan_min_max_ref(const float* data, int64_t n);

// The binning kernels, widest first. Auto takes the widest the CPU has.
enum class BinningKernel { Auto, Avx512, Avx2, Scalar };
// For tests: makes every Histogram bin with `kernel` (or the next narrower one the CPU has) from
// now on, process-wide; returns the kernel that will run. Auto restores the default.
BinningKernel force_binning_kernel(BinningKernel kernel);

class Histogram {
 public:
  // Binning counts into this many interleaved 32-bit copies of the counters (see lanes_).
  static constexpr int kLaneCopies = 4;

  // `bins` is the resolution of |x| over [0, R] (TensorRT uses 2048); the signed histogram holds
  // twice as many. Must be even.
  explicit Histogram(int bins = 2048);

  // Adds finite values; the caller filters NaN/inf (TensorStats does).
  void add(const float* data, int64_t n, float max_abs_of_data);
  // Same, with the binning split over the pool's threads (each chunk into its own counts, summed).
  void add_parallel(const float* data, int64_t n, float max_abs_of_data, rt::ThreadPool& pool);
  // Scans and bins in rounds of a few KiB, each scanned for min/max and finiteness and then binned
  // while still in L1, instead of two passes over the whole tensor. Each round is added as add()
  // would add it; the streamed result equals one add() because widening only merges bins.
  // Stops before the first round holding NaN or inf and returns how many values it consumed;
  // `scan` gets min/max of those.
  int64_t add_scanned(const float* data, int64_t n, MinMaxScan& scan);
  // Whether add_scanned() does scan and binning in one pass here (AVX-512); elsewhere it is two
  // passes per round, and TensorStats scans the whole tensor first instead.
  static bool one_pass_available();
  // Straightforward version kept as ground truth for add().
  void add_ref(const float* data, int64_t n);

  int bins() const { return bins_; }
  double range() const { return range_; }           // R; 0 until a non-zero value is seen
  double bin_width() const { return range_ / bins_; }
  uint64_t total() const { return total_; }
  // Signed counts: 2*bins entries covering [-R, R).
  const std::vector<uint64_t>& signed_counts() const {
    fold();
    return counts_;
  }
  // Counts of |x| over [0, R): abs[j] = signed[bins + j] + signed[bins - 1 - j]. With skip_zeros
  // the exact zeros (e.g. half of every ReLU output) are left out of bin 0: they are represented
  // exactly at any scale, and their spike would otherwise dominate entropy and MSE searches.
  std::vector<uint64_t> abs_counts(bool skip_zeros = false) const;
  uint64_t exact_zeros() const { return exact_zeros_; }
  // Lower edge of signed bin i.
  double signed_edge(int i) const { return -range_ + i * bin_width(); }

 private:
  // Counts n values and widens the range to cover max_abs; false when nothing is left to bin
  // (all zeros while no range exists yet).
  bool prepare(int64_t n, float max_abs);
  void widen_to(double max_abs);
  // Binning into lanes_ the n values about to be added, folding first if a 32-bit copy could
  // overflow.
  uint32_t* lanes_for(int64_t n);
  // Adds lanes_ into counts_ and clears them. Reads call it, hence const; a Histogram is read by
  // one thread at a time, as it is written.
  void fold() const;
  int bins_;
  double range_ = 0.0;
  uint64_t zeros_before_range_ = 0;  // values seen while range_ == 0 (all exactly 0)
  uint64_t total_ = 0;
  uint64_t exact_zeros_ = 0;
  // Binning increments kLaneCopies copies of the 2*bins counters, neighbouring values into
  // different copies: values in one bin (a ReLU's zeros, a smooth feature map) then increment
  // different counters instead of waiting on each other's stores. The copies are 32-bit (four take
  // 64 KiB at 2,048 bins, of which a ReLU output touches the upper half) and are folded into
  // counts_ before any read, any widening, and before pending_ could overflow one of them.
  mutable std::vector<uint32_t> lanes_;
  mutable uint64_t pending_ = 0;  // values binned into lanes_ since the last fold
  mutable std::vector<uint64_t> counts_;
};

struct TensorStats {
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  uint64_t count = 0;  // finite values
  uint64_t nan_count = 0;
  uint64_t inf_count = 0;
  bool has_histogram = false;
  Histogram histogram;

  explicit TensorStats(bool with_histogram, int bins = 2048) : has_histogram(with_histogram), histogram(bins) {}
  // Min/max, NaN/inf counts, then the histogram of the finite values. With a pool (of more than
  // one thread) both passes are split into chunks over its threads.
  void add(const float* data, int64_t n, rt::ThreadPool* pool = nullptr);
  // Straightforward version (scalar loops, the reference histogram) kept as ground truth.
  void add_ref(const float* data, int64_t n);
  double amax() const;  // max(|min|, |max|), 0 when nothing finite was seen

 private:
  void add_with_nonfinite(const float* data, int64_t n);
  // Min, max and count of n finite values scanned as `s`.
  void record(const MinMaxScan& s, int64_t n);
};

// Per-channel min/max of a weight tensor viewed as [outer, channels, inner].
void channel_min_max(const float* w, int64_t outer, int64_t channels, int64_t inner, std::vector<float>& mins,
                     std::vector<float>& maxs);

}  // namespace mpq::calib
