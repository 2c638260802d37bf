// mark_int8_conv and oneDNN's int8 convolutions: a QDQ model's convolutions whose input and weights
// are on int8 grids run in integers (mpq::FusedConv's int8_scales), with the float path's results
// to float rounding (the integer sums are exact; the float path rounds its sums); the guarded cases
// stay in float; the weight grid is found per channel, per tensor and for 4-bit weights; a batch
// split over threads gives the unsplit batch's bits; a malformed attribute is refused naming the node.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "ir/verify.h"
#include "passes/inference_fusion.h"
#include "passes/int8_conv.h"
#include "runtime/batch_rows.h"
#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/executor.h"
#include "runtime/thread_pool.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;

namespace {

struct Options {
  int64_t n = 2, c = 16, h = 9, w = 7;  // odd spatial sizes
  int64_t m1 = 16, m2 = 24, k = 3;      // conv1 C -> m1 (k x k), conv2 m1 -> m2 (3x3, stride 2)
  int64_t group = 1;
  int zero_point = 0;        // of the activations' Q/DQ (uint8 with 0: a range of [0, 255])
  bool uint8 = false;
  bool float_weights = false;  // conv1's weights plain floats, not a DequantizeLinear
  bool per_tensor = false;     // one weight scale per convolution
  bool residual = false;       // conv2's output + a 1x1 projection of conv1's, then Relu
  bool third = false;          // then Q/DQ -> conv3 (m2 -> m2, 3x3) -> Relu: conv2 between two int8 ones
};

Tensor int8_values(const Shape& shape, uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(lo, hi);
  Tensor t(DType::Int8, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int8_t>()[i] = static_cast<int8_t>(dist(rng));
  return t;
}

// DequantizeLinear of int8 weights [m, c, k, k] (per channel, or one scale), as `mpq quantize`
// writes them; fuse_for_inference folds it into a float initializer.
Value* quantized_weights(Graph& g, const std::string& name, const Shape& shape, uint32_t seed, bool per_tensor) {
  Tensor q = int8_values(shape, seed, -127, 127);
  const int64_t m = shape[0];
  Value* scale = per_tensor ? g.add_initializer(name + "_s", Tensor::from<float>({}, {0.0123f}))
                            : g.add_initializer(name + "_s", test::random_tensor({m}, seed + 1, 0.004f, 0.02f));
  Value* zero = per_tensor ? g.add_initializer(name + "_z", Tensor::from<int8_t>({}, {0}))
                           : g.add_initializer(name + "_z", Tensor::from<int8_t>({m}, std::vector<int8_t>(m, 0)));
  Value* out = g.add_value(name);
  Node* dq = g.add_node("DequantizeLinear", {g.add_initializer(name + "_q", std::move(q)), scale, zero}, {out}, name + "_dq");
  if (!per_tensor) dq->set_attr(Attribute::make_int("axis", 0));
  return out;
}

// QuantizeLinear -> DequantizeLinear of an activation (one scale).
Value* qdq(Graph& g, Value* v, const std::string& name, float scale, const Options& o) {
  return test::add_qdq(g, v, name, scale, o.uint8, o.zero_point);
}

// x -> Q/DQ -> conv1 (+ Relu) -> Q/DQ -> conv2 (stride 2) [+ 1x1 projection of conv1's] -> Relu
//   [-> Q/DQ -> conv3 -> Relu] -> y
Model qdq_model(const Options& o) {
  Model m;
  m.set_opset("", 13);
  Graph& g = *m.graph;
  // A symbolic batch, so that the executor may split a batch over its threads (a fixed one cannot
  // be fed in parts).
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{o.n, o.c, o.h, o.w}));
  x->type.dims[0] = Dim::symbol("batch");
  g.add_input(x);
  Value* w1 = o.float_weights ? g.add_initializer("w1", test::random_tensor({o.m1, o.c / o.group, o.k, o.k}, 5, -0.2f, 0.2f))
                              : quantized_weights(g, "w1", {o.m1, o.c / o.group, o.k, o.k}, 5, o.per_tensor);
  Value* c1 = g.add_value("c1");
  Node* conv1 = g.add_node("Conv", {qdq(g, x, "xq", 0.02f, o), w1, g.add_initializer("b1", test::random_tensor({o.m1}, 6))},
                           {c1}, "conv1");
  conv1->set_attr(Attribute::make_ints("pads", {o.k / 2, o.k / 2, o.k / 2, o.k / 2}));
  conv1->set_attr(Attribute::make_int("group", o.group));
  Value* r1 = g.add_value("r1");
  g.add_node("Relu", {c1}, {r1}, "relu1");
  Value* a1 = qdq(g, r1, "aq", 0.015f, o);
  Value* c2 = g.add_value("c2");
  Node* conv2 = g.add_node("Conv", {a1, quantized_weights(g, "w2", {o.m2, o.m1, 3, 3}, 7, o.per_tensor),
                                    g.add_initializer("b2", test::random_tensor({o.m2}, 8))},
                           {c2}, "conv2");
  conv2->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
  conv2->set_attr(Attribute::make_ints("strides", {2, 2}));
  Value* sum = c2;
  if (o.residual) {
    Value* p = g.add_value("p");
    Node* proj = g.add_node("Conv", {a1, quantized_weights(g, "wp", {o.m2, o.m1, 1, 1}, 9, o.per_tensor)}, {p}, "proj");
    proj->set_attr(Attribute::make_ints("strides", {2, 2}));
    sum = g.add_value("sum");
    g.add_node("Add", {c2, p}, {sum}, "add");
  }
  Value* y = g.add_value("y");
  g.add_node("Relu", {sum}, {y}, "relu2");
  if (o.third) {
    Value* c3 = g.add_value("c3");
    Node* conv3 = g.add_node("Conv", {qdq(g, y, "bq", 0.01f, o), quantized_weights(g, "w3", {o.m2, o.m2, 3, 3}, 10, o.per_tensor)},
                             {c3}, "conv3");
    conv3->set_attr(Attribute::make_ints("pads", {1, 1, 1, 1}));
    y = g.add_value("y3");
    g.add_node("Relu", {c3}, {y}, "relu3");
  }
  g.add_output(y);
  return m;
}

