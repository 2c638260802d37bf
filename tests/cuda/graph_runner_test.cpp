// Whole models through the CUDA graph runner on this machine: the host harness's kernel table and
// host memory stand in for the GPU, so every planned node runs the shared kernel bodies and every
// other node the CPU kernel with explicit copies. Outputs must agree with mpq's CPU executor
// (model_cases.h, shared with gpu_graph_runner_test).
#include <catch2/catch.hpp>

#include "model_cases.h"

using namespace mpq;

TEST_CASE("test models run through the CUDA graph runner on the host kernel table", "[cuda][host_bodies][runner]") {
  test::HostMemory mem;
  test::run_model_cases(mpq::cuda::host_ops_table(), mem);
}
