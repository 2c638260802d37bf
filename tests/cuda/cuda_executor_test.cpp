// The executor's CUDA path (Executor with BackendKind::CUDA) on this machine: the host harness's
// kernel table and host memory stand in for the plugin and the GPU (ExecOptions::cuda_ops /
// cuda_memory), so the wiring the commands use -- observers for calibration, intermediate values,
// initializers uploaded once, CPU fallbacks -- is checked against the CPU executor.
#include <catch2/catch.hpp>

#include <map>

#include "model_cases.h"

using namespace mpq;

namespace {

rt::ExecOptions host_cuda_options(test::HostMemory& mem) {
  rt::ExecOptions o;
  o.backend = rt::BackendKind::CUDA;
  o.cuda_ops = &mpq::cuda::host_ops_table();
  o.cuda_memory = &mem;
  o.threads = 1;
  return o;
}

}  // namespace

TEST_CASE("Executor with the CUDA backend matches the CPU executor, run after run", "[cuda][host_bodies][executor]") {
  test::HostMemory mem;
  for (const std::string& name : test::runner_models()) {
    INFO(name);
    const ir::Model m = ir::load_model(test::models_dir() / (name + ".onnx"));
    const rt::Feeds feeds = test::random_feeds(m);
    rt::Executor cpu(m);
    rt::Executor gpu(m, host_cuda_options(mem));
    const std::vector<Tensor> want = cpu.run(feeds);
    for (int run = 0; run < 2; ++run) {  // the second run reuses the uploaded initializers
      INFO("run " << run);
      const std::vector<Tensor> got = gpu.run(feeds);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("output " << i);
        CHECK(got[i].is_host());
        REQUIRE(got[i].shape() == want[i].shape());
        if (want[i].dtype() == DType::Float32) CHECK(test::rel_l2(got[i], want[i]) < 1e-5);
      }
    }
  }
}

TEST_CASE("the CUDA path serves observers and intermediate values like the CPU path", "[cuda][host_bodies][executor]") {
  test::HostMemory mem;
  const ir::Model m = ir::load_model(test::models_dir() / "resnet_bn_op13.onnx");
  const rt::Feeds feeds = test::random_feeds(m);
  auto observe = [&](rt::Executor& ex) {
    std::map<std::string, Tensor> seen;
    ex.set_observer([&](const ir::Value& v, const Tensor& t) {
      CHECK(t.is_host());
      seen[v.name()] = t.clone();
    });
    ex.run(feeds);
    return seen;
  };
  rt::Executor cpu(m);
  rt::Executor gpu(m, host_cuda_options(mem));
  const std::map<std::string, Tensor> want = observe(cpu), got = observe(gpu);
  REQUIRE(got.size() == want.size());
  REQUIRE(want.size() > 10);
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name));
    REQUIRE(got.at(name).shape() == t.shape());
    if (t.dtype() == DType::Float32) CHECK(test::rel_l2(got.at(name), t) < 1e-5);
  }
  // Intermediate values by name; an unknown name is a clear error.
  const std::string mid = m.graph->nodes()[m.graph->nodes().size() / 2]->output(0)->name();
  std::vector<Tensor> extra_cpu, extra_gpu;
  cpu.run(feeds, {mid}, &extra_cpu);
  gpu.run(feeds, {mid}, &extra_gpu);
  REQUIRE(extra_gpu.size() == 1);
  REQUIRE(extra_gpu[0].shape() == extra_cpu[0].shape());
  CHECK(test::rel_l2(extra_gpu[0], extra_cpu[0]) < 1e-5);
  CHECK_THROWS_WITH(gpu.run(feeds, {"no_such_value"}, &extra_gpu), Catch::Contains("no_such_value"));
  // Bad feeds are checked before anything runs, as on the CPU.
  CHECK_THROWS_AS(gpu.run({}), Error);
}

TEST_CASE("Executor with the CUDA backend and no GPU fails with one clear line", "[cuda][executor]") {
  const ir::Model m = ir::load_model(test::models_dir() / "resnet_bn_op13.onnx");
  rt::ExecOptions o;
  o.backend = rt::BackendKind::CUDA;
  try {
    rt::Executor ex(m, o);
    WARN("a CUDA device is usable here: nothing to check");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::BadInput);
    CHECK(std::string(e.what()).rfind("--device cuda: ", 0) == 0);
  }
}

namespace {
// What the last library calls were planned with (the recording table below).
rt::cuda_plan::LtCompute g_last_gemm_compute = rt::cuda_plan::LtCompute::I32;
rt::cuda_plan::ConvMath g_last_conv_math = rt::cuda_plan::ConvMath::Default;
}  // namespace

// ExecOptions::allow_tf32 (`mpq run --tf32`) reaches the plans the library entries get: the fast-TF32
// compute type for matrix products and tensor-op math for convolutions, FP32 math otherwise.
TEST_CASE("Executor's allow_tf32 reaches the library plans", "[cuda][host_bodies][executor]") {
  mpq::cuda::OpsTable recording = mpq::cuda::host_ops_table();
  recording.gemm = [](const rt::cuda_plan::GemmPlan& p, const void* a, const void* b, void* c, void* ws, size_t bytes,
                      const mpq::cuda::LaunchCtx& ctx) {
    g_last_gemm_compute = p.compute;
    return mpq::cuda::host_ops_table().gemm(p, a, b, c, ws, bytes, ctx);
  };
  recording.conv_forward = [](const rt::cuda_plan::ConvPlan& p, const float* x, const float* w, float* y, void* ws, size_t bytes,
                              const mpq::cuda::LaunchCtx& ctx) {
    g_last_conv_math = p.math;
    return mpq::cuda::host_ops_table().conv_forward(p, x, w, y, ws, bytes, ctx);
  };
  const ir::Model m = ir::load_model(test::models_dir() / "resnet_bn_op13.onnx");  // Conv and Gemm
  const rt::Feeds feeds = test::random_feeds(m);
  for (bool tf32 : {false, true}) {
    INFO("allow_tf32 " << tf32);
    test::HostMemory mem;
    rt::ExecOptions o = host_cuda_options(mem);
    o.cuda_ops = &recording;
    o.allow_tf32 = tf32;
    g_last_gemm_compute = rt::cuda_plan::LtCompute::I32;
    g_last_conv_math = rt::cuda_plan::ConvMath::Default;
    rt::Executor gpu(m, o);
    gpu.run(feeds);
    CHECK(g_last_gemm_compute == (tf32 ? rt::cuda_plan::LtCompute::F32_FAST_TF32 : rt::cuda_plan::LtCompute::F32));
    CHECK(g_last_conv_math == (tf32 ? rt::cuda_plan::ConvMath::TensorOp : rt::cuda_plan::ConvMath::Fma));
  }
}
