// Benchmark driver (not a test): what a second thread gains on oneDNN alone, for a chain of
// convolutions at batch 1 against the same convolutions repeated one at a time.
//
//     bench_conv_chain [--threads N] [--repeat R] [--macs-per-thread M]
//
// The chain is the fashion ResNet's nine convolutions (tests/models/fashion/fashion_resnet.onnx,
// one 28 x 28 image), in order, on the layouts and OpenMP team sizes mpq gives them: nChw16c
// activations, weights in oneDNN's own layout, bias and ReLU post-ops, the residual as a sum
// post-op into the block's input, and a team of one for a convolution under 0.3M multiply-adds, or
// under --macs-per-thread M (runtime/cpu/conv_onednn.cpp; mpq's figure with libgomp spinning, as here: under
// OMP_WAIT_POLICY=PASSIVE mpq uses 4M, and mpq sets its own GOMP_SPINCOUNT). Each row:
// microseconds per convolution on one thread and on N, chained (each reads what the previous one
// wrote, as in a run of the model) and alone (the same convolution again and again, its input
// already in the cache of the core that reads it).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

double g_macs_per_thread = 3e5;  // --macs-per-thread: mpq's figure by default

struct Conv {
  std::string name;
  int team = 1;
  dnnl::convolution_forward prim;
  std::unordered_map<int, memory> args;
  double chained_us = 0, alone_us = 0;
};

struct Net {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  std::vector<Conv> convs;
  std::vector<std::vector<float>> storage;

  memory make(const memory::desc& d, float value) {
    storage.emplace_back(d.get_size() / sizeof(float), value);
    return memory(d, eng, storage.back().data());
  }

  // A convolution of `src` to `oc` channels (k x k, stride s, padding k / 2) on a team of `threads`
  // or one; with `sum`, the residual already in `dst` is added (oneDNN's sum post-op).
  memory add(const char* name, const memory& src, int oc, int k, int s, bool sum, int threads, memory* dst = nullptr) {
    const memory::desc sd = src.get_desc();
    const memory::dim ic = sd.dims()[1], ih = sd.dims()[2], pad = k / 2, oh = (ih + 2 * pad - k) / s + 1;
    const double macs = static_cast<double>(oh * oh * oc * ic * k * k);
    Conv c;
    c.name = name;
    c.team = std::max(1, std::min(threads, static_cast<int>(macs / g_macs_per_thread)));
    omp_set_num_threads(c.team);  // oneDNN fixes its split for the team size at creation
    const memory::desc wd({oc, ic, k, k}, dt::f32, tag::any), bd({oc}, dt::f32, tag::x),
        dd({1, oc, oh, oh}, dt::f32, tag::nChw16c);
    dnnl::post_ops po;
    if (sum) po.append_sum(1.0f);
    po.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    dnnl::primitive_attr attr;
    attr.set_post_ops(po);
    const dnnl::convolution_forward::primitive_desc pd(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct, sd, wd,
                                        bd, dd, {s, s}, {pad, pad}, {pad, pad}),
        attr, eng);
    // Small weights of both signs and a small positive bias: the activations stay finite and
    // mostly non-zero through the chain (denormals or NaNs would time something else).
    const memory w = make(pd.weights_desc(), 0.0f);
    float* wp = static_cast<float*>(w.get_data_handle());
    const size_t nw = pd.weights_desc().get_size() / sizeof(float);
    for (size_t i = 0; i < nw; ++i) wp[i] = 0.02f * (static_cast<float>(i % 13) - 6.0f) / static_cast<float>(ic * k * k);
    const memory out = dst ? *dst : make(pd.dst_desc(), 0.0f);
    c.prim = dnnl::convolution_forward(pd);
    c.args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, w}, {DNNL_ARG_BIAS, make(bd, 0.01f)}, {DNNL_ARG_DST, out}};
    convs.push_back(std::move(c));
    return out;
  }

  void run(Conv& c) {
    if (omp_get_max_threads() != c.team) omp_set_num_threads(c.team);
    c.prim.execute(stream, c.args);
  }
};

using Clock = std::chrono::steady_clock;
double us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// The fashion ResNet's convolutions on `threads` threads, timed `repeat` times chained and alone.
Net measure(int threads, int repeat) {
  Net net;
  const memory x = net.make({{1, 1, 28, 28}, dt::f32, tag::nchw}, 0.5f);
  const memory a = net.add("stem 1->16", x, 16, 3, 1, false, threads);
  const memory b = net.add("layer1 conv1 16->16", a, 16, 3, 1, false, threads);
  memory a_res = a;
  net.add("layer1 conv2 16->16 +res", b, 16, 3, 1, true, threads, &a_res);
  const memory d = net.add("layer2 conv1 16->32 s2", a, 32, 3, 2, false, threads);
  memory e = net.add("layer2 down 16->32 1x1 s2", a, 32, 1, 2, false, threads);
  net.add("layer2 conv2 32->32 +res", d, 32, 3, 1, true, threads, &e);
  const memory g = net.add("layer3 conv1 32->64 s2", e, 64, 3, 2, false, threads);
  memory h = net.add("layer3 down 32->64 1x1 s2", e, 64, 1, 2, false, threads);
  net.add("layer3 conv2 64->64 +res", g, 64, 3, 1, true, threads, &h);
  const int warm = std::max(1, repeat / 10);
  for (int r = 0; r < warm + repeat; ++r)
    for (Conv& c : net.convs) {
      const auto t0 = Clock::now();
      net.run(c);
      if (r >= warm) c.chained_us += us(Clock::now() - t0);
    }
  for (Conv& c : net.convs) {
    for (int r = 0; r < warm; ++r) net.run(c);
    const auto t0 = Clock::now();
    for (int r = 0; r < repeat; ++r) net.run(c);
    c.alone_us = us(Clock::now() - t0);
  }
  for (Conv& c : net.convs) {
    c.chained_us /= repeat;
    c.alone_us /= repeat;
  }
  return net;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeat = 5000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--repeat") == 0) repeat = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--macs-per-thread") == 0) g_macs_per_thread = std::atof(argv[i + 1]);
  }
  if (threads < 1 || repeat < 1 || !(g_macs_per_thread > 0)) {
    std::fprintf(stderr, "usage: bench_conv_chain [--threads N] [--repeat R] [--macs-per-thread M]\n");
    return 2;
  }
  const Net one = measure(1, repeat);
  const Net many = measure(threads, repeat);
  std::printf("%-28s %5s  %9s %9s %6s  %9s %9s %6s\n", "convolution (batch 1)", "team", "chain 1t", "chain Nt", "gain",
              "alone 1t", "alone Nt", "gain");
  double c1 = 0, cn = 0, a1 = 0, an = 0;
  for (size_t i = 0; i < one.convs.size(); ++i) {
    const Conv &p = one.convs[i], &q = many.convs[i];
    std::printf("%-28s %5d  %9.2f %9.2f %6.2f  %9.2f %9.2f %6.2f\n", p.name.c_str(), q.team, p.chained_us,
                q.chained_us, p.chained_us / q.chained_us, p.alone_us, q.alone_us, p.alone_us / q.alone_us);
    c1 += p.chained_us, cn += q.chained_us, a1 += p.alone_us, an += q.alone_us;
  }
  std::printf("%-28s %5d  %9.2f %9.2f %6.2f  %9.2f %9.2f %6.2f\n", "total (us)", threads, c1, cn, c1 / cn, a1, an, a1 / an);
  return 0;
}