Node* node_named(Model& m, const std::string& name) {
  for (const auto& n : m.graph->nodes())
    if (n->name == name) return n.get();
  return nullptr;
}

// The model as `mpq run` prepares it, checked by the IR verifier.
Model fused(const Options& o) {
  Model m = qdq_model(o);
  passes::fuse_for_inference(m, rt::BackendKind::CPU);
  REQUIRE(verify(m).empty());
  return m;
}

// Whether this machine runs int8 convolutions (oneDNN with VNNI); where not, fuse_for_inference
// marks nothing and the tests below say so.
bool int8_here() {
  if (rt::cpu::onednn_int8_convolutions()) return true;
  WARN("oneDNN does not run exact int8 convolutions on this CPU (no VNNI, or oneDNN off): skipped");
  return false;
}

Tensor run(const Model& m, const rt::Feeds& feeds, int threads, bool split_rows = true) {
  rt::ExecOptions eo;
  eo.threads = threads;
  eo.split_rows = split_rows;
  rt::Executor ex(m, eo);
  return ex.run(feeds)[0];
}

// The same model with every int8_scales attribute dropped: all in float.
Model in_float(const Model& m) {
  Model f = m.clone();
  for (const auto& n : f.graph->nodes()) n->remove_attr("int8_scales");
  return f;
}


}  // namespace

