// The measured choice of how a oneDNN convolution uses a pool of several threads (conv_onednn.cpp,
// forward_tuned): while a node state times its tactics (one thread, whole on the team, split into
// parts) every call must give the bits of the one-thread convolution, so that the choice, made from
// timings, changes nothing but the time; the state settles after its rounds; and the choice is
// not made where it does not apply (one thread, no state, OnednnUse::Always, switched off).
#include <catch2/catch.hpp>

#include <algorithm>
#include <vector>

#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/thread_pool.h"
#include "test_util.h"

using namespace mpq;

namespace {

struct TuningCase {
  const char* name;
  int64_t n, c, m, h, w, k, stride, pad;
  int64_t layout;  // 0: plain NCHW, otherwise the block (kChannelsLast: NHWC)
  bool residual, in_place, int8;
};

rt::cpu::DnnlConvShape shape_of(const TuningCase& k, const rt::cpu::Int8ConvScales* q) {
  return test::relu_conv_shape({k.n, k.c, k.m, k.h, k.w, k.k, k.stride, k.pad, k.pad, k.pad}, k.residual, k.layout,
                               k.int8 ? q : nullptr);
}

// One call: y = conv(x) (+ z), with Y in Z's buffer where the case says so (z is copied there first).
void conv_once(rt::ThreadPool& pool, const rt::cpu::DnnlConvShape& s, const TuningCase& k, const Tensor& x,
               const Tensor& w, const Tensor& b, const Tensor& z, Tensor& y, rt::cpu::OnednnConvState* st) {
  const float* zp = nullptr;
  if (k.residual) {
    if (k.in_place) {
      std::copy(z.data<float>(), z.data<float>() + z.numel(), y.data<float>());
      zp = y.data<float>();
    } else {
      zp = z.data<float>();
    }
  }
  REQUIRE(rt::cpu::onednn_conv_forward(pool, s, x.data<float>(), w.data<float>(), b.data<float>(), zp, y.data<float>(),
                                       st));
}

const int kCallsToSettle = 3 * (rt::cpu::kConvWarmupRounds + rt::cpu::kConvTimedRounds);

}  // namespace

