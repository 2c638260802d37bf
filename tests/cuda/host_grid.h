#pragma once
// Helpers for the host-run kernel body tests: the launch shapes every body is run over, and
// comparisons that report the first mismatch.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/ops.h"

namespace mpq::test {

// Launch shapes covering n items in every way the GPU can be launched: one thread doing all of it
// through the grid-stride loop, odd block sizes smaller than n (stride loop with tails), exact
// cover with a partial last block, and more threads than items (idle threads).
inline std::vector<cuda::LaunchCtx> launches_for(int64_t n) {
  std::vector<cuda::LaunchCtx> v;
  v.push_back({cuda::LaunchShape{1, 1}});
  v.push_back({cuda::LaunchShape{3, 7}});
  v.push_back({cuda::launch_shape_for(n, 32, 2)});
  v.push_back({cuda::launch_shape_for(n, 64)});
  v.push_back({cuda::LaunchShape{(n + 4) / 5 + 2, 5}});
  return v;
}

inline std::string launch_str(const cuda::LaunchCtx& c) {
  return std::to_string(c.shape.blocks) + "x" + std::to_string(c.shape.threads);
}

// Every output starts as NaN so that an element no thread wrote shows up as a mismatch.
inline std::vector<float> nan_filled(size_t n) { return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()); }

// Index of the first element where |a - b| > atol + rtol * |b| (NaN only matches NaN), or -1.
inline int64_t first_mismatch(const float* a, const float* b, int64_t n, double rtol, double atol) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (std::isnan(a[i]) != std::isnan(b[i])) return i;
      continue;
    }
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return i;
      continue;
    }
    if (std::fabs(static_cast<double>(a[i]) - b[i]) > atol + rtol * std::fabs(static_cast<double>(b[i]))) return i;
  }
  return -1;
}

// Runs `launch(out, ctx)` for every launch shape of `expected.numel()` items (out starts as NaN)
// and checks each result against `expected` (a float32 tensor-like with numel() and data<float>()).
template <class Expected, class F>
void check_every_launch(const Expected& expected, double rtol, double atol, F launch) {
  const int64_t n = expected.numel();
  for (const cuda::LaunchCtx& c : launches_for(n)) {
    std::vector<float> out = nan_filled(static_cast<size_t>(n));
    REQUIRE(launch(out.data(), c) == 0);
    const int64_t bad = first_mismatch(out.data(), expected.template data<float>(), n, rtol, atol);
    INFO("launch " << launch_str(c) << ", element " << bad);
    if (bad >= 0) INFO("got " << out[bad] << ", expected " << expected.template data<float>()[bad]);
    CHECK(bad == -1);
  }
}

}  // namespace mpq::test
