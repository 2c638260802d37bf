// The executor's CUDA path for real: Executor with BackendKind::CUDA loads the plugin
// (libmpq_cuda.so), runs the test models on the GPU -- launchers, cuBLASLt, cuDNN, CPU fallbacks
// with copies -- and must match the CPU executor. Skipped, with the reason, without a GPU. NEVER
// RUN on a GPU yet (docs/gpu.md).
#include "gpu_support.h"
#include "model_cases.h"

using namespace mpq;

TEST_CASE("Executor on the CUDA plugin matches the CPU executor on the test models", "[cuda][gpu][executor]") {
  MPQ_REQUIRE_GPU();
  for (const std::string& name : test::runner_models()) {
    INFO(name);
    const ir::Model m = ir::load_model(test::models_dir() / (name + ".onnx"));
    const rt::Feeds feeds = test::random_feeds(m);
    rt::Executor cpu(m);
    rt::ExecOptions o;
    o.backend = rt::BackendKind::CUDA;
    rt::Executor gpu(m, o);
    const std::vector<Tensor> want = cpu.run(feeds);
    for (int run = 0; run < 2; ++run) {
      INFO("run " << run);
      const std::vector<Tensor> got = gpu.run(feeds);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        INFO("output " << i);
        REQUIRE(got[i].shape() == want[i].shape());
        // cuBLASLt/cuDNN may pick TF32-free but differently ordered FP32 algorithms.
        if (want[i].dtype() == DType::Float32) CHECK(test::rel_l2(got[i], want[i]) < 1e-4);
      }
    }
  }
}
