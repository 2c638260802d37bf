// The layout conversions around an int8 convolution. quantize_to_nhwc_s8 (its input, quantized into
// oneDNN's channels-last int8 layout): its AVX-512 build against the scalar reference bit for bit,
// from NCHW (tiles of 16 channels x 16 pixels, with channel and pixel remainders) and from NHWC
// (vector tails), with values past both ends of int8, exact rounding ties, their float neighbours,
// and NaN. channels_last_to_plain (its NHWC result for an NCHW reader) against from_channel_blocks.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/quantize_nhwc.h"
#include "runtime/thread_pool.h"

using namespace mpq::rt::cpu;

namespace {

std::vector<float> awkward_values(int64_t count, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> any(-160.0f * scale, 160.0f * scale);
  std::uniform_int_distribution<int> tie(-130, 130), pick(0, 5);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) {
    switch (pick(rng)) {
      case 0: x = (static_cast<float>(tie(rng)) + 0.5f) * scale; break;  // a tie at scale 2^k
      case 1: x = std::nextafter((static_cast<float>(tie(rng)) + 0.5f) * scale, 1e9f); break;
      case 2: x = std::nextafter((static_cast<float>(tie(rng)) + 0.5f) * scale, -1e9f); break;
      case 3: x = static_cast<float>(tie(rng)) * scale; break;  // on the grid, as X always is
      default: x = any(rng);
    }
  }
  v[0] = std::numeric_limits<float>::quiet_NaN();
  v[static_cast<size_t>(count) / 2] = -std::numeric_limits<float>::infinity();
  v[static_cast<size_t>(count) - 1] = std::numeric_limits<float>::infinity();
  return v;
}

}  // namespace

TEST_CASE("quantize_to_nhwc_s8 gives its scalar reference's bits from NCHW and NHWC", "[int8_conv]") {
  if (!quantize_nhwc_avx512()) WARN("no AVX-512 on this CPU: the reference is compared with itself");
  struct Shape4 {
    int64_t n, c, h, w;
  };
  // Whole tiles (U-Net's 32 x 32 x 32 and 64 x 16 x 16 decoder inputs), channel and pixel
  // remainders, fewer channels or pixels than a tile, several images.
  for (const Shape4& s : {Shape4{1, 32, 32, 32}, Shape4{1, 64, 16, 16}, Shape4{2, 35, 9, 11}, Shape4{1, 17, 5, 7},
                          Shape4{3, 8, 3, 3}, Shape4{1, 16, 1, 17}, Shape4{2, 48, 4, 4}})
    for (const bool channels_last : {false, true}) {
      INFO(s.n << " x " << s.c << " x " << s.h << " x " << s.w << (channels_last ? " NHWC" : " NCHW"));
      const int64_t count = s.n * s.c * s.h * s.w;
      const float scale = 0.0625f;  // a power of two: the ties stay exact after the product
      const std::vector<float> x = awkward_values(count, scale, static_cast<uint32_t>(count));
      std::vector<int8_t> fast(static_cast<size_t>(count), 99), want(static_cast<size_t>(count), 77);
      quantize_to_nhwc_s8(x.data(), channels_last, s.n, s.c, s.h, s.w, 1.0f / scale, fast.data());
      quantize_to_nhwc_s8_ref(x.data(), channels_last, s.n, s.c, s.h, s.w, 1.0f / scale, want.data());
      CHECK(std::memcmp(fast.data(), want.data(), fast.size()) == 0);
      // The reference itself: layout, rounding half to even, saturation, NaN to -128.
      const auto at = [&](int64_t i, int64_t k, int64_t p) {
        return want[static_cast<size_t>((i * s.h * s.w + p) * s.c + k)];
      };
      const auto in = [&](int64_t i, int64_t k, int64_t p) {
        return x[static_cast<size_t>(channels_last ? (i * s.h * s.w + p) * s.c + k : (i * s.c + k) * s.h * s.w + p)];
      };
      CHECK(at(0, 0, 0) == -128);  // NaN
      bool all_right = true;
      for (int64_t i = 0; i < s.n; ++i)
        for (int64_t k = 0; k < s.c; ++k)
          for (int64_t p = 0; p < s.h * s.w; ++p) {
            const float v = in(i, k, p) / scale;
            if (std::isnan(v)) continue;
            const float expect = std::fmin(std::fmax(std::nearbyint(v), -128.0f), 127.0f);
            all_right = all_right && static_cast<float>(at(i, k, p)) == expect;
          }
      CHECK(all_right);
    }
  // The scalar build on request gives the same bits.
  {
    const std::vector<float> x = awkward_values(2 * 32 * 6 * 6, 0.0625f, 5);
    std::vector<int8_t> fast(x.size()), scalar(x.size());
    quantize_to_nhwc_s8(x.data(), false, 2, 32, 6, 6, 16.0f, fast.data());
    ScopedQuantizeNhwcScalar only_scalar;
    CHECK_FALSE(quantize_nhwc_avx512());
    quantize_to_nhwc_s8(x.data(), false, 2, 32, 6, 6, 16.0f, scalar.data());
    CHECK(std::memcmp(fast.data(), scalar.data(), fast.size()) == 0);
  }
}

TEST_CASE("channels_last_to_plain gives from_channel_blocks' bits", "[int8_conv]") {
  // An int8 convolution's NHWC result for a reader that takes NCHW: whole 16 x 16 tiles, channel and
  // pixel remainders, several images, and the bit patterns of NaN and -0 carried through.
  mpq::rt::ThreadPool pool(1);
  struct Shape3 {
    int64_t n, c, spatial;
  };
  for (const Shape3& s : {Shape3{1, 32, 256}, Shape3{1, 16, 1024}, Shape3{2, 35, 99}, Shape3{3, 17, 15}, Shape3{1, 2, 1024},
                          Shape3{2, 64, 64}}) {
    INFO(s.n << " x " << s.c << " x " << s.spatial);
    const int64_t count = s.n * s.c * s.spatial;
    std::vector<float> src(static_cast<size_t>(count));
    std::mt19937 rng(static_cast<uint32_t>(count));
    std::uniform_real_distribution<float> any(-5.0f, 5.0f);
    for (float& v : src) v = any(rng);
    src[1] = -0.0f;
    src[2] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> fast(src.size(), 1.0f), want(src.size(), 2.0f);
    channels_last_to_plain(src.data(), fast.data(), s.n, s.c, s.spatial);
    from_channel_blocks(pool, src.data(), want.data(), s.n, s.c, s.spatial, kChannelsLast);
    CHECK(std::memcmp(fast.data(), want.data(), fast.size() * sizeof(float)) == 0);
  }
}