TEST_CASE("int8_weight_scales finds the grid of dequantized int8 weights", "[int8_conv]") {
  Tensor q = int8_values({5, 3, 3, 3}, 11, -127, 127);
  q.data<int8_t>()[0] = 127;  // channel 0 reaches the end of the range
  const std::vector<float> scale{0.01f, 0.002f, 0.3f, 1e-4f, 0.05f};
  Tensor w(DType::Float32, q.shape());
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = static_cast<float>(q.data<int8_t>()[i]) * scale[i / 27];
  SECTION("per channel, whatever a channel's largest value") {
    const std::vector<float> s = passes::int8_weight_scales(w);
    REQUIRE(s.size() == 5);
    for (size_t m = 0; m < 5; ++m)
      for (int64_t i = 0; i < 27; ++i) {
        const float t = w.data<float>()[static_cast<int64_t>(m) * 27 + i] / s[m];
        CHECK(std::fabs(t - std::nearbyint(t)) < 1e-3f);
        CHECK(std::fabs(t) <= 127.5f);
      }
    CHECK(s[0] == Approx(0.01f).epsilon(1e-6));
  }
  SECTION("4-bit values, an all-zero channel") {
    Tensor w4 = w;
    for (int64_t i = 0; i < w4.numel(); ++i) w4.data<float>()[i] = static_cast<float>(q.data<int8_t>()[i] % 8) * 0.25f;
    for (int64_t i = 27; i < 54; ++i) w4.data<float>()[i] = 0.0f;
    const std::vector<float> s = passes::int8_weight_scales(w4);
    REQUIRE(s.size() == 5);
    // The finest grid within int8 that holds every value: 0.25 is a whole number of its steps
    // (1.75 / 126 here, 18 steps; every 4-bit value times 18 fits in [-127, 127]).
    for (const size_t m : {size_t{0}, size_t{2}}) {
      const float steps = 0.25f / s[m];
      CHECK(std::fabs(steps - std::nearbyint(steps)) < 1e-3f);
    }
    CHECK(s[1] == 1.0f);  // the all-zero channel
  }
  SECTION("float weights have none") {
    CHECK(passes::int8_weight_scales(test::random_tensor({4, 8, 3, 3}, 12)).empty());
    Tensor off = w;
    off.data<float>()[40] += 0.3f * scale[1];  // one value between two steps of channel 1
    CHECK(passes::int8_weight_scales(off).empty());
  }
}

TEST_CASE("mark_int8_conv marks convolutions on int8 grids and leaves the others in float", "[int8_conv]") {
  if (!int8_here()) return;
  SECTION("both convolutions of the QDQ model, the second reading the first's fused fake quantization") {
    Model m = fused(Options{});
    Node* conv1 = node_named(m, "conv1");
    Node* conv2 = node_named(m, "conv2");
    REQUIRE(conv1);
    REQUIRE(conv2);
    REQUIRE(conv1->has_attr("fake_quant"));  // the Q/DQ after it, fused (the input grid conv2 reads)
    for (Node* n : {conv1, conv2}) {
      REQUIRE(n->has_attr("int8_scales"));
      CHECK(static_cast<int64_t>(n->attr_floats("int8_scales", {}).size()) == 1 + constant_value(n->input(1))->dim(0));
    }
    CHECK(conv1->attr_floats("int8_scales", {})[0] == 0.02f);   // X's Q/DQ scale
    CHECK(conv2->attr_floats("int8_scales", {})[0] == 0.015f);  // conv1's fused fake quantization
  }
  SECTION("per-tensor weights are on a grid too") {
    Model m = fused(Options{.per_tensor = true});
    CHECK(node_named(m, "conv1")->has_attr("int8_scales"));
  }
  SECTION("guarded cases") {
    Options o;
    SECTION("float weights") { o.float_weights = true; }
    SECTION("uint8 activations with zero point 0: [0, 255] is no int8 range") { o.uint8 = true; }
    SECTION("grouped") { o.group = 2; }
    SECTION("fewer than 8 input channels") {
      o.c = 4;
      o.m1 = 16;
    }
    Model m = fused(o);
    CHECK_FALSE(node_named(m, "conv1")->has_attr("int8_scales"));
  }
  SECTION("1x1 convolutions too") {
    Model m = fused(Options{.k = 1});
    CHECK(node_named(m, "conv1")->has_attr("int8_scales"));
  }
  SECTION("but not a 1x1 convolution of one pixel (squeeze-and-excitation's): the float one-pixel product") {
    Model m = fused(Options{.h = 1, .w = 1, .k = 1});
    CHECK_FALSE(node_named(m, "conv1")->has_attr("int8_scales"));
    Model two = fused(Options{.h = 2, .w = 1, .k = 1});  // two pixels: in integers
    CHECK(node_named(two, "conv1")->has_attr("int8_scales"));
  }
  SECTION("uint8 activations with zero point 128 fit int8") {
    Model m = fused(Options{.zero_point = 128, .uint8 = true});
    CHECK(node_named(m, "conv1")->has_attr("int8_scales"));
  }
}

