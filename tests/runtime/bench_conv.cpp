// Times Conv forward through the executor with mpq's own kernels and with oneDNN on the same
// inputs, per shape, for choosing which convolutions oneDNN runs (docs/runtime.md). Not a test (no
// assertions, timings vary): built beside the tests, never registered with ctest.
//
//   bench_conv [--threads 1] [--repeat 200] [--batches 1,8] [--relu] [--channels-last]
//
// --channels-last: the depthwise shapes only, as mpq::FusedConv with X and Y channels-last (the
// layout passes/block_conv_layout gives the MobileNets): oneDNN's depthwise kernel against mpq's
// kernels with a layout conversion on each side.
//
// The shapes are the convolutions of the shipped CNNs (tests/models, ResNet, MobileNetV3, U-Net on
// 32x32 and the fashion models on 28x28). Prints one line per shape and batch: median
// microseconds of each and their ratio (oneDNN / mpq; below 1 means oneDNN is faster; about 1 where
// oneDNN has no direct kernel for the shape and mpq runs it either way).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "ir/graph.h"
#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/executor.h"

using namespace mpq;

namespace {

struct Shape2 {
  int64_t c, hw, m, cg, k, s;  // input channels, square input size, output channels, channels per group, kernel, stride
};

// (C, HW, M, C/G, K, stride) of every distinct convolution in the shipped CNNs.
const Shape2 kShapes[] = {
    {3, 32, 16, 3, 3, 1},     {16, 32, 16, 16, 3, 1},   {16, 32, 32, 16, 3, 2},  {32, 16, 32, 32, 3, 1},
    {16, 32, 32, 16, 1, 2},   {32, 16, 64, 32, 3, 2},   {64, 8, 64, 64, 3, 1},   {32, 16, 64, 32, 1, 2},
    {16, 8, 8, 16, 1, 1},     {8, 8, 16, 8, 1, 1},      {16, 8, 48, 16, 1, 1},   {48, 4, 24, 48, 1, 1},
    {24, 4, 72, 24, 1, 1},    {72, 2, 40, 72, 1, 1},    {40, 2, 120, 40, 1, 1},  {1, 28, 16, 1, 3, 1},
    {16, 28, 16, 16, 3, 1},   {16, 14, 64, 16, 1, 1},   {64, 32, 32, 64, 3, 1},  {32, 32, 16, 32, 1, 1},
    {16, 32, 2, 16, 1, 1},    {1, 28, 64, 1, 7, 7},
    // Depthwise: MobileNetV3 (32x32 input), then fashion_mobilenet (28x28).
    {16, 16, 16, 1, 3, 1},    {48, 16, 48, 1, 3, 2},    {72, 8, 72, 1, 3, 1},    {72, 8, 72, 1, 5, 2},
    {120, 4, 120, 1, 5, 1},   {16, 28, 16, 1, 3, 2},    {64, 14, 64, 1, 3, 1},   {72, 14, 72, 1, 3, 1},
    {96, 14, 96, 1, 5, 2},    {120, 7, 120, 1, 5, 1},
};

Tensor random_tensor(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Tensor t(DType::Float32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return t;
}

double median_us(rt::Executor& ex, const rt::Feeds& feeds, int repeat) {
  ex.run(feeds);
  std::vector<double> t;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    ex.run(feeds);
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

int run(int argc, char** argv) {
  int threads = 1, repeat = 200;
  std::vector<int64_t> batches{1, 8};
  bool relu = false, channels_last = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail_input("{} needs a value", a);
      return argv[++i];
    };
    if (a == "--threads") threads = std::stoi(next());
    else if (a == "--repeat") repeat = std::stoi(next());
    else if (a == "--relu") relu = true;
    else if (a == "--channels-last") channels_last = true;
    else if (a == "--batches") {
      batches.clear();
      const std::string s = next();
      for (size_t p = 0; p < s.size();) {
        const size_t c = s.find(',', p);
        batches.push_back(std::stoll(s.substr(p, c - p)));
        if (c == std::string::npos) break;
        p = c + 1;
      }
    } else fail_input("unknown option {}", a);
  }
  if (!rt::cpu::onednn_available()) fail_input("built without oneDNN: nothing to compare");
  if (channels_last) relu = true;  // FusedConv carries the layout attributes
  std::printf("threads=%d repeat=%d %s%s\n", threads, repeat, relu ? "FusedConv+Relu" : "Conv",
              channels_last ? ", channels-last depthwise" : "");
  std::printf("%4s %4s %4s %4s %4s %2s %2s %10s %10s %7s\n", "N", "C", "HW", "M", "C/G", "K", "S", "mpq us",
              "oneDNN us", "ratio");
  for (int64_t n : batches)
    for (const Shape2& sh : kShapes) {
      if (channels_last && !(sh.cg == 1 && sh.m == sh.c && sh.c > 1)) continue;
      ir::Model model;
      model.set_opset("", 17);
      model.set_opset("mpq", 1);
      ir::Graph* g = model.graph.get();
      ir::Value* x = g->add_value("x", ir::ValueType::tensor(DType::Float32, {n, sh.c, sh.hw, sh.hw}));
      g->add_input(x);
      ir::Value* w = g->add_initializer("w", random_tensor({sh.m, sh.cg, sh.k, sh.k}, 2));
      ir::Value* b = g->add_initializer("b", random_tensor({sh.m}, 3));
      ir::Value* y = g->add_value("y");
      g->add_output(y);
      ir::Node* node = g->add_node(relu ? "FusedConv" : "Conv", {x, w, b}, {y}, "conv", relu ? "mpq" : "");
      const int64_t p = sh.k == sh.s ? 0 : sh.k / 2;  // the ViT's patch embedding: no padding
      node->set_attr(ir::Attribute::make_int("group", sh.c / sh.cg));
      node->set_attr(ir::Attribute::make_ints("strides", {sh.s, sh.s}));
      node->set_attr(ir::Attribute::make_ints("pads", {p, p, p, p}));
      if (relu) node->set_attr(ir::Attribute::make_string("activation", "Relu"));
      if (channels_last) {
        node->set_attr(ir::Attribute::make_int("x_block", rt::cpu::kChannelsLast));
        node->set_attr(ir::Attribute::make_int("y_block", rt::cpu::kChannelsLast));
      }
      rt::Feeds feeds{{"x", random_tensor({n, sh.c, sh.hw, sh.hw}, 1)}};
      rt::ExecOptions o;
      o.threads = threads;
      rt::Executor ex(model, o);
      double mpq_us, dnnl_us;
      {
        rt::cpu::ScopedOnednn off(rt::cpu::OnednnUse::Off);
        mpq_us = median_us(ex, feeds, repeat);
      }
      {
        rt::cpu::ScopedOnednn on(rt::cpu::OnednnUse::Always);
        dnnl_us = median_us(ex, feeds, repeat);
      }
      std::printf("%4lld %4lld %4lld %4lld %4lld %2lld %2lld %10.1f %10.1f %7.2f\n", static_cast<long long>(n),
                  static_cast<long long>(sh.c), static_cast<long long>(sh.hw), static_cast<long long>(sh.m),
                  static_cast<long long>(sh.cg), static_cast<long long>(sh.k), static_cast<long long>(sh.s), mpq_us,
                  dnnl_us, dnnl_us / mpq_us);
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_conv: %s\n", e.what());
    return 1;
  }
}
