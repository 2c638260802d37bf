#include "calib/range_methods.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace mpq::calib {

const std::vector<RangeMethodInfo>& range_methods() {
  static const std::vector<RangeMethodInfo> table = {
      {RangeMethod::MinMax, "minmax", "running min and max of every activation", false},
      {RangeMethod::Percentile, "percentile", "clip at the --percentile quantile of |x| (99.999 by default)", true},
      {RangeMethod::Entropy, "entropy", "TensorRT-style KL-divergence search over a 2048-bin |x| histogram", true},
      {RangeMethod::Mse, "mse", "the threshold minimizing expected quantization error over the histogram", true},
  };
  return table;
}

const RangeMethodInfo& range_method_info(RangeMethod m) {
  for (const auto& info : range_methods())
    if (info.method == m) return info;
  fail_internal("unknown range method");
}

RangeMethod parse_range_method(const std::string& name) {
  std::vector<std::string> names;
  for (const auto& info : range_methods()) {
    if (name == info.name) return info.method;
    names.push_back(info.name);
  }
  fail_input("unknown calibration method '{}' (choose {})", name, fmt::join(names, ", "));
}

namespace {

// Value below which `target` counts lie, interpolating linearly inside the bin.
double quantile_from_counts(const std::vector<uint64_t>& counts, double lo_edge, double width, double target) {
  double cum = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    double c = static_cast<double>(counts[i]);
    if (c > 0 && cum + c >= target) {
      double frac = (target - cum) / c;
      return lo_edge + (static_cast<double>(i) + std::clamp(frac, 0.0, 1.0)) * width;
    }
    cum += c;
  }
  return lo_edge + static_cast<double>(counts.size()) * width;
}

}  // namespace

double percentile_abs(const Histogram& h, double percentile, bool skip_zeros) {
  if (h.total() == 0 || h.range() == 0.0) return 0.0;
  std::vector<uint64_t> abs = h.abs_counts(skip_zeros);
  double target = static_cast<double>(h.total() - (skip_zeros ? h.exact_zeros() : 0)) * percentile / 100.0;
  return quantile_from_counts(abs, 0.0, h.bin_width(), target);
}

void percentile_signed(const Histogram& h, double percentile, double* lo, double* hi) {
  if (h.total() == 0 || h.range() == 0.0) {
    *lo = *hi = 0.0;
    return;
  }
  const auto& c = h.signed_counts();
  double total = static_cast<double>(h.total());
  *lo = quantile_from_counts(c, -h.range(), h.bin_width(), total * (100.0 - percentile) / 100.0);
  *hi = quantile_from_counts(c, -h.range(), h.bin_width(), total * percentile / 100.0);
}

