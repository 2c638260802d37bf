#pragma once
// Streaming per-tensor statistics: running min/max, NaN/inf counts and a signed histogram over a
// symmetric range [-R, R] that widens (R doubles, neighbouring bins merge pairwise) when later data
// exceeds it. Merging keeps every earlier count in a bin that still covers its value, so nothing
// is invalidated and memory stays fixed however many samples stream through.
#include <cstdint>
#include <limits>
#include <vector>

namespace mpq::calib {

class Histogram {
 public:
  // `bins` is the resolution of |x| over [0, R] (TensorRT uses 2048); the signed histogram holds
  // twice as many. Must be even.
  explicit Histogram(int bins = 2048);

  // Adds finite values; the caller filters NaN/inf (TensorStats does).
  void add(const float* data, int64_t n, float max_abs_of_data);
  // Straightforward version kept as ground truth for add().
  void add_ref(const float* data, int64_t n);

  int bins() const { return bins_; }
  double range() const { return range_; }           // R; 0 until a non-zero value is seen
  double bin_width() const { return range_ / bins_; }
  uint64_t total() const { return total_; }
  // Signed counts: 2*bins entries covering [-R, R).
  const std::vector<uint64_t>& signed_counts() const { return counts_; }
  // Counts of |x| over [0, R): abs[j] = signed[bins + j] + signed[bins - 1 - j]. With skip_zeros
  // the exact zeros (e.g. half of every ReLU output) are left out of bin 0: they are represented
  // exactly at any scale, and their spike would otherwise dominate entropy and MSE searches.
  std::vector<uint64_t> abs_counts(bool skip_zeros = false) const;
  uint64_t exact_zeros() const { return exact_zeros_; }
  // Lower edge of signed bin i.
  double signed_edge(int i) const { return -range_ + i * bin_width(); }

 private:
  void widen_to(double max_abs);
  int bins_;
  double range_ = 0.0;
  uint64_t zeros_before_range_ = 0;  // values seen while range_ == 0 (all exactly 0)
  uint64_t total_ = 0;
  uint64_t exact_zeros_ = 0;
  std::vector<uint64_t> counts_;
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
  // One pass over the data: min/max, NaN/inf counts, then the histogram of the finite values.
  void add(const float* data, int64_t n);
  double amax() const;  // max(|min|, |max|), 0 when nothing finite was seen
};

// Per-channel min/max of a weight tensor viewed as [outer, channels, inner].
void channel_min_max(const float* w, int64_t outer, int64_t channels, int64_t inner, std::vector<float>& mins,
                     std::vector<float>& maxs);

}  // namespace mpq::calib