TEST_CASE("A measured choice of threads gives the one-thread bits on every call and settles once",
          "[conv][tuning]") {
  if (!rt::cpu::onednn_enabled()) {
    WARN("oneDNN is not compiled in or is switched off: no measured choice to test");
    return;
  }
  const rt::cpu::ScopedConvTuning on(true);  // whatever MPQ_CONV_TUNING says
  const int64_t nhwc = rt::cpu::kChannelsLast, block = rt::cpu::onednn_channel_block();
  std::vector<TuningCase> cases;
  if (rt::cpu::onednn_channels_last_direct()) {
    cases.push_back({"pointwise, one image, NHWC", 1, 24, 96, 14, 14, 1, 1, 0, nhwc, false, false, false});
    cases.push_back({"3x3, a batch of 4, NHWC, residual", 4, 16, 24, 9, 11, 3, 1, 1, nhwc, true, false, false});
  }
  cases.push_back({"3x3, one image, plain, Y in Z's buffer", 1, 16, 16, 13, 11, 3, 1, 1, 0, true, true, false});
  if (block > 0)
    cases.push_back({"3x3 stride 2, a batch of 3, channel blocks", 3, 16, 32, 17, 15, 3, 2, 1, block, false, false, false});
  if (rt::cpu::onednn_int8_convolutions()) {
    cases.push_back({"int8 3x3, one image (row bands), residual", 1, 16, 32, 17, 13, 3, 1, 1, nhwc, true, false, true});
    cases.push_back({"int8 3x3, a batch of 2, Y in Z's buffer", 2, 32, 32, 9, 7, 3, 1, 1, nhwc, true, true, true});
  } else {
    WARN("oneDNN does not run exact int8 convolutions on this CPU: the int8 cases are skipped");
  }
  uint32_t seed = 7100;
  for (const TuningCase& k : cases) {
    INFO(k.name);
    const rt::cpu::Int8ConvScales q = test::int8_conv_scales(k.m, 71);
    const rt::cpu::DnnlConvShape s = shape_of(k, &q);
    // The layouts only reorder values; random values serve for any of them.
    const Tensor x = test::random_tensor({k.n, k.c, k.h, k.w}, seed++, -2.0f, 2.0f);
    const Tensor w = test::random_tensor({k.m, k.c, k.k, k.k}, seed++, -0.3f, 0.3f);
    const Tensor b = test::random_tensor({k.m}, seed++);
    const Tensor z = test::random_tensor({k.n, k.m, s.oh, s.ow}, seed++, -1.0f, 1.0f);
    Tensor want(DType::Float32, Shape{k.n, k.m, s.oh, s.ow});
    {
      rt::ThreadPool one(1);
      conv_once(one, s, k, x, w, b, z, want, nullptr);
    }
    rt::ThreadPool pool(2);
    rt::cpu::OnednnConvState st;
    const uint64_t tuned = rt::cpu::onednn_tuned_count(), splits = rt::cpu::onednn_batch_split_count();
    const uint64_t int8 = rt::cpu::onednn_int8_conv_count();
    int calls = 0;
    bool same = true;
    while (rt::cpu::onednn_tuned_count() == tuned && calls < kCallsToSettle + 1) {
      Tensor y(DType::Float32, Shape{k.n, k.m, s.oh, s.ow});
      conv_once(pool, s, k, x, w, b, z, y, &st);
      same = same && test::same_bits(y, want);
      ++calls;
    }
    CHECK(same);
    // Two tactics at least (one thread and the whole team), three where the shape can be cut:
    // a batch into images, one int8 image into bands of rows.
    const bool cut = k.n > 1 ? k.n % 2 == 0 || k.n >= 8 : k.int8;
    const int tactics = cut ? 3 : 2;
    CHECK(rt::cpu::onednn_tuned_count() == tuned + 1);
    CHECK(calls == tactics * (rt::cpu::kConvWarmupRounds + rt::cpu::kConvTimedRounds));
    // The split really ran, once a round, while measuring.
    CHECK(rt::cpu::onednn_batch_split_count() - splits ==
          (cut ? static_cast<uint64_t>(rt::cpu::kConvWarmupRounds + rt::cpu::kConvTimedRounds) : 0u));
    if (k.int8) CHECK(rt::cpu::onednn_int8_conv_count() - int8 >= static_cast<uint64_t>(calls));
    // Settled: the chosen tactic from now on, the same bits, no second choice.
    for (int i = 0; i < 5; ++i) {
      Tensor y(DType::Float32, Shape{k.n, k.m, s.oh, s.ow});
      conv_once(pool, s, k, x, w, b, z, y, &st);
      CHECK(test::same_bits(y, want));
    }
    CHECK(rt::cpu::onednn_tuned_count() == tuned + 1);
    // A new shape on the same state is measured again, with the one-thread bits.
    if (k.n > 1) {
      rt::cpu::DnnlConvShape fewer = s;
      fewer.n = 1;
      const Tensor z1 = test::random_tensor({1, k.m, s.oh, s.ow}, 7199, -1.0f, 1.0f);
      auto one_image = [&](rt::ThreadPool& p, rt::cpu::OnednnConvState* state) {
        Tensor y(DType::Float32, Shape{1, k.m, s.oh, s.ow});
        REQUIRE(rt::cpu::onednn_conv_forward(p, fewer, x.data<float>(), w.data<float>(), b.data<float>(),
                                             k.residual ? z1.data<float>() : nullptr, y.data<float>(), state));
        return y;
      };
      rt::ThreadPool one(1);
      const Tensor want1 = one_image(one, nullptr);
      const uint64_t before = rt::cpu::onednn_tuned_count();
      bool same1 = true;
      for (int i = 0; i < kCallsToSettle; ++i) same1 = same1 && test::same_bits(one_image(pool, &st), want1);
      CHECK(same1);
      CHECK(rt::cpu::onednn_tuned_count() == before + 1);
    }
  }
}

TEST_CASE("No measured choice on one thread, without a state, with OnednnUse::Always or switched off",
          "[conv][tuning]") {
  if (!rt::cpu::onednn_enabled()) {
    WARN("oneDNN is not compiled in or is switched off: no measured choice to test");
    return;
  }
  const TuningCase k{"3x3, one image, plain", 1, 16, 16, 13, 11, 3, 1, 1, 0, false, false, false};
  const rt::cpu::DnnlConvShape s = shape_of(k, nullptr);
  const Tensor x = test::random_tensor({1, 16, 13, 11}, 7201, -2.0f, 2.0f);
  const Tensor w = test::random_tensor({16, 16, 3, 3}, 7202, -0.3f, 0.3f);
  const Tensor b = test::random_tensor({16}, 7203);
  const Tensor z;
  Tensor want(DType::Float32, Shape{1, 16, 13, 11});
  rt::ThreadPool one(1), two(2);
  conv_once(one, s, k, x, w, b, z, want, nullptr);
  auto calls_settle = [&](rt::ThreadPool& pool, bool with_state) {
    rt::cpu::OnednnConvState st;
    const uint64_t tuned = rt::cpu::onednn_tuned_count();
    bool same = true;
    for (int i = 0; i < kCallsToSettle + 2; ++i) {
      Tensor y(DType::Float32, Shape{1, 16, 13, 11});
      conv_once(pool, s, k, x, w, b, z, y, with_state ? &st : nullptr);
      same = same && test::same_bits(y, want);
    }
    CHECK(same);
    return rt::cpu::onednn_tuned_count() > tuned;
  };
  {
    // Tests run with idle threads asleep (OMP_WAIT_POLICY=PASSIVE), where the size rule gives this
    // convolution one thread: the measured choice is what would use the second.
    const rt::cpu::ScopedConvTuning on(true);
    CHECK(calls_settle(two, true));  // the positive control
    CHECK_FALSE(calls_settle(one, true));
    CHECK_FALSE(calls_settle(two, false));
    {
      const rt::cpu::ScopedOnednn always(rt::cpu::OnednnUse::Always);
      CHECK_FALSE(calls_settle(two, true));
    }
  }
  const rt::cpu::ScopedConvTuning off(false);
  CHECK_FALSE(rt::cpu::conv_tuning_enabled());
  CHECK_FALSE(calls_settle(two, true));
}

