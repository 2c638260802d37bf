// Whole models through the CUDA graph runner on this machine: the host harness's kernel table and
// host memory stand in for the GPU, so every planned node runs the shared kernel bodies and every
// other node the CPU kernel with explicit copies. Outputs must agree with mpq's CPU executor
// (model_cases.h, shared with gpu_graph_runner_test).
#include <catch2/catch.hpp>

#include "model_cases.h"

using namespace mpq;

namespace {

// One run of a shipped test model through the graph runner with `table` and `mem` against the CPU
// executor (model_cases.h). Returns the number of outputs.
size_t run_model_against_cpu(const char* file, const mpq::cuda::OpsTable& table, rt::gpu::DeviceMemoryBackend& mem,
                             rt::gpu::FallbackLog& log, rt::gpu::GraphRunStats& stats) {
  const ir::Model m = ir::load_model(test::models_dir() / file);
  test::check_run_against_cpu(m, table, mem, 1e-5, log, stats);
  return m.graph->outputs().size();
}

}  // namespace

TEST_CASE("test models run through the CUDA graph runner on the host kernel table", "[cuda][host_bodies][runner]") {
  test::HostMemory mem;
  test::run_model_cases(mpq::cuda::host_ops_table(), mem);
}

TEST_CASE("FP16 and BF16 models run through the CUDA graph runner on the host kernel table", "[cuda][host_bodies][runner]") {
  test::HostMemory mem;
  test::run_low_precision_model_cases(mpq::cuda::host_ops_table(), mem, 5e-4);
}

TEST_CASE("nodes whose library call declines (NOT_SUPPORTED) run on the CPU instead", "[cuda][host_bodies][runner]") {
  // A table whose cuBLASLt and cuDNN entries decline everything, as they do for problems without
  // an algorithm in a type the direct bodies do not take.
  mpq::cuda::OpsTable declining = mpq::cuda::host_ops_table();
  declining.gemm = [](const rt::cuda_plan::GemmPlan&, const void*, const void*, void*, void*, size_t,
                      const mpq::cuda::LaunchCtx&) {
    return mpq::cuda::LibStatus{1, mpq::cuda::kCublasStatusNotSupported, "cublasLtMatmul"};
  };
  declining.conv_forward = [](const rt::cuda_plan::ConvPlan&, const float*, const float*, float*, void*, size_t,
                              const mpq::cuda::LaunchCtx&) {
    return mpq::cuda::LibStatus{2, mpq::cuda::kCudnnStatusNotSupported, "cudnnConvolutionForward"};
  };
  test::HostMemory mem;
  rt::gpu::FallbackLog log;
  rt::gpu::GraphRunStats stats;
  run_model_against_cpu("resnet_bn_op13.onnx", declining, mem, log, stats);
  CHECK(stats.on_cpu.count("Conv") == 1);
  CHECK(stats.on_device.count("Conv") == 0);
  CHECK(log.ops().count("Conv") == 1);
}

TEST_CASE("inputs and outputs go through one pinned staging buffer, reused run after run", "[cuda][host_bodies][runner]") {
  struct PinnedHostMemory : test::HostMemory {
    int pinned_allocations = 0, pinned_live = 0;
    int allocate_pinned(void** p, size_t bytes) override {
      *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
      ++pinned_allocations;
      ++pinned_live;
      return *p ? 0 : 2;
    }
    int release_pinned(void* p) override {
      std::free(p);
      --pinned_live;
      return 0;
    }
  };
  PinnedHostMemory mem;
  const ir::Model m = ir::load_model(test::models_dir() / "tiny_bert.onnx");  // several inputs, int64 ones too
  const rt::Feeds feeds = test::random_feeds(m);
  rt::Executor cpu(m);
  const std::vector<Tensor> want = cpu.run(feeds);
  {
    rt::gpu::CachingAllocator alloc(mem);
    rt::gpu::PinnedStaging staging(mem);
    rt::gpu::KernelRuntime krt{mpq::cuda::host_ops_table(), alloc, mem, nullptr};
    krt.staging = &staging;
    rt::gpu::FallbackLog log;
    for (int run = 0; run < 3; ++run) {
      INFO("run " << run);
      const std::vector<Tensor> got = rt::gpu::run_graph(m, feeds, krt, log);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i].is_host());
        REQUIRE(got[i].shape() == want[i].shape());
        if (want[i].dtype() == DType::Float32) CHECK(test::rel_l2(got[i], want[i]) < 1e-5);
      }
    }
    CHECK(mem.pinned_allocations == 1);  // one buffer for every run's inputs and outputs
    CHECK(alloc.stats().in_use == 0);
  }
  CHECK(mem.pinned_live == 0);
}

TEST_CASE("Shape runs from the dimensions and small integer values keep host copies: no device-to-host copy mid-run",
          "[cuda][host_bodies][runner]") {
  // The transformer computes its Reshape targets at run time: Shape -> Gather -> Unsqueeze ->
  // Concat (int64, on the CPU kernels) -> Reshape. Shape must not copy its (float) input back,
  // the int64 chain must read host copies, and the Reshape must then plan on the device.
  struct CountingMemory : test::HostMemory {
    int device_to_host = 0;
    int copy(void* dst, const void* src, size_t bytes, rt::gpu::CopyKind kind, void* stream) override {
      if (kind == rt::gpu::CopyKind::DeviceToHost) ++device_to_host;
      return test::HostMemory::copy(dst, src, bytes, kind, stream);
    }
  };
  CountingMemory mem;
  rt::gpu::FallbackLog log;
  rt::gpu::GraphRunStats stats;
  const size_t outputs = run_model_against_cpu("transformer_op13.onnx", mpq::cuda::host_ops_table(), mem, log, stats);
  REQUIRE(stats.on_device.count("Shape") == 1);
  REQUIRE(stats.on_device.count("Reshape") == 1);
  CHECK(stats.on_cpu.count("Shape") == 0);
  CHECK(stats.on_cpu.count("Reshape") == 0);
  CHECK(stats.on_cpu.count("Concat") == 1);  // int64 shape arithmetic stays on the CPU kernels
  // Only the graph's outputs come back (no staging buffer here: one copy per output); the float
  // Gathers' indices are known on the host, so no out-of-range flag is read back either.
  CHECK(mem.device_to_host == static_cast<int>(outputs));
}
