#pragma once
// Range (threshold) selection from streamed statistics. Each method has a fast version working on
// the histogram and a straightforward `*_ref` version kept as ground truth for tests.
#include <string>
#include <vector>

#include "calib/histogram.h"

namespace mpq::calib {

enum class RangeMethod { MinMax, Percentile, Entropy, Mse };

struct RangeMethodInfo {
  RangeMethod method;
  const char* name;
  const char* help;
  bool needs_histogram;
};
// The one table of methods: parsing, --help and the calibration table all use it.
const std::vector<RangeMethodInfo>& range_methods();
const RangeMethodInfo& range_method_info(RangeMethod m);
RangeMethod parse_range_method(const std::string& name);  // BadInput listing the valid names

struct Range {
  double lo = 0.0;    // for asymmetric quantization
  double hi = 0.0;
  double amax = 0.0;  // for symmetric quantization
};

struct RangeOptions {
  double percentile = 99.999;
  bool symmetric = true;  // percentile: one threshold on |x| (else both tails separately)
  int entropy_start_bin = 128;
  int quantized_levels = 128;  // TensorRT: 128 levels of |x| for int8
  // Entropy and MSE never clip below this percentile of the non-zero |x|. KL and error searches
  // go astray on spiky data (a constant image background, say) and can cut off the bright pixels
  // that carry the signal; the floor keeps the search to the tail it is meant to trim.
  double search_floor_percentile = 99.0;
};

Range compute_range(RangeMethod method, const TensorStats& stats, const RangeOptions& options);

// ---- fast versions on histograms
// Symmetric: the |x| value below which `percentile` % of the data lies (interpolated in-bin);
// with skip_zeros, of the non-zero data.
double percentile_abs(const Histogram& h, double percentile, bool skip_zeros = false);
// Asymmetric: the (100-p)% and p% quantiles of the signed data.
void percentile_signed(const Histogram& h, double percentile, double* lo, double* hi);
// TensorRT-style entropy calibration on the |x| histogram (exact zeros left out): for each cut i >= start_bin, P is the
// first i bins with the clipped tail folded into the last kept one, Q is those bins quantized to
// `levels` levels (each level's mass spread over its non-empty bins); returns the upper edge of the
// cut minimizing KL(P || Q).
double entropy_threshold(const Histogram& h, int start_bin, int levels);
// The threshold T minimizing the expected squared error (exact zeros, which quantize exactly, left
// out) of symmetric quantization with
// `levels` positive levels: clipping error (|x| - T)^2 above T, rounding noise step^2/12 below.
double mse_threshold(const Histogram& h, int levels);

// ---- reference versions (ground truth for tests)
// Exact percentile of |x| (or of x) by sorting the raw data (linear interpolation, like numpy).
double percentile_ref(std::vector<float> data, double percentile, bool absolute);
// The same KL search written plainly over an explicit |x| histogram (counts per bin).
double entropy_threshold_ref(const std::vector<double>& abs_counts, double bin_width, int start_bin, int levels);
// Brute force on raw data: tries thresholds at every bin edge of a `bins`-bin grid over [0, amax]
// and measures the actual fake-quantization error.
double mse_threshold_ref(const std::vector<float>& data, int levels, int bins);

}  // namespace mpq::calib