TEST_CASE("int8 convolutions give the float path's results, and the same bits on any thread count", "[int8_conv]") {
  if (!int8_here()) return;
  struct Case {
    int64_t n, c, h, w, m1, m2;
  };
  // Odd sizes, 24 channels (not a multiple of the channel block); and ResNet's 32 x 32 images with
  // 16 channels at batch 8, which caught oneDNN's quantizing reorder sharing its scratch memory
  // between two threads (a batch split over two executors gave wrong results).
  // At batch 1 the convolutions large enough for two threads are cut into bands of output rows
  // on channels-last tensors (conv2 of the 11 x 13 image: 6 output rows, 3 and 3; the 32 x 32 one:
  // 16, 8 and 8); the test below takes uneven bands, stride 1 and 1x1 convolutions.
  for (const Case& k : {Case{1, 24, 11, 13, 32, 40}, Case{1, 16, 32, 32, 16, 32}, Case{4, 24, 11, 13, 32, 40},
                        Case{8, 16, 32, 32, 16, 32}})
    for (const bool residual : {false, true}) {
      Options o;
      o.n = k.n;
      o.c = k.c;
      o.h = k.h;
      o.w = k.w;
      o.m1 = k.m1;
      o.m2 = k.m2;
      o.residual = residual;
      o.third = o.n == 1;  // conv2 then has channels-last tensors on both sides (row bands)
      INFO("batch " << o.n << ", " << o.c << " channels" << (residual ? ", residual" : ""));
      Model m = fused(o);
      REQUIRE(node_named(m, "conv1")->has_attr("int8_scales"));
      // One image: every convolution on every thread of the pool, however small (the tests run
      // with idle threads asleep, where a second thread pays only from 4M multiply-adds).
      std::optional<rt::cpu::ScopedOnednn> every_thread;
      if (o.n == 1) every_thread.emplace(rt::cpu::OnednnUse::Always);
      const rt::Feeds feeds{{"x", test::random_tensor({o.n, o.c, o.h, o.w}, 21, -2.0f, 2.0f)}};
      const Tensor want = run(in_float(m), feeds, 1);
      const uint64_t before = rt::cpu::onednn_int8_conv_count();
      const Tensor one = run(m, feeds, 1);
      CHECK(rt::cpu::onednn_int8_conv_count() >= before + (o.third ? 3 : 2));  // every convolution in integers
      // A batch split over two threads: the same bits. Fresh executors each time, so that both
      // threads quantize their weights (and inputs) at the same moment, as they would at start.
      const int64_t splits = rt::row_split_count();
      const uint64_t conv_splits_before = rt::cpu::onednn_batch_split_count();
      const uint64_t int8_before_two = rt::cpu::onednn_int8_conv_count();
      for (int repeat = 0; repeat < 4; ++repeat) CHECK(test::same_bits(one, run(m, feeds, 2)));
      if (o.n > 1) CHECK(rt::row_split_count() > splits);  // the batch really ran as two parts
      // One image: conv2, channels-last on both sides, ran as two bands of output rows (the same
      // bits above), each in integers, quantizing its own rows of X (conv1 reads the plain graph
      // input and conv3 writes the plain graph output: they run whole). The 1x1 projection stays
      // a plain Conv until the layout pass (nothing is fused into it), so it is not marked.
      if (o.n == 1) {
        CHECK(rt::cpu::onednn_batch_split_count() == conv_splits_before + 4);
        CHECK(rt::cpu::onednn_int8_conv_count() == int8_before_two + 4 * 4);
      }
      if (o.n > 1) {
        // The same batch kept whole by the executor: each convolution splits it over the threads
        // itself, the parts sharing one int8 copy of the weights. (By the size rule: a measured
        // choice would time one thread first; conv_tuning_test covers it.)
        const rt::cpu::ScopedConvTuning size_rule(false);
        const uint64_t conv_splits = rt::cpu::onednn_batch_split_count(), int8_runs = rt::cpu::onednn_int8_conv_count();
        CHECK(test::same_bits(one, run(m, feeds, 2, /*split_rows=*/false)));
        CHECK(rt::cpu::onednn_batch_split_count() > conv_splits);
        CHECK(rt::cpu::onednn_int8_conv_count() > int8_runs);
      }
      // conv1's output is quantized again (the fused Q/DQ): a sum that rounds differently can move
      // a value by one step there, so the outputs agree to about one step in a few values.
      CHECK(test::rel_l2(one, want) < 2e-3);
      CHECK(test::max_abs_diff(one, want) < 0.05);
    }
}