double entropy_threshold(const Histogram& h, int start_bin, int levels) {
  if (h.total() == h.exact_zeros() || h.range() == 0.0) return 0.0;
  std::vector<uint64_t> abs = h.abs_counts(/*skip_zeros=*/true);
  const int n = static_cast<int>(abs.size());
  // Every cut up to the full range is a candidate (as in TensorRT): past the last non-empty bin P
  // only gains empty bins, but Q's grouping into levels still changes.
  const int last = n;
  // Prefix sums: counts, non-empty bins, and count*log(count). With them one cut costs O(levels):
  //   KL = (1/P) sum_j p_j log p_j - log P + log Q - (1/P) sum_k log(M_k / z_k) * (mass of P in chunk k)
  // where chunk k of the cut holds mass M_k in z_k non-empty bins, Q = sum_k M_k, and P adds the tail.
  std::vector<double> cnt(static_cast<size_t>(n) + 1, 0.0), nz(cnt), plogp(cnt);
  for (int j = 0; j < n; ++j) {
    double c = static_cast<double>(abs[static_cast<size_t>(j)]);
    cnt[static_cast<size_t>(j) + 1] = cnt[static_cast<size_t>(j)] + c;
    nz[static_cast<size_t>(j) + 1] = nz[static_cast<size_t>(j)] + (c > 0 ? 1.0 : 0.0);
    plogp[static_cast<size_t>(j) + 1] = plogp[static_cast<size_t>(j)] + (c > 0 ? c * std::log(c) : 0.0);
  }
  const double all = cnt[static_cast<size_t>(n)];
  // A chunk is `cut / levels` or one more bins wide, so one cut's chunks have two widths, and
  // consecutive cuts mostly the same ones. mass * log(mass / z) of every chunk of a width, at
  // every start, is computed once per width (two widths live) instead of once per cut and chunk:
  // the logs were most of this search's time. Same expression on the same prefix sums, so the
  // values are identical.
  auto chunk_terms = [&](int64_t w, std::vector<double>& row) {
    row.assign(static_cast<size_t>(n) + 1, 0.0);
    for (int64_t b = 0; b + w <= n; ++b) {
      const double mass = cnt[static_cast<size_t>(b + w)] - cnt[static_cast<size_t>(b)];
      if (mass > 0) row[static_cast<size_t>(b)] = mass * std::log(mass / (nz[static_cast<size_t>(b + w)] - nz[static_cast<size_t>(b)]));
    }
  };
  std::vector<double> narrow, wide;  // chunk terms of widths w0 and w0 + 1
  int64_t w0 = -1;
  double best = std::numeric_limits<double>::infinity();
  int best_cut = last;
  for (int cut = std::min(start_bin, last); cut <= last; ++cut) {
    const double last_bin = static_cast<double>(abs[static_cast<size_t>(cut - 1)]);
    const double tail = all - cnt[static_cast<size_t>(cut)];
    if (tail > 0 && last_bin == 0) continue;  // P has mass where Q has none: infinite divergence
    const double q_total = cnt[static_cast<size_t>(cut)];
    const double p_total = q_total + tail;
    if (q_total <= 0) continue;
    const double p_last = last_bin + tail;
    double sum_plogp = plogp[static_cast<size_t>(cut) - 1] + (p_last > 0 ? p_last * std::log(p_last) : 0.0);
    if (cut / levels != w0) {
      const int64_t w = cut / levels;
      if (w == w0 + 1 && !wide.empty()) {
        narrow.swap(wide);
      } else {
        chunk_terms(w, narrow);
      }
      chunk_terms(w + 1, wide);
      w0 = w;
    }
    double sum_plogq = 0.0;
    // Chunk k holds bins j with floor(j * levels / cut) == k, i.e. from ceil(k * cut / levels) to
    // ceil((k + 1) * cut / levels). The ceilings are stepped by cut / levels with a remainder
    // instead of two integer divisions per chunk (this loop runs levels times for every cut).
    const int64_t step = cut / levels, step_rem = cut % levels;
    int64_t e = 0, e_rem = 0;  // ceil(k * cut / levels) = e, with k * cut = e * levels - e_rem
    for (int k = 0; k < levels; ++k) {
      const int64_t b = e;
      e += step;
      e_rem -= step_rem;
      if (e_rem < 0) {
        ++e;
        e_rem += levels;
      }
      if (b >= e) continue;  // (e <= cut: k + 1 <= levels)
      if (e == cut) {  // the last chunk also carries the tail: computed here
        const double mass = cnt[static_cast<size_t>(e)] - cnt[static_cast<size_t>(b)];
        if (mass <= 0) continue;
        const double z = nz[static_cast<size_t>(e)] - nz[static_cast<size_t>(b)];
        sum_plogq += (mass + tail) * std::log(mass / z);
        continue;
      }
      sum_plogq += (e - b == w0 ? narrow : wide)[static_cast<size_t>(b)];
    }
    double kl = sum_plogp / p_total - std::log(p_total) + std::log(q_total) - sum_plogq / p_total;
    if (kl < best - 1e-12) {
      best = kl;
      best_cut = cut;
    }
  }
  return best_cut * h.bin_width();
}

double entropy_threshold_ref(const std::vector<double>& abs_counts, double bin_width, int start_bin, int levels) {
  const int n = static_cast<int>(abs_counts.size());
  double best = std::numeric_limits<double>::infinity();
  int best_cut = n;
  for (int cut = std::min(start_bin, n); cut <= n; ++cut) {
    std::vector<double> p(abs_counts.begin(), abs_counts.begin() + cut);
    for (int j = cut; j < n; ++j) p[static_cast<size_t>(cut - 1)] += abs_counts[static_cast<size_t>(j)];
    std::vector<double> q(static_cast<size_t>(cut), 0.0);
    for (int k = 0; k < levels; ++k) {
      double mass = 0.0;
      int nonzero = 0;
      for (int j = 0; j < cut; ++j)
        if (static_cast<int>(static_cast<int64_t>(j) * levels / cut) == k) {
          mass += abs_counts[static_cast<size_t>(j)];
          if (abs_counts[static_cast<size_t>(j)] > 0) ++nonzero;
        }
      for (int j = 0; j < cut; ++j)
        if (static_cast<int>(static_cast<int64_t>(j) * levels / cut) == k && abs_counts[static_cast<size_t>(j)] > 0)
          q[static_cast<size_t>(j)] = mass / nonzero;
    }
    double ps = std::accumulate(p.begin(), p.end(), 0.0), qs = std::accumulate(q.begin(), q.end(), 0.0);
    if (ps <= 0 || qs <= 0) continue;
    double kl = 0.0;
    for (int j = 0; j < cut; ++j) {
      double pn = p[static_cast<size_t>(j)] / ps, qn = q[static_cast<size_t>(j)] / qs;
      if (pn <= 0) continue;
      if (qn <= 0) {
        kl = std::numeric_limits<double>::infinity();
        break;
      }
      kl += pn * std::log(pn / qn);
    }
    if (kl < best) {
      best = kl;
      best_cut = cut;
    }
  }
  return best_cut * bin_width;
}