TEST_CASE("The measured choice switched off and on, or a shape that keeps changing, keeps the bits",
          "[conv][tuning]") {
  if (!rt::cpu::onednn_enabled()) {
    WARN("oneDNN is not compiled in or is switched off: no measured choice to test");
    return;
  }
  const rt::cpu::ScopedConvTuning on(true);
  // A batch of 4 (whole, or split into images) and the same convolution of 2 images.
  const TuningCase k{"3x3, a batch of 4, plain, residual", 4, 16, 16, 11, 9, 3, 1, 1, 0, true, false, false};
  const rt::cpu::DnnlConvShape s4 = shape_of(k, nullptr);
  rt::cpu::DnnlConvShape s2 = s4;
  s2.n = 2;
  const Tensor x = test::random_tensor({4, 16, 11, 9}, 7301, -2.0f, 2.0f);
  const Tensor w = test::random_tensor({16, 16, 3, 3}, 7302, -0.3f, 0.3f);
  const Tensor b = test::random_tensor({16}, 7303);
  const Tensor z = test::random_tensor({4, 16, 11, 9}, 7304, -1.0f, 1.0f);
  auto conv = [&](rt::ThreadPool& pool, const rt::cpu::DnnlConvShape& s, rt::cpu::OnednnConvState* st) {
    Tensor y(DType::Float32, Shape{s.n, 16, 11, 9});
    REQUIRE(rt::cpu::onednn_conv_forward(pool, s, x.data<float>(), w.data<float>(), b.data<float>(), z.data<float>(),
                                         y.data<float>(), st));
    return y;
  };
  rt::ThreadPool one(1), two(2);
  const Tensor want4 = conv(one, s4, nullptr), want2 = conv(one, s2, nullptr);
  {
    // Off in the middle of measuring (the size rule on the same state), on again to finish, off and
    // on after the choice: every call the one-thread bits, one choice made.
    rt::cpu::OnednnConvState st;
    const uint64_t tuned = rt::cpu::onednn_tuned_count();
    bool same = true;
    for (int i = 0; i < 5; ++i) same = same && test::same_bits(conv(two, s4, &st), want4);
    for (int i = 0; i < 3; ++i) {
      const rt::cpu::ScopedConvTuning off(false);
      same = same && test::same_bits(conv(two, s4, &st), want4);
    }
    for (int i = 0; i < kCallsToSettle && rt::cpu::onednn_tuned_count() == tuned; ++i)
      same = same && test::same_bits(conv(two, s4, &st), want4);
    CHECK(rt::cpu::onednn_tuned_count() == tuned + 1);
    for (int i = 0; i < 3; ++i) {
      const rt::cpu::ScopedConvTuning off(false);
      same = same && test::same_bits(conv(two, s4, &st), want4);
    }
    for (int i = 0; i < 3; ++i) same = same && test::same_bits(conv(two, s4, &st), want4);
    CHECK(same);
    CHECK(rt::cpu::onednn_tuned_count() == tuned + 1);
  }
  {
    // Batches of 4 and 2 in turn: the state never settles, gives up measuring after a few changes
    // and keeps the size rule, also once the shape stays.
    rt::cpu::OnednnConvState st;
    const uint64_t tuned = rt::cpu::onednn_tuned_count();
    bool same = true;
    for (int i = 0; i < 2 * kCallsToSettle; ++i)
      same = same && (i % 2 ? test::same_bits(conv(two, s2, &st), want2) : test::same_bits(conv(two, s4, &st), want4));
    for (int i = 0; i < kCallsToSettle + 1; ++i) same = same && test::same_bits(conv(two, s4, &st), want4);
    CHECK(same);
    CHECK(rt::cpu::onednn_tuned_count() == tuned);
  }
}