TEST_CASE("int8 convolution without the output quantization agrees to float rounding", "[int8_conv]") {
  if (!int8_here()) return;
  // conv2 reads a grid and writes float (no Q/DQ after it): only the summation differs.
  Options o;
  Model m = fused(o);
  REQUIRE(node_named(m, "conv2")->has_attr("int8_scales"));
  CHECK_FALSE(node_named(m, "conv2")->has_attr("fake_quant"));
  // Feed conv2 alone: conv1's output through the graph is the same grid in both runs.
  const rt::Feeds feeds{{"x", test::random_tensor({o.n, o.c, o.h, o.w}, 22, -2.0f, 2.0f)}};
  Model only_conv2 = m.clone();
  node_named(only_conv2, "conv1")->remove_attr("int8_scales");
  const Tensor want = run(in_float(m), feeds, 1);
  const uint64_t before = rt::cpu::onednn_int8_conv_count();
  const Tensor got = run(only_conv2, feeds, 1);
  CHECK(rt::cpu::onednn_int8_conv_count() == before + 1);  // conv2 in integers
  CHECK(test::rel_l2(got, want) < 1e-6);
}

TEST_CASE("a malformed int8_scales attribute is refused naming the node", "[int8_conv][negative]") {
  if (!int8_here()) return;
  Model m = fused(Options{});
  Node* conv1 = node_named(m, "conv1");
  REQUIRE(conv1);
  SECTION("too few scales") { conv1->set_attr(Attribute::make_floats("int8_scales", {0.02f, 0.01f})); }
  SECTION("a scale that is not positive") {
    std::vector<float> v = conv1->attr_floats("int8_scales", {});
    v[3] = -1.0f;
    conv1->set_attr(Attribute::make_floats("int8_scales", v));
  }
  const rt::Feeds feeds{{"x", test::random_tensor({2, 16, 9, 7}, 23)}};
  try {
    run(m, feeds, 1);
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("conv1") && Catch::Contains("int8_scales"));
  }
}

