// Channel-blocked convolutions (passes/block_conv_layout): the layout conversions against their
// index formula; mpq::FusedConv with x_block / z_block / y_block, through oneDNN and through mpq's
// kernels with explicit conversions (the fallback), against the plain reference, for blocks 8 and
// 16, every combination of blocked input, residual and output, odd spatial sizes, strides, pads,
// depthwise and pointwise shapes; malformed block attributes rejected.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/cpu/reference.h"
#include "runtime/executor.h"
#include "runtime/thread_pool.h"
#include "test_util.h"

using namespace mpq;
using rt::cpu::WindowGeometry;

namespace {

using Attrs = std::vector<ir::Attribute>;

struct BlockCase {
  int64_t n, c, m, group;
  std::vector<int64_t> in, kernel, strides, pads;
};

// relu(conv(x, w) + b + z), from the scalar reference.
Tensor want_of(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor* z, const BlockCase& k) {
  WindowGeometry geo;
  geo.strides = k.strides;
  geo.pads = k.pads;
  geo.group = k.group;
  Tensor y = rt::cpu::conv_ref(x, w, &b, geo);
  float* p = y.data<float>();
  for (int64_t i = 0; i < y.numel(); ++i) p[i] = std::max(0.0f, p[i] + (z ? z->data<float>()[i] : 0.0f));
  return y;
}

// Where the executor put the values named z and y, recorded by an observer that holds neither (a
// held copy would forbid the buffer reuse under test).
struct ZYBuffers {
  const void* z = nullptr;
  const void* y = nullptr;
  explicit ZYBuffers(rt::Executor& exec) {
    exec.set_observer([this](const ir::Value& v, const Tensor& t) {
      if (v.name() == "z") z = t.raw_data();
      if (v.name() == "y") y = t.raw_data();
    });
  }
  ZYBuffers(const ZYBuffers&) = delete;
  ZYBuffers& operator=(const ZYBuffers&) = delete;
};

}  // namespace

TEST_CASE("channel-blocked layout conversions follow [N, C/b, H*W, b] and invert each other", "[conv][blocked]") {
  for (const int64_t block : {8, 16}) {
    const Tensor x = test::random_tensor({2, 2 * block, 3, 5}, static_cast<uint32_t>(block));
    const Tensor b = test::in_channel_layout(x, block);
    const int64_t C = x.dim(1), S = 15;
    for (int64_t n = 0; n < 2; ++n)
      for (int64_t c = 0; c < C; ++c)
        for (int64_t s = 0; s < S; ++s)
          REQUIRE(b.data<float>()[((n * (C / block) + c / block) * S + s) * block + c % block] ==
                  x.data<float>()[(n * C + c) * S + s]);
    CHECK(test::max_abs_diff(test::from_channel_layout(b, block), x) == 0.0);
  }
  // Channels-last: one block of all C channels, NHWC.
  const Tensor x = test::random_tensor({2, 24, 3, 5}, 24);
  const Tensor nhwc = test::in_channel_layout(x, rt::cpu::kChannelsLast);
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 24; ++c)
      for (int64_t s = 0; s < 15; ++s) REQUIRE(nhwc.data<float>()[(n * 15 + s) * 24 + c] == x.data<float>()[(n * 24 + c) * 15 + s]);
  CHECK(test::max_abs_diff(test::from_channel_layout(nhwc, rt::cpu::kChannelsLast), x) == 0.0);
  CHECK(rt::cpu::valid_channel_block(0));
  CHECK(rt::cpu::valid_channel_block(8));
  CHECK(rt::cpu::valid_channel_block(16));
  CHECK(rt::cpu::valid_channel_block(rt::cpu::kChannelsLast));
  CHECK_FALSE(rt::cpu::valid_channel_block(4));
  CHECK_FALSE(rt::cpu::valid_channel_block(-2));
  CHECK(rt::cpu::fits_channel_block(rt::cpu::kChannelsLast, 24));
  CHECK_FALSE(rt::cpu::fits_channel_block(16, 24));
}

