// ONNX node -> plan_node -> run_planned_node -> the kernel bodies, end to end on the host: the
// runner is given the host harness's kernel table and a backend whose "device" memory is host
// memory, so everything but the __global__ launch itself is the CUDA executor's path. Cases and
// comparison with the CPU kernels: node_cases.h (shared with gpu_node_runner_test).
#include "node_cases.h"

using namespace mpq;
using namespace mpq::test;
using rt::gpu::KernelRuntime;

TEST_CASE("nodes run through plan + runner + host kernel table match the CPU kernels", "[cuda][host_bodies][runner]") {
  HostMemory mem;
  run_node_cases(mpq::cuda::host_ops_table(), mem);
}

TEST_CASE("the runner refuses what it cannot execute, and bad Gather indices name the node", "[cuda][host_bodies][runner]") {
  HostMemory mem;
  CachingAllocator alloc(mem);
  KernelRuntime rt{mpq::cuda::host_ops_table(), alloc, mem, nullptr};
  ir::Model m;
  ir::Graph* g = m.graph.get();
  ir::Node* n = g->add_node("Gather", {g->add_value("x"), g->add_value("i")}, {g->add_value("y")}, "gather1");
  const Tensor x = f({5, 6}, 1), idx = i64({2}, {0, 5});
  const rt::cuda_plan::NodeLaunch l = rt::cuda_plan::plan_node(*n, 13, {x.shape(), idx.shape()}, {x.dtype(), idx.dtype()}, {&x, &idx});
  const std::vector<Tensor> dev = {to_device(x, alloc, mem, nullptr, "x", "Input"), to_device(idx, alloc, mem, nullptr, "i", "Input")};
  try {
    run_planned_node(l, *n, dev, rt);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("gather1") != std::string::npos);
  }
  CHECK_THROWS_AS(run_planned_node(l, *n, {x, idx}, rt), Error);  // host tensors: copies must be explicit
  rt::cuda_plan::NodeLaunch gemm;
  gemm.kind = rt::cuda_plan::LaunchKind::Gemm;
  try {
    run_planned_node(gemm, *n, dev, rt);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Unsupported);
  }
}
