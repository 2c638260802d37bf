// ONNX's backend test cases through the executor's CUDA path, with the host harness's kernel
// table and host memory standing in for the GPU (tests/conformance_suite.h): every node the CUDA
// planner takes runs the shared kernel bodies (and the plans of the cuBLASLt/cuDNN entries), the
// rest their CPU kernels with explicit copies. Same cases, same tolerances, same known failures as
// the CPU run; gpu_conformance_test runs them on a GPU.
#include "conformance_suite.h"
#include "node_cases.h"

using namespace mpq;
using test::conformance::run_suite;
using test::conformance::SuiteResult;

TEST_CASE("ONNX backend conformance through the CUDA path (host kernel table)", "[conformance][cuda][host_bodies]") {
  test::HostMemory mem;
  rt::ExecOptions o;
  o.backend = rt::BackendKind::CUDA;
  o.cuda_ops = &mpq::cuda::host_ops_table();
  o.cuda_memory = &mem;
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) {
    INFO(suite);
    const SuiteResult r = run_suite(suite, o, " (CUDA path, host kernel table)");
    CHECK(r.failed == 0);
    CHECK(r.unexpected_pass == 0);
  }
}