TEST_CASE("an int8 convolution oneDNN has no int8 kernel for runs its float plan", "[int8_conv]") {
  if (!rt::cpu::onednn_enabled() || rt::cpu::onednn_channel_block() != 16) {
    WARN("needs oneDNN with 16-channel blocks (AVX-512)");
    return;
  }
  // nChw16c in and out: oneDNN's int8 kernels take NHWC only, so this is what a CPU whose tensors
  // stay channel-blocked would ask for. It must run oneDNN's float kernel, not mpq's fallback.
  rt::cpu::DnnlConvShape s;
  s.n = 2;
  s.c = s.m = 16;
  s.ih = s.iw = s.oh = s.ow = 9;
  s.kh = s.kw = 3;
  s.pt = s.pl = s.pb = s.pr = 1;
  s.bias = true;
  s.act = rt::cpu::DnnlAct::Relu;
  s.x_block = s.y_block = 16;
  rt::cpu::Int8ConvScales q;
  q.x_inv = 50.0f;
  q.w_inv.assign(16, 100.0f);
  q.out.assign(16, 0.0002f);
  q.bias.assign(16, 1.0f);
  const Tensor x = test::random_tensor({2, 16, 9, 9}, 31), w = test::random_tensor({16, 16, 3, 3}, 32),
               b = test::random_tensor({16}, 33);
  Tensor want(DType::Float32, Shape{2, 16, 9, 9}), got(DType::Float32, Shape{2, 16, 9, 9});
  rt::ThreadPool pool(1);
  REQUIRE(rt::cpu::onednn_conv_forward(pool, s, x.data<float>(), w.data<float>(), b.data<float>(), nullptr,
                                       want.data<float>()));
  s.int8 = &q;
  const uint64_t convs = rt::cpu::onednn_conv_count(), int8 = rt::cpu::onednn_int8_conv_count();
  REQUIRE(rt::cpu::onednn_conv_forward(pool, s, x.data<float>(), w.data<float>(), b.data<float>(), nullptr,
                                       got.data<float>()));
  CHECK(rt::cpu::onednn_conv_count() == convs + 1);
  CHECK(rt::cpu::onednn_int8_conv_count() == int8);
  CHECK(test::same_bits(got, want));  // the float plan, with the float bias
}

namespace {

// One int8 convolution of one image, channels-last in and out, with random weights and scales.
struct BandCase {
  int64_t c, m, h, w, k, stride, pad_top, pad_bottom;
  bool residual;
};

rt::cpu::DnnlConvShape band_shape(const BandCase& k, const rt::cpu::Int8ConvScales& q) {
  return test::relu_conv_shape({1, k.c, k.m, k.h, k.w, k.k, k.stride, k.pad_top, k.pad_bottom, k.k / 2}, k.residual,
                               rt::cpu::kChannelsLast, &q);
}

// The convolution `s` on a pool of `threads`, with a node state (so that it may be split) or
// without (always whole).
Tensor conv_of(const rt::cpu::DnnlConvShape& s, const Tensor& x, const Tensor& w, const Tensor& b, const Tensor* z,
               int threads, bool state) {
  Tensor y(DType::Float32, Shape{s.n, s.oh, s.ow, s.m});  // channels-last
  rt::ThreadPool pool(threads);
  rt::cpu::OnednnConvState st;
  REQUIRE(rt::cpu::onednn_conv_forward(pool, s, x.data<float>(), w.data<float>(), b.data<float>(),
                                       z ? z->data<float>() : nullptr, y.data<float>(), state ? &st : nullptr));
  return y;
}

}  // namespace

