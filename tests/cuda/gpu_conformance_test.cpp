// ONNX's backend test cases through the executor's CUDA path on a GPU (the plugin: launchers,
// cuBLASLt, cuDNN), as cuda_conformance_test does with the host kernel table. Skipped, with the
// reason, without a GPU. Passed on an H100 (docs/gpu.md).
#include "conformance_suite.h"
#include "gpu_support.h"

using namespace mpq;
using test::conformance::run_suite;
using test::conformance::SuiteResult;

TEST_CASE("ONNX backend conformance through the CUDA path on the GPU", "[conformance][cuda][gpu]") {
  MPQ_REQUIRE_GPU();
  rt::ExecOptions o;
  o.backend = rt::BackendKind::CUDA;
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
    INFO(suite);
    const SuiteResult r = run_suite(suite, o, " (CUDA path, GPU)");
    CHECK(r.failed == 0);
    CHECK(r.unexpected_pass == 0);
  }
}
