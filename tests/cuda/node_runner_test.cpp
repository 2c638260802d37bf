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
  rt::cuda_plan::NodeLaunch fallback;
  fallback.reason = "no CUDA kernel";
  try {
    run_planned_node(fallback, *n, dev, rt);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Unsupported);
    CHECK(std::string(e.what()).find("no CUDA kernel") != std::string::npos);
  }
  // A library that declines the problem (the host entry takes FP32 only) is Unsupported, naming
  // the node, the call and the library status, so the graph runner can move the node to the CPU.
  rt::cuda_plan::NodeLaunch half;
  half.kind = rt::cuda_plan::LaunchKind::Gemm;
  half.out_shape = {2, 4};
  rt::cuda_plan::GemmRequest r;
  r.m = 2;
  r.n = 4;
  r.k = 3;
  r.precision = rt::cuda_plan::GemmPrecision::FP16;
  half.gemm = rt::cuda_plan::plan_gemm(r);
  REQUIRE(half.gemm.use_cublaslt);
  ir::Node* mm = g->add_node("MatMul", {g->add_value("a"), g->add_value("b")}, {g->add_value("c")}, "matmul_half");
  const std::vector<Tensor> ab = {to_device(f({2, 3}, 2), alloc, mem, nullptr, "a", "Input"),
                                  to_device(f({3, 4}, 3), alloc, mem, nullptr, "b", "Input")};
  try {
    run_planned_node(half, *mm, ab, rt);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::Unsupported);
    const std::string what = e.what();
    CHECK(what.find("matmul_half") != std::string::npos);
    CHECK(what.find("CUBLAS_STATUS_NOT_SUPPORTED") != std::string::npos);
  }
}