double mse_threshold(const Histogram& h, int levels) {
  if (h.total() == h.exact_zeros() || h.range() == 0.0) return 0.0;
  std::vector<uint64_t> abs = h.abs_counts(/*skip_zeros=*/true);
  const int n = static_cast<int>(abs.size());
  const double w = h.bin_width();
  int last = n;
  while (last > 1 && abs[static_cast<size_t>(last - 1)] == 0) --last;
  // Suffix sums of count, count*center and count*center^2 score each candidate in O(1):
  // sum_{j>=cut} c_j (m_j - t)^2 = S2 - 2 t S1 + t^2 S0.
  std::vector<double> s0(static_cast<size_t>(last) + 1, 0.0), s1(s0), s2(s0);
  for (int j = last - 1; j >= 0; --j) {
    double c = static_cast<double>(abs[static_cast<size_t>(j)]), m = (j + 0.5) * w;
    s0[static_cast<size_t>(j)] = s0[static_cast<size_t>(j) + 1] + c;
    s1[static_cast<size_t>(j)] = s1[static_cast<size_t>(j) + 1] + c * m;
    s2[static_cast<size_t>(j)] = s2[static_cast<size_t>(j) + 1] + c * m * m;
  }
  double best = std::numeric_limits<double>::infinity();
  double best_t = last * w;
  for (int cut = std::max(1, last / 16); cut <= last; ++cut) {
    const size_t k = static_cast<size_t>(cut);
    double t = cut * w;
    double step = t / levels;
    double below = s0[0] - s0[k];
    double err = below * step * step / 12.0 + (s2[k] - 2.0 * t * s1[k] + t * t * s0[k]);
    if (err < best) {
      best = err;
      best_t = t;
    }
  }
  return best_t;
}

double percentile_ref(std::vector<float> data, double percentile, bool absolute) {
  if (data.empty()) return 0.0;
  if (absolute)
    for (float& v : data) v = std::fabs(v);
  std::sort(data.begin(), data.end());
  double pos = percentile / 100.0 * static_cast<double>(data.size() - 1);
  size_t i = static_cast<size_t>(pos);
  size_t j = std::min(i + 1, data.size() - 1);
  double frac = pos - static_cast<double>(i);
  return data[i] * (1.0 - frac) + data[j] * frac;
}

double mse_threshold_ref(const std::vector<float>& data, int levels, int bins) {
  double amax = 0.0;
  for (float v : data) amax = std::max(amax, static_cast<double>(std::fabs(v)));
  if (amax == 0.0) return 0.0;
  double best = std::numeric_limits<double>::infinity(), best_t = amax;
  for (int k = 1; k <= bins; ++k) {
    double t = amax * k / bins;
    double scale = t / levels;
    double err = 0.0;
    for (float v : data) {
      double q = std::nearbyint(std::clamp(static_cast<double>(v) / scale, -static_cast<double>(levels), static_cast<double>(levels)));
      double d = q * scale - v;
      err += d * d;
    }
    if (err < best) {
      best = err;
      best_t = t;
    }
  }
  return best_t;
}

Range compute_range(RangeMethod method, const TensorStats& stats, const RangeOptions& o) {
  Range r;
  if (stats.count == 0) return r;
  r.lo = stats.min;
  r.hi = stats.max;
  r.amax = stats.amax();
  if (method == RangeMethod::MinMax) return r;
  if (!stats.has_histogram) fail_internal("range method {} needs a histogram", range_method_info(method).name);
  const Histogram& h = stats.histogram;
  switch (method) {
    case RangeMethod::Percentile:
      if (o.symmetric) {
        r.amax = std::min(r.amax, percentile_abs(h, o.percentile));
      } else {
        double lo = 0, hi = 0;
        percentile_signed(h, o.percentile, &lo, &hi);
        r.lo = std::max(r.lo, lo);
        r.hi = std::min(r.hi, hi);
        r.amax = std::max(std::fabs(r.lo), std::fabs(r.hi));
      }
      break;
    case RangeMethod::Entropy:
      r.amax = std::min(r.amax, std::max(entropy_threshold(h, o.entropy_start_bin, o.quantized_levels),
                                         percentile_abs(h, o.search_floor_percentile, true)));
      break;
    case RangeMethod::Mse:
      r.amax = std::min(r.amax, std::max(mse_threshold(h, o.quantized_levels),
                                         percentile_abs(h, o.search_floor_percentile, true)));
      break;
    default:
      break;
  }
  if (method != RangeMethod::Percentile || o.symmetric) {
    // Asymmetric users of a symmetric threshold: clip the observed range to it.
    r.lo = std::max(r.lo, -r.amax);
    r.hi = std::min(r.hi, r.amax);
  }
  return r;
}

}  // namespace mpq::calib