TEST_CASE("int8 row bands of one image give the whole convolution's bits", "[int8_conv][split]") {
  if (!int8_here()) return;
  rt::cpu::ScopedOnednn always(rt::cpu::OnednnUse::Always);  // every convolution on both threads
  // Two bands per image (two threads): uneven ones of an odd output height, stride 1 and 2, 3x3 and
  // 1x1, with and without a residual; and a window wholly in padding for a whole band (padding
  // taller than the window), which no primitive takes: that convolution runs whole. (An odd height
  // under 8 rows is not split, as row_parts splits a batch.)
  for (const BandCase& k : {BandCase{16, 32, 17, 13, 3, 2, 1, 1, false},  // 9 output rows: 5 and 4
                            BandCase{24, 16, 17, 9, 3, 2, 1, 1, true},
                            BandCase{16, 24, 13, 11, 3, 1, 1, 1, false},  // 13 rows: 7 and 6
                            BandCase{32, 16, 13, 11, 3, 1, 1, 1, true},
                            BandCase{32, 48, 11, 7, 1, 1, 0, 0, false},  // 1x1: 11 rows
                            BandCase{16, 32, 17, 9, 1, 2, 0, 0, true},   // 1x1, stride 2: 9 rows
                            BandCase{16, 16, 2, 9, 1, 1, 8, 0, false}}) {  // 10 rows, the top 8 padding
    INFO(k.c << " -> " << k.m << ", " << k.h << " x " << k.w << ", " << k.k << "x" << k.k << " stride " << k.stride
              << ", pads " << k.pad_top << "/" << k.pad_bottom << (k.residual ? ", residual" : ""));
    const rt::cpu::Int8ConvScales q = test::int8_conv_scales(k.m, 61);
    const rt::cpu::DnnlConvShape s = band_shape(k, q);
    const Tensor x = test::random_tensor({1, k.h, k.w, k.c}, 62, -2.0f, 2.0f);
    const Tensor w = test::random_tensor({k.m, k.c, k.k, k.k}, 63, -0.3f, 0.3f);
    const Tensor b = test::random_tensor({k.m}, 64);
    const Tensor z = test::random_tensor({1, s.oh, s.ow, k.m}, 65, -1.0f, 1.0f);
    const Tensor* zp = k.residual ? &z : nullptr;
    const Tensor want = conv_of(s, x, w, b, zp, 1, false);
    const uint64_t splits = rt::cpu::onednn_batch_split_count(), int8 = rt::cpu::onednn_int8_conv_count();
    const Tensor got = conv_of(s, x, w, b, zp, 2, true);
    const bool empty_band = k.pad_top >= k.k + 4;  // the first band (5 rows) reads only padding
    CHECK(rt::cpu::onednn_batch_split_count() == splits + (empty_band ? 0 : 1));
    CHECK(rt::cpu::onednn_int8_conv_count() == int8 + (empty_band ? 1 : 2));  // each band in integers
    CHECK(test::same_bits(got, want));
  }
}

TEST_CASE("an int8 convolution requantizes by division where 1 / scale overflows", "[int8_conv]") {
  if (!int8_here()) return;
  // A fake-quantization scale below 1 / FLT_MAX (a subnormal): its reciprocal is inf, and a zero
  // sum times inf is NaN, which oneDNN's clip turns into the lower bound. The division gives the
  // bound for every non-zero value and 0 for a zero one, as FakeQuant does.
  const BandCase k{16, 16, 7, 9, 3, 1, 1, 1, false};
  const rt::cpu::Int8ConvScales q = test::int8_conv_scales(k.m, 61);
  rt::cpu::DnnlConvShape s = band_shape(k, q);
  const Tensor x = test::random_tensor({1, k.h, k.w, k.c}, 66, -2.0f, 2.0f);
  const Tensor w = test::random_tensor({k.m, k.c, k.k, k.k}, 67, -0.3f, 0.3f);
  const Tensor b = test::random_tensor({k.m}, 68);
  const Tensor plain = conv_of(s, x, w, b, nullptr, 1, false);  // Relu, no fake quantization
  s.fake_quant = true;
  s.fq_scale = 1e-39f;
  REQUIRE(std::fpclassify(s.fq_scale) == FP_SUBNORMAL);
  s.fq_lo = -128.0f;
  s.fq_hi = 127.0f;
  REQUIRE(1.0f / s.fq_scale == std::numeric_limits<float>::infinity());
  const uint64_t int8 = rt::cpu::onednn_int8_conv_count();
  const Tensor got = conv_of(s, x, w, b, nullptr, 1, false);
  CHECK(rt::cpu::onednn_int8_conv_count() == int8 + 1);  // in integers, not the float plan (which divides)
  int64_t zeros = 0;
  for (int64_t i = 0; i < plain.numel(); ++i) {
    const float v = plain.data<float>()[i];
    zeros += v == 0.0f;
    const float want = std::nearbyint(std::clamp(v / s.fq_scale, s.fq_lo, s.fq_hi)) * s.fq_scale;
    if (got.data<float>()[i] != want) FAIL_CHECK("value " << i << ": " << got.data<float>()[i] << ", want " << want);
  }
  CHECK(zeros > 0);  // the Relu's zeros are what the factor would get wrong
}
