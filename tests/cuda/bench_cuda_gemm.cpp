// GPU benchmark for scripts/gpu_check.sh: mpq's cuBLASLt GEMM path (plan_gemm -> gpu::gemm, the
// same entry the executor calls) on square problems, FP32 / TF32 / FP16 / BF16 / INT8, in TFLOP/s
// (TOPS for INT8). scripts/gpu_bench.py sets these beside a PyTorch matmul of the same shape and
// type on the same GPU (the practical peak). Not a test: built beside the tests, not in ctest.
//
// Each problem is also checked: 64 sampled output entries against a double-precision dot product
// of the same (rounded) operands, relative error within the type's bound; the output starts as NaN
// bytes so that an unwritten entry fails. Operands are random, never zeros (zeros time faster).
// Prints one JSON line per problem, or one line saying why it cannot run and exits 77.
//
//   bench_cuda_gemm [--sizes 4096,8192] [--repeat 10]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/lib_ops.h"

using namespace mpq;
using rt::cuda_plan::GemmPrecision;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench_cuda_gemm: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

const char* name_of(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::FP32: return "fp32";
    case GemmPrecision::TF32: return "tf32";
    case GemmPrecision::FP16: return "fp16";
    case GemmPrecision::BF16: return "bf16";
    case GemmPrecision::INT8: return "int8";
  }
  return "?";
}

size_t in_bytes(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::FP16:
    case GemmPrecision::BF16: return 2;
    case GemmPrecision::INT8: return 1;
    default: return 4;
  }
}
size_t out_bytes(GemmPrecision p) { return p == GemmPrecision::FP16 || p == GemmPrecision::BF16 ? 2 : 4; }

// Random operand in the precision's storage, and its exact value as double (for the check).
struct Operand {
  std::vector<unsigned char> bytes;
  std::vector<double> value;
};

Operand make_operand(GemmPrecision p, size_t n, uint32_t seed) {
  // xorshift: 2 x 8192^2 draws per problem, where std::mt19937 + a distribution took seconds.
  uint64_t state = 0x9E3779B97F4A7C15ull * (seed + 1);
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  auto u = [&] { return static_cast<float>(static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0); };
  auto ui = [&] { return static_cast<int>(next() % 255) - 127; };
  Operand o;
  o.bytes.resize(n * in_bytes(p));
  o.value.resize(n);
  for (size_t i = 0; i < n; ++i) {
    switch (p) {
      case GemmPrecision::FP16: {
        const __half h = __float2half(u());
        std::memcpy(&o.bytes[2 * i], &h, 2);
        o.value[i] = __half2float(h);
        break;
      }
      case GemmPrecision::BF16: {
        const __nv_bfloat16 h = __float2bfloat16(u());
        std::memcpy(&o.bytes[2 * i], &h, 2);
        o.value[i] = __bfloat162float(h);
        break;
      }
      case GemmPrecision::INT8: {
        const int8_t v = static_cast<int8_t>(ui());
        o.bytes[i] = static_cast<unsigned char>(v);
        o.value[i] = v;
        break;
      }
      default: {
        const float f = u();
        std::memcpy(&o.bytes[4 * i], &f, 4);
        o.value[i] = f;
      }
    }
  }
  return o;
}

double read_output(GemmPrecision p, const std::vector<unsigned char>& c, size_t i) {
  switch (p) {
    case GemmPrecision::FP16: {
      __half h;
      std::memcpy(&h, &c[2 * i], 2);
      return __half2float(h);
    }
    case GemmPrecision::BF16: {
      __nv_bfloat16 h;
      std::memcpy(&h, &c[2 * i], 2);
      return __bfloat162float(h);
    }
    case GemmPrecision::INT8: {
      int32_t v;
      std::memcpy(&v, &c[4 * i], 4);
      return v;
    }
    default: {
      float f;
      std::memcpy(&f, &c[4 * i], 4);
      return f;
    }
  }
}

