// The training engine's device mode on a GPU: autograd_compare.h's comparisons with the GPU
// launchers, cuDNN / cuBLASLt (gpu_ops_table) and real device memory against the CPU engine (looser
// bounds than the host run: the libraries sum in other orders, and TF32 is off but cuDNN may pick
// another algorithm), then trainer steps with the update on the device. Written in the ninth
// session: not yet run on a GPU. Skipped, with the reason, without a GPU.
#include "autograd_compare.h"
#include "gpu_support.h"

using namespace mpq;
using namespace mpq::test;

TEST_CASE("device-mode autograd on the GPU matches the CPU engine on whole models", "[cuda][gpu][train]") {
  MPQ_REQUIRE_GPU();
  uint32_t seed = 1;
  for (const char* name : {"resnet_bn_op17.onnx", "mobilenetv3_op17.onnx", "transformer_op17.onnx"})
    for (bool training : {false, true}) {
      INFO(name << (training ? " training" : " eval"));
      test::CudaMemory mem;
      compare_engines(test::load_test_model(name), training, seed++, mpq::cuda::gpu_ops_table(), mem, 1e-3, false, 1e-4);
    }
  mpq::cuda::gpu_ops_table().release_stream(nullptr);
}

TEST_CASE("device-mode training steps on the GPU follow the CPU engine's, with the update on the device", "[cuda][gpu][train]") {
  MPQ_REQUIRE_GPU();
  const MakeOptimizer adamw = [](std::vector<train::ParamGroup> g) { return train::make_adamw(std::move(g)); };
  const MakeOptimizer sgd = [](std::vector<train::ParamGroup> g) { return train::make_sgd(std::move(g), {0.9, 0.0, true}); };
  for (const MakeOptimizer* make : {&adamw, &sgd}) {
    test::CudaMemory mem;
    const Run cpu = train_steps(false, *make, 4, mpq::cuda::gpu_ops_table(), mem);
    const Run dev = train_steps(true, *make, 4, mpq::cuda::gpu_ops_table(), mem);
    check_same_run(dev, cpu, 1e-3);
    REQUIRE(dev.to_host_after_first >= dev.graph_to_host);
    CHECK(dev.to_host_after_first - dev.graph_to_host < dev.param_bytes / 20);
  }
  mpq::cuda::gpu_ops_table().release_stream(nullptr);
}

// Tagged [fd]: gpu_check.sh leaves it out of the compute-sanitizer runs (its hundreds of forwards
// repeat what the other cases run there, and racecheck would take minutes).
TEST_CASE("device-mode gradients on the GPU agree with finite differences of its forward", "[cuda][gpu][train][fd]") {
  MPQ_REQUIRE_GPU();
  test::CudaMemory mem;
  check_finite_differences(mpq::cuda::gpu_ops_table(), mem);  // written after the second H100 run
  mpq::cuda::gpu_ops_table().release_stream(nullptr);
}
