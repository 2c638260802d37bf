// mpq::GlobalAveragePool and mpq::ScaleChannels (runtime/cpu/layout_ops.cpp): a squeeze-and-
// excitation block's pool and per-channel scale on a tensor in a convolution layout (plain, 8- and
// 16-channel blocks, channels-last) give the bits of the plain GlobalAveragePool and Mul on the
// plain tensor, for odd shapes (spatial sizes under, at and past the eight partial sums, batches,
// a scale per image or one for all), on one and two threads; bad inputs are rejected by name.
#include <catch2/catch.hpp>

#include <vector>

#include "runtime/cpu/channel_blocks.h"
#include "runtime/thread_pool.h"
#include "test_util.h"

using namespace mpq;

namespace {

std::vector<ir::Attribute> layout_attr(int64_t block) { return {ir::Attribute::make_int("x_block", block)}; }

}  // namespace

TEST_CASE("mpq::GlobalAveragePool and mpq::ScaleChannels give the plain ops' bits in every layout",
          "[layout_ops]") {
  struct Case {
    int64_t n, c, h, w;
  };
  uint32_t seed = 8100;
  for (const Case& k : {Case{1, 16, 7, 7}, Case{3, 32, 5, 3}, Case{2, 48, 1, 9}, Case{1, 16, 13, 11},
                        Case{2, 16, 2, 2}, Case{1, 64, 1, 1}}) {
    const Tensor x = test::random_tensor({k.n, k.c, k.h, k.w}, seed++, -3.0f, 3.0f);
    const Tensor want_pool = test::run_node("GlobalAveragePool", {x}, {}, 1, 17, 1)[0];
    for (const int64_t scale_batch : {int64_t{1}, k.n}) {
      const Tensor s = test::random_tensor({scale_batch, k.c, 1, 1}, seed++, 0.0f, 1.0f);
      const Tensor want_scaled = test::run_node("Mul", {x, s}, {}, 1, 17, 1)[0];
      for (const int64_t block : {int64_t{0}, int64_t{8}, int64_t{16}, rt::cpu::kChannelsLast})
        for (const int threads : {1, 2}) {
          INFO(k.n << " x " << k.c << " x " << k.h << " x " << k.w << ", scale batch " << scale_batch << ", layout "
                   << block << ", " << threads << " thread(s)");
          const Tensor xl = test::in_channel_layout(x, block);
          const Tensor pooled = test::run_node("GlobalAveragePool", {xl}, layout_attr(block), 1, 17, threads, "mpq")[0];
          CHECK(pooled.shape() == want_pool.shape());
          CHECK(test::same_bits(pooled, want_pool));
          const Tensor scaled = test::run_node("ScaleChannels", {xl, s}, layout_attr(block), 1, 17, threads, "mpq")[0];
          CHECK(scaled.shape() == x.shape());
          CHECK(test::same_bits(test::from_channel_layout(scaled, block), want_scaled));
        }
    }
  }
  // Large enough to split over the threads: the same bits on two.
  const Tensor big = test::random_tensor({4, 64, 30, 30}, 8199, -1.0f, 1.0f);
  const Tensor bl = test::in_channel_layout(big, rt::cpu::kChannelsLast);
  const Tensor s = test::random_tensor({4, 64, 1, 1}, 8198);
  const auto attrs = layout_attr(rt::cpu::kChannelsLast);
  CHECK(test::same_bits(test::run_node("GlobalAveragePool", {bl}, attrs, 1, 17, 2, "mpq")[0],
                        test::run_node("GlobalAveragePool", {big}, {}, 1, 17, 1)[0]));
  CHECK(test::same_bits(test::from_channel_layout(test::run_node("ScaleChannels", {bl, s}, attrs, 1, 17, 2, "mpq")[0], rt::cpu::kChannelsLast),
                        test::run_node("Mul", {big, s}, {}, 1, 17, 1)[0]));
}

TEST_CASE("mpq::GlobalAveragePool and mpq::ScaleChannels reject bad inputs by name", "[layout_ops][negative]") {
  const Tensor x = test::random_tensor({2, 24, 5, 5}, 8201);
  const Tensor s = test::random_tensor({2, 24, 1, 1}, 8202);
  // 24 channels are not a whole number of 16-channel blocks; 4 is no layout.
  CHECK_THROWS_WITH(test::run_node("GlobalAveragePool", {x}, layout_attr(16), 1, 17, 1, "mpq"),
                    Catch::Contains("x_block 16") && Catch::Contains("24 channels"));
  CHECK_THROWS_WITH(test::run_node("ScaleChannels", {x, s}, layout_attr(4), 1, 17, 1, "mpq"),
                    Catch::Contains("x_block 4"));
  CHECK_THROWS_WITH(test::run_node("GlobalAveragePool", {test::random_tensor({2, 24, 5}, 8203)}, layout_attr(0), 1, 17, 1, "mpq"),
                    Catch::Contains("rank 4"));
  Tensor ints(DType::Int32, Shape{1, 8, 2, 2});
  CHECK_THROWS_WITH(test::run_node("GlobalAveragePool", {ints}, layout_attr(8), 1, 17, 1, "mpq"),
                    Catch::Contains("float32"));
  // A scale that is not one value per channel (per image or for all).
  for (const Shape& bad : {Shape{2, 24, 5, 5}, Shape{3, 24, 1, 1}, Shape{2, 12, 1, 1}, Shape{24}}) {
    INFO(shape_str(bad));
    CHECK_THROWS_WITH(test::run_node("ScaleChannels", {x, test::random_tensor(bad, 8204)}, layout_attr(rt::cpu::kChannelsLast),
                                     1, 17, 1, "mpq"),
                      Catch::Contains("S must be float32 [1 or 2, 24, 1, 1]") && Catch::Contains("node_under_test"));
  }
}