TEST_CASE("FusedConv on channel-blocked tensors matches the plain reference on both paths", "[conv][blocked]") {
  // dense 3x3, strided 3x3 with asymmetric pads, pointwise (mpq's own kernel where unblocked),
  // strided 1x1 shortcut, depthwise, grouped, and a first layer (3 plain input channels).
  const std::vector<BlockCase> cases = {
      {2, 16, 16, 1, {9, 11}, {3, 3}, {1, 1}, {1, 1, 1, 1}},
      {1, 16, 32, 1, {10, 7}, {3, 3}, {2, 2}, {0, 1, 1, 2}},
      {3, 32, 16, 1, {5, 7}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {1, 16, 32, 1, {9, 9}, {1, 1}, {2, 2}, {0, 0, 0, 0}},
      {2, 32, 32, 32, {7, 9}, {3, 3}, {2, 1}, {1, 1, 1, 1}},
      {1, 32, 32, 2, {6, 6}, {3, 3}, {1, 1}, {1, 1, 1, 1}},
      {1, 16, 16, 16, {8, 7}, {3, 3}, {1, 2}, {0, 1, 2, 1}},  // depthwise, asymmetric pads
      // Channel counts only channels-last holds: MobileNet's pointwise 24 -> 72 and 72 -> 24,
      // depthwise 72 (3x3) and 120 (5x5, strided), and a dense 3x3 of odd counts.
      {2, 24, 72, 1, {8, 8}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {2, 72, 24, 1, {7, 9}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {2, 72, 72, 72, {8, 8}, {3, 3}, {1, 1}, {1, 1, 1, 1}},
      {1, 120, 120, 120, {7, 7}, {5, 5}, {2, 2}, {2, 2, 2, 2}},
      {1, 12, 20, 1, {6, 5}, {3, 3}, {1, 1}, {1, 1, 1, 1}},
  };
  uint32_t seed = 2100;
  for (const int64_t block : {int64_t{8}, int64_t{16}, rt::cpu::kChannelsLast})
    for (const BlockCase& k : cases)
      for (int combo = 1; combo < 8; ++combo) {
        if (!rt::cpu::fits_channel_block(block, k.c) || !rt::cpu::fits_channel_block(block, k.m)) continue;
        const int64_t xb = (combo & 1) ? block : 0, zb = (combo & 2) ? block : 0, yb = (combo & 4) ? block : 0;
        INFO("block " << block << " C=" << k.c << " M=" << k.m << " group=" << k.group << " in " << shape_str(k.in)
                      << " kernel " << shape_str(k.kernel) << " x/z/y blocks " << xb << "/" << zb << "/" << yb);
        const Tensor x = test::random_tensor({k.n, k.c, k.in[0], k.in[1]}, seed++, -2.0f, 2.0f);
        const Tensor w = test::random_tensor({k.m, k.c / k.group, k.kernel[0], k.kernel[1]}, seed++);
        const Tensor b = test::random_tensor({k.m}, seed++);
        const Tensor plain = want_of(x, w, b, nullptr, k);
        const Tensor z = test::random_tensor(plain.shape(), seed++, -2.0f, 2.0f);
        const bool with_z = zb != 0 || combo % 2 == 0 || combo == 1;  // combo 1: blocked X, plain Z and Y
        const Tensor want = want_of(x, w, b, with_z ? &z : nullptr, k);
        Attrs attrs{ir::Attribute::make_int("group", k.group), ir::Attribute::make_ints("strides", k.strides),
                    ir::Attribute::make_ints("pads", k.pads), ir::Attribute::make_string("activation", "Relu"),
                    ir::Attribute::make_int("x_block", xb), ir::Attribute::make_int("y_block", yb)};
        if (with_z) attrs.push_back(ir::Attribute::make_int("z_block", zb));
        std::vector<Tensor> ins{test::in_channel_layout(x, xb), w, b};
        if (with_z) ins.push_back(test::in_channel_layout(z, zb));
        auto run = [&](int threads) {
          return test::from_channel_layout(test::run_node("FusedConv", ins, attrs, 1, 17, threads, "mpq")[0], yb);
        };
        const double tol = 1e-4 * std::max(1.0, test::max_abs_diff(want, Tensor::zeros(DType::Float32, want.shape())));
        {
          INFO("mpq's kernels with conversions");
          rt::cpu::ScopedOnednn off(rt::cpu::OnednnUse::Off);
          CHECK(test::max_abs_diff(run(2), want) <= tol);
        }
        if (rt::cpu::onednn_available()) {
          INFO("oneDNN as chosen for blocked tensors");
          const uint64_t before = rt::cpu::onednn_conv_count();
          const Tensor one = run(1), two = run(2);
          CHECK(test::max_abs_diff(one, want) <= tol);
          CHECK(test::max_abs_diff(two, want) <= tol);
          // With the CPU's own block oneDNN has a direct kernel for every one of these shapes,
          // pointwise ones included (which plain tensors leave to mpq's GEMM). Except depthwise
          // on cores where oneDNN 2.6 prefers its brdgmm kernels (AVX-512 BF16, e.g. Sapphire
          // Rapids): for a channel-blocked input it then offers only its reference kernel, and
          // mpq's kernels run with conversions (checked above to be right).
          const bool depthwise = k.group == k.c && k.c > 1;
          if (block == rt::cpu::kChannelsLast && (combo == 7 || combo == 5)) {
            // X and Y both NHWC, as block_conv_layout pairs them. The two shapes the probe plans
            // (pointwise 24 -> 72, depthwise 72) must run on oneDNN's direct kernels where the probe
            // says it takes NHWC; the others may (they do on AVX-512) or fall back to mpq's kernels.
            // (Without Z: the probe plans no residual sum.)
            const bool probed = combo == 5 && ((k.c == 24 && k.m == 72) || (k.c == 72 && k.group == 72));
            const uint64_t ran = rt::cpu::onednn_conv_count() - before;
            if (probed && rt::cpu::onednn_channels_last_direct()) CHECK(ran == 2);
            else CHECK((ran == 2 || ran == 0));
            if (ran == 2) CHECK(test::max_abs_diff(one, two) == 0.0);
          }
          if (block == rt::cpu::onednn_channel_block()) {
            if (!(depthwise && rt::cpu::onednn_bf16_cores())) CHECK(rt::cpu::onednn_conv_count() == before + 2);
            else CHECK((rt::cpu::onednn_conv_count() == before + 2 || rt::cpu::onednn_conv_count() == before));
            CHECK(test::max_abs_diff(one, two) == 0.0);
          }
        }
      }
}

TEST_CASE("A first layer writing channels-last output runs right (16 channels as nChw16c)", "[conv][blocked]") {
  // X plain with few channels (an image), Y channels-last: with 16 output channels the plan takes
  // Y as nChw16c, the same bytes, for oneDNN's direct first-layer kernel (conv_onednn.cpp); with 32
  // it must not. Odd sizes, a stride, and the fake quantization an INT8 model's stem carries.
  const std::vector<BlockCase> cases = {
      {1, 3, 16, 1, {11, 9}, {3, 3}, {1, 1}, {1, 1, 1, 1}},
      {2, 3, 16, 1, {13, 10}, {3, 3}, {2, 2}, {1, 1, 0, 1}},
      {1, 1, 16, 1, {9, 7}, {3, 3}, {1, 1}, {1, 1, 1, 1}},
      {1, 3, 32, 1, {9, 9}, {3, 3}, {1, 1}, {1, 1, 1, 1}},
  };
  uint32_t seed = 4100;
  for (const BlockCase& k : cases)
    for (const bool fake_quant : {false, true}) {
      INFO("C=" << k.c << " M=" << k.m << " N=" << k.n << " in " << shape_str(k.in) << " strides "
                << shape_str(k.strides) << (fake_quant ? " with fake quantization" : ""));
      const Tensor x = test::random_tensor({k.n, k.c, k.in[0], k.in[1]}, seed++, -2.0f, 2.0f);
      const Tensor w = test::random_tensor({k.m, k.c, k.kernel[0], k.kernel[1]}, seed++);
      const Tensor b = test::random_tensor({k.m}, seed++);
      Tensor want = want_of(x, w, b, nullptr, k);
      const float s = 0.02f;
      Attrs attrs{ir::Attribute::make_ints("strides", k.strides), ir::Attribute::make_ints("pads", k.pads),
                  ir::Attribute::make_string("activation", "Relu"),
                  ir::Attribute::make_int("y_block", rt::cpu::kChannelsLast)};
      if (fake_quant) {
        attrs.push_back(ir::Attribute::make_floats("fake_quant", {s, -128.0f, 127.0f}));
        float* p = want.data<float>();
        for (int64_t i = 0; i < want.numel(); ++i) p[i] = std::nearbyint(std::clamp(p[i] / s, -128.0f, 127.0f)) * s;
      }
      const uint64_t before = rt::cpu::onednn_conv_count();
      const Tensor got = test::from_channel_layout(test::run_node("FusedConv", {x, w, b}, attrs, 1, 17, 1, "mpq")[0],
                                   rt::cpu::kChannelsLast);
      if (rt::cpu::onednn_available()) CHECK(rt::cpu::onednn_conv_count() == before + 1);
      // Float sums in another order than the reference's: with fake quantization a value within
      // rounding of a tie may land one step away.
      const double tol = fake_quant ? s * 1.001 : 1e-4 * std::max(1.0, test::max_abs_diff(want, Tensor::zeros(DType::Float32, want.shape())));
      CHECK(test::max_abs_diff(got, want) <= tol);
      if (fake_quant) {
        int64_t off = 0;
        for (int64_t i = 0; i < want.numel(); ++i) off += got.data<float>()[i] != want.data<float>()[i];
        CHECK(off * 100 <= want.numel());
      }
    }
}

TEST_CASE("FusedConv rejects malformed channel-block attributes", "[conv][blocked][negative]") {
  const Tensor x = test::random_tensor({1, 12, 5, 5}, 1);
  const Tensor w = test::random_tensor({8, 12, 3, 3}, 2);
  auto run = [&](const Attrs& attrs, const Tensor& input) {
    return test::run_node("FusedConv", {input, w}, attrs, 1, 17, 1, "mpq");
  };
  CHECK_THROWS_WITH(run({ir::Attribute::make_int("y_block", 4)}, x),
                    Catch::Contains("node_under_test") && Catch::Contains("channel block 4"));
  CHECK_THROWS_WITH(run({ir::Attribute::make_int("x_block", 8)}, x), Catch::Contains("X has 12 channels"));
  CHECK_THROWS_WITH(run({ir::Attribute::make_int("z_block", 8)}, x), Catch::Contains("no Z input"));
  CHECK_THROWS_WITH(run({ir::Attribute::make_int("y_block", 16)}, x), Catch::Contains("output's 8 channels"));
}

TEST_CASE("FusedConv with constant weights reuses its plan and reordered weights across runs and shapes",
          "[conv][blocked][state]") {
  // One executor, one FusedConv node whose W is an initializer: its kernel object keeps oneDNN's
  // plan and the reordered weights. Runs with new inputs, a new batch size and back must each match
  // the reference (a stale plan or weight copy would not).
  ir::Model m;
  m.set_opset("", 17);
  m.set_opset("mpq", 1);
  ir::Graph& g = *m.graph;
  ir::Value* x = g.add_value("x", ir::ValueType::tensor(DType::Float32, std::vector<ir::Dim>{ir::Dim::symbol("N"), ir::Dim::fixed(16),
                                                                                ir::Dim::fixed(9), ir::Dim::fixed(7)}));
  g.add_input(x);
  const Tensor w = test::random_tensor({24, 16, 3, 3}, 7);
  const Tensor b = test::random_tensor({24}, 8);
  ir::Value* y = g.add_value("y");
  ir::Node* n = g.add_node("FusedConv", {x, g.add_initializer("w", w), g.add_initializer("b", b)}, {y}, "conv");
  n->domain = "mpq";
  n->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
  n->set_attr(ir::Attribute::make_string("activation", "Relu"));
  g.add_output(y);
  const BlockCase k{0, 16, 24, 1, {9, 7}, {3, 3}, {1, 1}, {1, 1, 1, 1}};
  rt::ExecOptions eo;
  eo.threads = 2;
  rt::Executor exec(m, eo);
  const uint64_t before = rt::cpu::onednn_conv_count();
  uint32_t seed = 3000;
  for (const int64_t batch : {1, 1, 3, 3, 1}) {
    INFO("batch " << batch);
    const Tensor in = test::random_tensor({batch, 16, 9, 7}, seed++, -2.0f, 2.0f);
    const Tensor want = want_of(in, w, b, nullptr, k);
    const Tensor got = exec.run({{"x", in}})[0];
    CHECK(test::max_abs_diff(got, want) <= 1e-3);
  }
  // The default policy sends these shapes to oneDNN where it is built in and enabled.
  if (rt::cpu::onednn_enabled()) CHECK(rt::cpu::onednn_conv_count() == before + 5);
}

TEST_CASE("Conv state is ignored inside a DeterministicBlas scope, where weights change in place",
          "[conv][state]") {
  // Training runs Conv nodes whose W is an initializer and updates W in place between steps, inside
  // a DeterministicBlas scope. The kernel object's cached reordered weights must not be used there:
  // after the update the output follows the new weights.
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph& g = *m.graph;
  ir::Value* x = g.add_value("x", ir::ValueType::tensor(DType::Float32, Shape{2, 16, 9, 7}));
  g.add_input(x);
  ir::Value* wv = g.add_initializer("w", test::random_tensor({16, 16, 3, 3}, 11));
  ir::Value* y = g.add_value("y");
  g.add_node("Conv", {x, wv}, {y}, "conv")->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
  g.add_output(y);
  rt::ExecOptions eo;
  eo.threads = 1;
  rt::Executor exec(m, eo);
  rt::cpu::ScopedOnednn always(rt::cpu::OnednnUse::Always);  // oneDNN even in the training scope
  rt::cpu::DeterministicBlas training;
  const Tensor in = test::random_tensor({2, 16, 9, 7}, 12);
  WindowGeometry geo;
  geo.pads = {1, 1, 1, 1};
  Tensor& w = const_cast<Tensor&>(wv->initializer());
  for (int step = 0; step < 3; ++step) {
    INFO("step " << step);
    const Tensor want = rt::cpu::conv_ref(in, w, nullptr, geo);
    CHECK(test::max_abs_diff(exec.run({{"x", in}})[0], want) <= 1e-4 * 10);
    float* p = w.data<float>();
    for (int64_t i = 0; i < w.numel(); ++i) p[i] = 0.5f * p[i] + 0.01f * static_cast<float>(i % 7);  // "optimizer step"
  }
}

TEST_CASE("FusedConv state with blocked input, residual and output across batch sizes", "[conv][blocked][state]") {
  // The kept plan, memory objects and reordered weights with every tensor channel-blocked and a
  // residual, run after run, switching plans (batch 1, 3, 1): each run must match the reference.
  ir::Model m;
  m.set_opset("", 17);
  m.set_opset("mpq", 1);
  ir::Graph& g = *m.graph;
  auto nchw = [](int64_t c) {
    return ir::ValueType::tensor(DType::Float32, std::vector<ir::Dim>{ir::Dim::symbol("N"), ir::Dim::fixed(c),
                                                                     ir::Dim::fixed(6), ir::Dim::fixed(5)});
  };
  ir::Value* x = g.add_value("x", nchw(16));
  ir::Value* z = g.add_value("z", nchw(8));
  g.add_input(x);
  g.add_input(z);
  const Tensor w = test::random_tensor({8, 16, 3, 3}, 21);
  const Tensor b = test::random_tensor({8}, 22);
  ir::Value* y = g.add_value("y");
  ir::Node* n = g.add_node("FusedConv", {x, g.add_initializer("w", w), g.add_initializer("b", b), z}, {y}, "conv");
  n->domain = "mpq";
  n->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
  n->set_attr(ir::Attribute::make_string("activation", "Relu"));
  for (const char* a : {"x_block", "z_block", "y_block"}) n->set_attr(ir::Attribute::make_int(a, 8));
  g.add_output(y);
  const BlockCase k{0, 16, 8, 1, {6, 5}, {3, 3}, {1, 1}, {1, 1, 1, 1}};
  rt::ExecOptions eo;
  eo.threads = 2;
  rt::Executor exec(m, eo);
  rt::cpu::ScopedOnednn always(rt::cpu::OnednnUse::Always);
  const uint64_t before = rt::cpu::onednn_conv_count();
  uint32_t seed = 3100;
  for (const int64_t batch : {1, 3, 3, 1}) {
    INFO("batch " << batch);
    const Tensor in = test::random_tensor({batch, 16, 6, 5}, seed++, -2.0f, 2.0f);
    const Tensor res = test::random_tensor({batch, 8, 6, 5}, seed++, -2.0f, 2.0f);
    const Tensor want = want_of(in, w, b, &res, k);
    const Tensor got = test::from_channel_layout(exec.run({{"x", test::in_channel_layout(in, 8)}, {"z", test::in_channel_layout(res, 8)}})[0], 8);
    CHECK(test::max_abs_diff(got, want) <= 1e-3);
  }
  // One count per convolution, also where the batch of 3 was split over the two threads.
  if (rt::cpu::onednn_available()) CHECK(rt::cpu::onednn_conv_count() == before + 4);
}

TEST_CASE("FusedConv sums into a dying Z's buffer only where nothing else can see it", "[conv][state][inplace]") {
  // z = Relu(zin); y = FusedConv(x, W, B, z) [; later = Relu(z)]. When y is z's last reader and z
  // is no graph output, y takes z's buffer (oneDNN's sum post-op adds what y holds, so no copy of
  // z is made); when z is read later, is a graph output, or is a caller's feed, it must stay as it
  // was. An observer records the buffers without holding them (a copy would forbid the reuse).
  enum class ZUse { DiesHere, ReadLater, GraphOutput, Feed };
  const BlockCase k{2, 16, 16, 1, {9, 7}, {3, 3}, {1, 1}, {1, 1, 1, 1}};
  const Tensor w = test::random_tensor({16, 16, 3, 3}, 41);
  const Tensor b = test::random_tensor({16}, 42);
  const Tensor x = test::random_tensor({2, 16, 9, 7}, 43, -2.0f, 2.0f);
  const Tensor zin = test::random_tensor({2, 16, 9, 7}, 44, -2.0f, 2.0f);
  Tensor zr(DType::Float32, zin.shape());
  for (int64_t i = 0; i < zin.numel(); ++i) zr.data<float>()[i] = std::max(0.0f, zin.data<float>()[i]);
  // The plain path, and the channel-blocked path in the block oneDNN's direct kernels take here.
  std::vector<int64_t> x_blocks{0};
  if (rt::cpu::onednn_channel_block() > 0) x_blocks.push_back(rt::cpu::onednn_channel_block());
  for (const int64_t x_block : x_blocks)
    for (const ZUse use : {ZUse::DiesHere, ZUse::ReadLater, ZUse::GraphOutput, ZUse::Feed})
      for (const int threads : {1, 2}) {
        INFO("x_block " << x_block << " z use " << static_cast<int>(use) << " threads " << threads);
        ir::Model m;
        m.set_opset("", 17);
        m.set_opset("mpq", 1);
        ir::Graph& g = *m.graph;
        ir::Value* xv = g.add_value("x", ir::ValueType::tensor(DType::Float32, Shape{2, 16, 9, 7}));
        g.add_input(xv);
        ir::Value* zv = g.add_value("z", ir::ValueType::tensor(DType::Float32, Shape{2, 16, 9, 7}));
        if (use == ZUse::Feed) {
          g.add_input(zv);
        } else {
          ir::Value* zinv = g.add_value("zin", ir::ValueType::tensor(DType::Float32, Shape{2, 16, 9, 7}));
          g.add_input(zinv);
          g.add_node("Relu", {zinv}, {zv}, "relu_in");
        }
        ir::Value* y = g.add_value("y");
        ir::Node* n = g.add_node("FusedConv", {xv, g.add_initializer("w", w), g.add_initializer("b", b), zv}, {y}, "conv");
        n->domain = "mpq";
        n->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
        n->set_attr(ir::Attribute::make_string("activation", "Relu"));
        if (x_block) n->set_attr(ir::Attribute::make_int("x_block", x_block));
        g.add_output(y);
        if (use == ZUse::ReadLater) {
          ir::Value* later = g.add_value("later");
          g.add_node("Relu", {zv}, {later}, "relu_later");
          g.add_output(later);
        }
        if (use == ZUse::GraphOutput) g.add_output(zv);
        rt::ExecOptions eo;
        eo.threads = threads;
        rt::Executor exec(m, eo);
        ZYBuffers buffers(exec);
        const Tensor feed_z = use == ZUse::Feed ? zr.clone() : Tensor();
        rt::Feeds feeds{{"x", test::in_channel_layout(x, x_block)}};
        if (use == ZUse::Feed) feeds.emplace("z", feed_z);
        else feeds.emplace("zin", zin);
        const std::vector<Tensor> outs = exec.run(feeds);
        CHECK(test::max_abs_diff(outs[0], want_of(x, w, b, &zr, k)) <= 1e-3);
        REQUIRE(buffers.y != nullptr);
        if (use == ZUse::Feed) {
          CHECK(test::max_abs_diff(feed_z, zr) == 0.0);  // the caller's tensor is untouched
        } else {
          REQUIRE(buffers.z != nullptr);
          // The reuse itself, where oneDNN runs the convolution (it adds what Y holds).
          if (use == ZUse::DiesHere && rt::cpu::onednn_enabled()) CHECK(buffers.y == buffers.z);
          if (use != ZUse::DiesHere) CHECK(buffers.y != buffers.z);
          if (use == ZUse::ReadLater) CHECK(test::max_abs_diff(outs[1], zr) == 0.0);
          if (use == ZUse::GraphOutput) CHECK(test::max_abs_diff(outs[1], zr) == 0.0);
        }
      }
}

TEST_CASE("Conv keeps its checks per shape: a new shape is checked and derived again", "[conv][state][negative]") {
  // ConvKernel keeps the last call's attribute reads and shape checks while X, W and B keep their
  // shapes; Z is checked on every call. One executor: a good run, a Z of the wrong batch (must be
  // refused even though X's shape is the one already seen), X with a new spatial size (output size
  // derived again), and the first shape again.
  ir::Model m;
  m.set_opset("", 17);
  m.set_opset("mpq", 1);
  ir::Graph& g = *m.graph;
  auto sym = [](const char* n) { return ir::Dim::symbol(n); };
  ir::Value* x = g.add_value("x", ir::ValueType::tensor(DType::Float32, std::vector<ir::Dim>{sym("N"), ir::Dim::fixed(16),
                                                                                sym("H"), sym("W")}));
  ir::Value* z = g.add_value("z", ir::ValueType::tensor(DType::Float32, std::vector<ir::Dim>{sym("NZ"), ir::Dim::fixed(16),
                                                                                sym("HZ"), sym("WZ")}));
  g.add_input(x);
  g.add_input(z);
  const Tensor w = test::random_tensor({16, 16, 3, 3}, 51);
  const Tensor b = test::random_tensor({16}, 52);
  ir::Value* y = g.add_value("y");
  ir::Node* n = g.add_node("FusedConv", {x, g.add_initializer("w", w), g.add_initializer("b", b), z}, {y}, "conv");
  n->domain = "mpq";
  n->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
  n->set_attr(ir::Attribute::make_string("activation", "Relu"));
  g.add_output(y);
  rt::ExecOptions eo;
  eo.threads = 2;
  rt::Executor exec(m, eo);
  uint32_t seed = 5000;
  auto check = [&](int64_t batch, int64_t h, int64_t wd) {
    INFO("batch " << batch << " " << h << "x" << wd);
    const BlockCase k{batch, 16, 16, 1, {h, wd}, {3, 3}, {1, 1}, {1, 1, 1, 1}};
    const Tensor in = test::random_tensor({batch, 16, h, wd}, seed++, -2.0f, 2.0f);
    const Tensor zin = test::random_tensor({batch, 16, h, wd}, seed++, -2.0f, 2.0f);
    const Tensor got = exec.run({{"x", in}, {"z", zin}})[0];
    REQUIRE(got.shape() == Shape{batch, 16, h, wd});
    CHECK(test::max_abs_diff(got, want_of(in, w, b, &zin, k)) <= 1e-3);
  };
  check(2, 9, 7);
  CHECK_THROWS_WITH(exec.run({{"x", test::random_tensor({2, 16, 9, 7}, 1)}, {"z", test::random_tensor({3, 16, 9, 7}, 2)}}),
                    Catch::Contains("conv") && Catch::Contains("Z is float32[3,16,9,7]"));
  check(2, 9, 7);
  check(2, 5, 11);
  CHECK_THROWS_WITH(exec.run({{"x", test::random_tensor({2, 16, 5, 11}, 3)}, {"z", test::random_tensor({2, 16, 9, 7}, 4)}}),
                    Catch::Contains("Z is float32[2,16,9,7]"));
  check(1, 9, 7);
  check(2, 9, 7);
}

TEST_CASE("FusedConv sums in place into a dying channel-blocked Z", "[conv][state][inplace][blocked]") {
  // z = FusedConv(zin) writing the CPU's block; y = FusedConv(x, W, B, z) with X, Z and Y in that
  // block: oneDNN's direct kernel reads and writes that layout, so Z is neither copied nor
  // reordered when Y takes its buffer.
  const int64_t block = rt::cpu::onednn_channel_block();
  if (block == 0) return;  // built without oneDNN, or switched off: nothing reuses here
  const BlockCase k{2, 16, 16, 1, {9, 7}, {3, 3}, {1, 1}, {1, 1, 1, 1}};
  const Tensor w = test::random_tensor({16, 16, 3, 3}, 81);
  const Tensor b = test::random_tensor({16}, 82);
  const Tensor wz = test::random_tensor({16, 16, 3, 3}, 83);
  const Tensor bz = test::random_tensor({16}, 84);
  const Tensor x = test::random_tensor({2, 16, 9, 7}, 85, -2.0f, 2.0f);
  const Tensor zin = test::random_tensor({2, 16, 9, 7}, 86, -2.0f, 2.0f);
  WindowGeometry geo;
  geo.pads = {1, 1, 1, 1};
  const Tensor z = rt::cpu::conv_ref(zin, wz, &bz, geo);
  const Tensor want = want_of(x, w, b, &z, k);
  // Every thread, however small the convolution: at two threads both batches are split over the
  // threads (one image each), and Y still takes Z's buffer.
  rt::cpu::ScopedOnednn always(rt::cpu::OnednnUse::Always);
  for (const int threads : {1, 2}) {
    INFO(threads << " thread(s)");
    ir::Model m;
    m.set_opset("", 17);
    m.set_opset("mpq", 1);
    ir::Graph& g = *m.graph;
    ir::Value* xv = g.add_value("x", ir::ValueType::tensor(DType::Float32, Shape{2, 16, 9, 7}));
    ir::Value* zinv = g.add_value("zin", ir::ValueType::tensor(DType::Float32, Shape{2, 16, 9, 7}));
    g.add_input(xv);
    g.add_input(zinv);
    ir::Value* zv = g.add_value("z");
    ir::Node* zn = g.add_node("FusedConv", {zinv, g.add_initializer("wz", wz), g.add_initializer("bz", bz)}, {zv}, "zconv");
    zn->domain = "mpq";
    zn->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
    zn->set_attr(ir::Attribute::make_int("y_block", block));
    ir::Value* y = g.add_value("y");
    ir::Node* n = g.add_node("FusedConv", {xv, g.add_initializer("w", w), g.add_initializer("b", b), zv}, {y}, "conv");
    n->domain = "mpq";
    n->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
    n->set_attr(ir::Attribute::make_string("activation", "Relu"));
    for (const char* a : {"x_block", "z_block", "y_block"}) n->set_attr(ir::Attribute::make_int(a, block));
    g.add_output(y);
    rt::ExecOptions eo;
    eo.threads = threads;
    rt::Executor exec(m, eo);
    ZYBuffers buffers(exec);
    const uint64_t before = rt::cpu::onednn_conv_count();
    const uint64_t split_before = rt::cpu::onednn_batch_split_count();
    const Tensor got = exec.run({{"x", test::in_channel_layout(x, block)}, {"zin", zin}})[0];
    CHECK(rt::cpu::onednn_conv_count() == before + 2);
    CHECK(rt::cpu::onednn_batch_split_count() == split_before + (threads == 2 ? 2 : 0));
    CHECK(test::max_abs_diff(test::from_channel_layout(got, block), want) <= 1e-3);
    REQUIRE(buffers.z != nullptr);
    CHECK(buffers.y == buffers.z);
  }
}

TEST_CASE("A batch split over the threads gives each image the bits of the whole-batch convolution",
          "[conv][state][split]") {
  // With constant weights, a batch and two threads, oneDNN convolves each thread's images with a
  // single-thread primitive (one part per thread; an odd batch of 8 or more gives parts of different
  // sizes, a smaller odd one stays whole, as does a batch of one). Every image must come out as the
  // one-thread, whole-batch convolution computes it, on the plain, channel-blocked and channels-last
  // paths, with a residual.
  if (!rt::cpu::onednn_available()) {
    WARN("oneDNN is not compiled in: no batch split to test");
    return;
  }
  rt::cpu::ScopedOnednn always(rt::cpu::OnednnUse::Always);
  const BlockCase k{0, 16, 16, 1, {11, 9}, {3, 3}, {1, 1}, {1, 1, 1, 1}};
  const Tensor w = test::random_tensor({16, 16, 3, 3}, 51);
  const Tensor b = test::random_tensor({16}, 52);
  std::vector<int64_t> blocks{0};
  if (rt::cpu::onednn_channel_block() > 0) blocks.push_back(rt::cpu::onednn_channel_block());
  if (rt::cpu::onednn_channels_last_direct()) blocks.push_back(rt::cpu::kChannelsLast);
  for (const int64_t block : blocks) {
    ir::Model m;
    m.set_opset("", 17);
    m.set_opset("mpq", 1);
    ir::Graph& g = *m.graph;
    auto type = [] {
      return ir::ValueType::tensor(DType::Float32, std::vector<ir::Dim>{ir::Dim::symbol("N"), ir::Dim::fixed(16),
                                                                       ir::Dim::fixed(11), ir::Dim::fixed(9)});
    };
    ir::Value* x = g.add_value("x", type());
    ir::Value* z = g.add_value("z", type());
    g.add_input(x);
    g.add_input(z);
    ir::Value* y = g.add_value("y");
    ir::Node* n = g.add_node("FusedConv", {x, g.add_initializer("w", w), g.add_initializer("b", b), z}, {y}, "conv");
    n->domain = "mpq";
    n->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
    n->set_attr(ir::Attribute::make_string("activation", "Relu"));
    if (block)
      for (const char* a : {"x_block", "z_block", "y_block"}) n->set_attr(ir::Attribute::make_int(a, block));
    g.add_output(y);
    rt::ExecOptions one, two;
    one.threads = 1;
    two.threads = 2;
    two.split_rows = false;  // the convolution's own split, not the executor's (batch_rows_test)
    rt::Executor whole(m, one), split(m, two);
    uint32_t seed = 5200;
    for (const int64_t batch : {9, 8, 1, 3, 2}) {
      INFO("block " << block << " batch " << batch);
      const Tensor in = test::random_tensor({batch, 16, 11, 9}, seed++, -2.0f, 2.0f);
      const Tensor res = test::random_tensor({batch, 16, 11, 9}, seed++, -2.0f, 2.0f);
      const rt::Feeds feeds{{"x", test::in_channel_layout(in, block)}, {"z", test::in_channel_layout(res, block)}};
      const Tensor want = whole.run(feeds)[0];
      const uint64_t before = rt::cpu::onednn_batch_split_count();
      const Tensor got = split.run(feeds)[0];
      const bool splits = batch > 1 && (batch % 2 == 0 || batch >= 8);
      CHECK(rt::cpu::onednn_batch_split_count() == before + (splits ? 1 : 0));
      CHECK(test::max_abs_diff(got, want) == 0.0);
      CHECK(test::max_abs_diff(test::from_channel_layout(got, block), want_of(in, w, b, &res, k)) <= 1e-3);
    }
  }
}