// Largest relative error (against the sum of |terms|, the scale rounding works at) allowed.
double tolerance(GemmPrecision p) {
  switch (p) {
    case GemmPrecision::FP32: return 1e-5;
    case GemmPrecision::TF32: return 5e-3;
    case GemmPrecision::FP16: return 2e-3;  // FP16 output rounding
    case GemmPrecision::BF16: return 1e-2;  // BF16 output rounding
    case GemmPrecision::INT8: return 0;     // exact
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {4096, 8192};
  int repeat = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--repeat") {
      repeat = std::max(1, std::atoi(argv[i + 1]));
    } else if (a == "--sizes") {
      sizes.clear();
      for (const char* s = argv[i + 1]; *s;) {
        sizes.push_back(std::atoll(s));
        s = std::strchr(s, ',');
        if (!s) break;
        ++s;
      }
    } else {
      std::fprintf(stderr, "bench_cuda_gemm: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_cuda_gemm: no usable CUDA device (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  int failures = 0;
  for (const int64_t n : sizes) {
    for (const GemmPrecision prec :
         {GemmPrecision::FP32, GemmPrecision::TF32, GemmPrecision::FP16, GemmPrecision::BF16, GemmPrecision::INT8}) {
      const size_t elems = static_cast<size_t>(n * n);
      // INT8 needs mpq's B as [N, K] (cuBLASLt's TN form); the others take the plain row-major B.
      const bool trans_b = prec == GemmPrecision::INT8;
      const Operand a = make_operand(prec, elems, 11), b = make_operand(prec, elems, 12);
      rt::cuda_plan::GemmRequest r;
      r.m = r.n = r.k = n;
      r.trans_b = trans_b;
      r.precision = prec;
      r.sm = prop.major * 10 + prop.minor;
      const rt::cuda_plan::GemmPlan plan = rt::cuda_plan::plan_gemm(r);
      if (!plan.use_cublaslt) {
        std::printf("{\"type\": \"%s\", \"n\": %lld, \"error\": \"plan declined: %s\"}\n", name_of(prec),
                    static_cast<long long>(n), plan.fallback_reason.c_str());
        ++failures;
        continue;
      }
      void *da = nullptr, *db = nullptr, *dc = nullptr, *ws = nullptr;
      const size_t c_bytes = elems * out_bytes(prec);
      check(cudaMalloc(&da, a.bytes.size()), "cudaMalloc A");
      check(cudaMalloc(&db, b.bytes.size()), "cudaMalloc B");
      check(cudaMalloc(&dc, c_bytes), "cudaMalloc C");
      check(cudaMalloc(&ws, plan.workspace_bytes), "cudaMalloc workspace");
      check(cudaMemcpy(da, a.bytes.data(), a.bytes.size(), cudaMemcpyHostToDevice), "copy A");
      check(cudaMemcpy(db, b.bytes.data(), b.bytes.size(), cudaMemcpyHostToDevice), "copy B");
      check(cudaMemset(dc, 0xff, c_bytes), "poison C");  // NaN in every float type, -1 in int32
      cuda::LaunchCtx ctx;
      ctx.stream = stream;
      auto launch = [&] {
        const cuda::LibStatus st = cuda::gpu::gemm(plan, da, db, dc, ws, plan.workspace_bytes, ctx);
        if (!st.ok()) {
          std::fprintf(stderr, "bench_cuda_gemm: %s n=%lld: %s failed (library %d, status %d)\n", name_of(prec),
                       static_cast<long long>(n), st.call, st.library, st.code);
          std::exit(1);
        }
      };
      launch();  // warm-up: heuristic query, module load
      check(cudaStreamSynchronize(stream), "warm-up");
      // Check 64 sampled entries of C against double dot products of the stored operands.
      std::vector<unsigned char> c(c_bytes);
      check(cudaMemcpy(c.data(), dc, c_bytes, cudaMemcpyDeviceToHost), "copy C");
      std::mt19937 rng(5);
      double worst = 0;
      for (int s = 0; s < 64; ++s) {
        const int64_t i = static_cast<int64_t>(rng() % static_cast<uint32_t>(n)), j = static_cast<int64_t>(rng() % static_cast<uint32_t>(n));
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < n; ++k) {
          const double bv = trans_b ? b.value[static_cast<size_t>(j * n + k)] : b.value[static_cast<size_t>(k * n + j)];
          const double t = a.value[static_cast<size_t>(i * n + k)] * bv;
          ref += t;
          mag += std::fabs(t);
        }
        const double got = read_output(prec, c, static_cast<size_t>(i * n + j));
        const double err = std::isfinite(got) ? std::fabs(got - ref) / std::max(mag, 1e-30) : INFINITY;
        worst = std::max(worst, err);
      }
      const bool ok = worst <= tolerance(prec);
      if (!ok) ++failures;
      cudaEvent_t e0, e1;
      check(cudaEventCreate(&e0), "event");
      check(cudaEventCreate(&e1), "event");
      std::vector<float> ms;
      for (int it = 0; it < repeat; ++it) {
        check(cudaEventRecord(e0, stream), "record");
        launch();
        check(cudaEventRecord(e1, stream), "record");
        check(cudaEventSynchronize(e1), "sync");
        float t = 0;
        check(cudaEventElapsedTime(&t, e0, e1), "elapsed");
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      const double tflops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / (med * 1e-3) / 1e12;
      std::printf("{\"type\": \"%s\", \"n\": %lld, \"median_ms\": %.4f, \"tflops\": %.1f, \"max_rel_err\": %.3g, \"ok\": %s}\n",
                  name_of(prec), static_cast<long long>(n), med, tflops, worst, ok ? "true" : "false");
      std::fflush(stdout);
      cudaEventDestroy(e0);
      cudaEventDestroy(e1);
      cudaFree(da);
      cudaFree(db);
      cudaFree(dc);
      cudaFree(ws);
    }
  }
  cudaStreamDestroy(stream);
  return failures ? 1 : 0;
}
