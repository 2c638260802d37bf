// GPU benchmark for scripts/gpu_check.sh: each shared kernel body launched on the GPU against
// mpq's CPU kernel for the same op and shape, in the same run, reported as a ratio. Not a test
// (built beside the tests, not registered with ctest). Prints one JSON line per op, or one line
// saying why it cannot run (no device) and exits 77.
//
//   bench_cuda_kernels [--repeat 20] [--threads 0]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "kernels/ops.h"
#include "runtime/executor.h"

using namespace mpq;

namespace {

int g_repeat = 20, g_threads = 0;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f);
  std::vector<float> v(n);
  for (float& f : v) f = u(rng);
  return v;
}

float* to_device(const std::vector<float>& v) {
  float* p = nullptr;
  check(cudaMalloc(&p, v.size() * sizeof(float)), "cudaMalloc");
  check(cudaMemcpy(p, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  return p;
}

// Median milliseconds of `f` over g_repeat runs after one warm-up.
double median_ms(const std::function<void()>& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < g_repeat; ++i) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Median milliseconds of one launch, by CUDA events.
double gpu_ms(const std::function<int()>& launch) {
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "cudaEventCreate");
  check(cudaEventCreate(&b), "cudaEventCreate");
  check(static_cast<cudaError_t>(launch()), "launch");
  check(cudaDeviceSynchronize(), "warm-up");
  std::vector<double> t;
  for (int i = 0; i < g_repeat; ++i) {
    check(cudaEventRecord(a), "cudaEventRecord");
    check(static_cast<cudaError_t>(launch()), "launch");
    check(cudaEventRecord(b), "cudaEventRecord");
    check(cudaEventSynchronize(b), "kernel");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// mpq's CPU executor running one node on x (plus constant extra inputs).
double cpu_node_ms(const std::string& op, const std::string& domain, const Tensor& x, const std::vector<Tensor>& consts,
                   const std::vector<ir::Attribute>& attrs, int opset) {
  ir::Model m;
  m.set_opset("", opset);
  if (!domain.empty()) m.set_opset(domain, 1);
  ir::Graph* g = m.graph.get();
  ir::Value* in = g->add_value("x", ir::ValueType::tensor(x.dtype(), x.shape()));
  g->add_input(in);
  std::vector<ir::Value*> ins = {in};
  for (size_t i = 0; i < consts.size(); ++i) {
    ir::Value* c = g->add_value("c" + std::to_string(i));
    g->set_initializer(c, consts[i]);
    ins.push_back(c);
  }
  ir::Value* out = g->add_value("y");
  g->add_output(out);
  ir::Node* n = g->add_node(op, ins, {out}, "bench");
  if (!domain.empty()) n->domain = domain;
  for (const auto& a : attrs) n->set_attr(a);
  rt::ExecOptions opt;
  opt.threads = g_threads;
  rt::Executor ex(m, opt);
  return median_ms([&] { ex.run({{"x", x}}); });
}

void report(const char* op, const std::string& shape, double cpu, double gpu) {
  std::printf("{\"op\": \"%s\", \"shape\": \"%s\", \"cpu_ms\": %.4f, \"gpu_kernel_ms\": %.4f, \"cpu_over_gpu\": %.2f}\n", op,
              shape.c_str(), cpu, gpu, gpu > 0 ? cpu / gpu : 0.0);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--repeat") g_repeat = std::max(1, std::atoi(argv[i + 1]));
    else if (a == "--threads") g_threads = std::atoi(argv[i + 1]);
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_cuda_kernels: no usable CUDA device (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  try {
    {  // Softmax over the last axis of [256, 4096]
      const int64_t rows = 256, n = 4096;
      const std::vector<float> h = random_floats(static_cast<size_t>(rows * n), 1);
      const Tensor x = Tensor::from<float>({rows, n}, h);
      float* dx = to_device(h);
      float* dy = to_device(h);
      const cuda::LaunchCtx c{cuda::launch_shape_for(rows, 128)};
      report("Softmax", "256x4096", cpu_node_ms("Softmax", "", x, {}, {ir::Attribute::make_int("axis", -1)}, 13),
             gpu_ms([&] { return cuda::gpu::softmax(false, dx, dy, rows, n, 1, c); }));
      cudaFree(dx);
      cudaFree(dy);
    }
    {  // LayerNormalization over [2048, 768]
      const int64_t rows = 2048, n = 768;
      const std::vector<float> h = random_floats(static_cast<size_t>(rows * n), 2), gv(n, 1.0f), bv(n, 0.0f);
      const Tensor x = Tensor::from<float>({rows, n}, h);
      float* dx = to_device(h);
      float* dy = to_device(h);
      float* dg = to_device(gv);
      float* db = to_device(bv);
      const cuda::LaunchCtx c{cuda::launch_shape_for(rows, 128)};
      report("LayerNormalization", "2048x768",
             cpu_node_ms("LayerNormalization", "", x, {Tensor::from<float>({n}, gv), Tensor::from<float>({n}, bv)},
                         {ir::Attribute::make_int("axis", -1)}, 17),
             gpu_ms([&] { return cuda::gpu::layer_norm(dx, dg, db, dy, nullptr, nullptr, rows, n, 1e-5f, c); }));
      for (float* p : {dx, dy, dg, db}) cudaFree(p);
    }
    {  // FakeQuant per channel on [64, 256, 56, 56]... scaled down to [16, 256, 28, 28]
      const int64_t o = 16, ch = 256, in = 28 * 28;
      const std::vector<float> h = random_floats(static_cast<size_t>(o * ch * in), 3), sc(ch, 0.02f);
      const std::vector<int32_t> zp(ch, 0);
      const Tensor x = Tensor::from<float>({o, ch, 28, 28}, h);
      float* dx = to_device(h);
      float* dy = to_device(h);
      float* ds = to_device(sc);
      int32_t* dz = nullptr;
      check(cudaMalloc(&dz, zp.size() * sizeof(int32_t)), "cudaMalloc");
      check(cudaMemcpy(dz, zp.data(), zp.size() * sizeof(int32_t), cudaMemcpyHostToDevice), "cudaMemcpy");
      const cuda::QuantLayout l{o, ch, in, ds, dz, -128, 127};
      const cuda::LaunchCtx c{cuda::launch_shape_for(o * ch * in, 256)};
      report("FakeQuant", "16x256x28x28",
             cpu_node_ms("FakeQuant", "mpq", x, {Tensor::from<float>({ch}, sc), Tensor::from<int32_t>({ch}, zp)},
                         {ir::Attribute::make_int("axis", 1)}, 13),
             gpu_ms([&] { return cuda::gpu::fake_quant(l, dx, dy, c); }));
      cudaFree(dx);
      cudaFree(dy);
      cudaFree(ds);
      cudaFree(dz);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
