// Benchmark driver (not a test): oneDNN's INT8 convolutions against its FP32 ones, per shape. This
// measurement is why mpq runs a QDQ model's qualifying convolutions in int8 (passes/int8_conv).
// scripts/bench_int8_conv.py passes the convolutions of the shipped CNNs and sums the rows per
// model (docs/runtime.md).
//
//     bench_conv_int8 [--threads 1] [--repeat 300] --conv N,C,H,M,CG,K,S,P [--conv ...]
//
// (N images, C input channels, H x H input, M output channels, CG input channels per group, K x K
// kernel, stride S, padding P.) mpq's float path for an INT8 QDQ CNN: its weights are dequantized
// once at load, each activation's QuantizeLinear -> DequantizeLinear pair is one mpq::FakeQuant,
// and the convolution itself is an FP32 mpq::FusedConv, on oneDNN where that is faster (tensors in
// oneDNN's channel-blocked layout between convolutions) and on mpq's kernels elsewhere; the script
// reads those in-model times from `mpq run --profile-nodes`. Per convolution, with bias and ReLU, median
// microseconds of one execution, the same convolution again and again:
//   f32        oneDNN's FP32 convolution alone, layouts of oneDNN's choice (channel-blocked; mpq
//              keeps that layout between two oneDNN convolutions only where the channels are a
//              multiple of its block, and runs the others on plain tensors);
//   s8         oneDNN's INT8 convolution as an INT8 engine would chain them: int8 activations in and
//              out (symmetric, mpq's default for CNNs), int8 weights with per-channel scales, the
//              requantization folded into the output scales, layouts of oneDNN's choice.
// Every convolution gets ReLU, and signed int8 input: oneDNN computes a compensation term for
// signed input that unsigned input (after a ReLU, with an asymmetric uint8 range) would not need,
// so s8 is if anything slower than an INT8 engine could be.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "runtime/cpu/conv_onednn.h"

using mpq::fail_input;

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

struct ConvShape {
  int64_t n, c, h, m, cg, k, s, p;
  int64_t out() const { return (h + 2 * p - k) / s + 1; }
  int64_t groups() const { return c / cg; }
};

ConvShape parse_shape(const std::string& text) {
  std::vector<int64_t> v;
  for (size_t pos = 0; pos <= text.size();) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string field = text.substr(pos, comma - pos);
    if (field.empty() || field.find_first_not_of("0123456789") != std::string::npos)
      fail_input("--conv {}: '{}' is not a non-negative integer", text, field);
    v.push_back(std::stoll(field));
    pos = comma + 1;
  }
  if (v.size() != 8) fail_input("--conv {}: expected N,C,H,M,CG,K,S,P", text);
  ConvShape s{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
  if (std::min({s.n, s.c, s.h, s.m, s.cg, s.k, s.s}) < 1) fail_input("--conv {}: sizes must be at least 1", text);
  if ( s.c % s.cg != 0 || s.m % s.groups() != 0 || s.out() <= 0)
    fail_input("--conv {}: inconsistent shape", text);
  return s;
}

double median_of(std::vector<double>& t) {
  std::nth_element(t.begin(), t.begin() + static_cast<long>(t.size() / 2), t.end());
  return t[t.size() / 2];
}

// Median microseconds of fn() over `repeat` calls after a tenth as many warm-up calls.
double median_us(int repeat, const std::function<void()>& fn) {
  for (int r = 0; r < std::max(1, repeat / 10); ++r) fn();
  std::vector<double> t;
  t.reserve(static_cast<size_t>(repeat));
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    t.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return median_of(t);
}

// oneDNN's convolution of `sh` alone: FP32 channel-blocked (int8 = false) or int8 in and out.
double onednn_us(const ConvShape& sh, bool int8, int threads, int repeat) {
  omp_set_num_threads(threads);  // oneDNN fixes its split for the team size at creation
  const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  const memory::dim g = sh.groups(), oh = sh.out();
  const bool grouped = g > 1;
  const memory::dims wdims = grouped ? memory::dims{g, sh.m / g, sh.cg, sh.k, sh.k} : memory::dims{sh.m, sh.c, sh.k, sh.k};
  const dt adt = int8 ? dt::s8 : dt::f32;
  const memory::desc sd({sh.n, sh.c, sh.h, sh.h}, adt, tag::any), wd(wdims, int8 ? dt::s8 : dt::f32, tag::any),
      bd({sh.m}, dt::f32, tag::x), dd({sh.n, sh.m, oh, oh}, adt, tag::any);
  dnnl::post_ops po;
  po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  dnnl::primitive_attr attr;
  attr.set_post_ops(po);
  if (int8) {
    // Per output channel: input scale x weight scale / output scale.
    std::vector<float> scales(static_cast<size_t>(sh.m));
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = 1.0f / static_cast<float>(sh.cg * sh.k * sh.k * (16 + i % 7));
    attr.set_output_scales(1 << 1, scales);
  }
  const dnnl::convolution_forward::primitive_desc pd(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, sd, wd,
                                      bd, dd, {sh.s, sh.s}, {sh.p, sh.p}, {sh.p, sh.p}),
      attr, eng);
  std::mt19937 rng(7);
  auto filled = [&](const memory::desc& d, dt type) {
    memory mem(d, eng);
    const size_t bytes = d.get_size();
    if (type == dt::s8) {
      auto* p = static_cast<int8_t*>(mem.get_data_handle());
      std::uniform_int_distribution<int> dist(-127, 127);
      for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<int8_t>(dist(rng));
    } else {
      auto* p = static_cast<float*>(mem.get_data_handle());
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      for (size_t i = 0; i < bytes / sizeof(float); ++i) p[i] = dist(rng) * 0.1f;
    }
    return mem;
  };
  // Weights filled in a plain layout and reordered into oneDNN's (its blocked int8 weights carry
  // compensation terms that a plain fill would not set).
  memory w_plain = filled(memory::desc(wdims, int8 ? dt::s8 : dt::f32, grouped ? tag::goihw : tag::oihw), int8 ? dt::s8 : dt::f32);
  memory w(pd.weights_desc(), eng);
  dnnl::reorder(w_plain, w).execute(stream, w_plain, w);
  // The input likewise: a blocked layout pads the channels to its block, and those must be zero.
  memory src_plain = filled(memory::desc({sh.n, sh.c, sh.h, sh.h}, adt, tag::nchw), adt);
  memory src(pd.src_desc(), eng);
  dnnl::reorder(src_plain, src).execute(stream, src_plain, src);
  const std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src},
                                             {DNNL_ARG_WEIGHTS, w},
                                             {DNNL_ARG_BIAS, filled(bd, dt::f32)},
                                             {DNNL_ARG_DST, memory(pd.dst_desc(), eng)}};
  const dnnl::convolution_forward conv(pd);
  return median_us(repeat, [&] { conv.execute(stream, args); });
}

int run(int argc, char** argv) {
  int threads = 1, repeat = 300;
  std::vector<ConvShape> shapes;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail_input("{} needs a value", a);
      return argv[++i];
    };
    if (a == "--threads") threads = std::stoi(next());
    else if (a == "--repeat") repeat = std::stoi(next());
    else if (a == "--conv") shapes.push_back(parse_shape(next()));
    else fail_input("unknown option {} (usage: bench_conv_int8 [--threads T] [--repeat R] --conv N,C,H,M,CG,K,S,P ...)", a);
  }
  if (shapes.empty() || threads < 1 || repeat < 1) fail_input("nothing to time: pass --conv N,C,H,M,CG,K,S,P");
  if (!mpq::rt::cpu::onednn_available()) fail_input("built without oneDNN: nothing to compare");
  std::printf("threads=%d repeat=%d (median microseconds per convolution, with bias and ReLU)\n", threads, repeat);
  std::printf("%4s %4s %4s %4s %4s %2s %2s %2s %9s %9s\n", "N", "C", "H", "M", "C/G", "K", "S", "P", "f32", "s8");
  for (const ConvShape& sh : shapes) {
    const double f32_us = onednn_us(sh, false, threads, repeat);
    const double s8_us = onednn_us(sh, true, threads, repeat);
    std::printf("%4lld %4lld %4lld %4lld %4lld %2lld %2lld %2lld %9.2f %9.2f\n", static_cast<long long>(sh.n),
                static_cast<long long>(sh.c), static_cast<long long>(sh.h), static_cast<long long>(sh.m),
                static_cast<long long>(sh.cg), static_cast<long long>(sh.k), static_cast<long long>(sh.s),
                static_cast<long long>(sh.p), f32_us, s8_us);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const dnnl::error& e) {
    std::fprintf(stderr, "bench_conv_int8: oneDNN: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_conv_int8: %s\n", e.what());
    return 1;
  }
}
