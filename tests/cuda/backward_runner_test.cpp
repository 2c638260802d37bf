// ONNX node -> run_backward_node -> the backward bodies and the cuDNN / cuBLASLt backward entries,
// on the host: the runner gets the host harness's kernel table and host memory posing as device
// memory (backward_cases.h). Always runs.
#include "backward_cases.h"

using namespace mpq;
using namespace mpq::test;

TEST_CASE("backward runner: every op with a device backward matches the CPU backward kernels", "[cuda][host_bodies][train]") {
  HostMemory mem;
  run_backward_cases(mpq::cuda::host_ops_table(), mem, 1e-4, 1e-5);
}

TEST_CASE("backward runner: what it does not take is Unsupported, naming the node", "[cuda][host_bodies][train]") {
  HostMemory mem;
  CachingAllocator alloc(mem);
  KernelRuntime krt{mpq::cuda::host_ops_table(), alloc, mem, nullptr};
  ir::Model model;
  model.set_opset("", 13);
  ir::Graph* g = model.graph.get();
  const Tensor a = f({3, 4}, 30), b = f({3, 4}, 31);
  train::gpu::BackwardCall call;
  call.present = {1, 1};
  call.input_shapes = {a.shape(), b.shape()};
  call.inputs = {to_device(a, alloc, mem, nullptr, "a", "Input"), to_device(b, alloc, mem, nullptr, "b", "Input")};
  call.grad_outputs = {to_device(f({3, 4}, 32), alloc, mem, nullptr, "dy", "Gradient")};
  call.wanted = {1, 1};
  SECTION("an op without a device backward (Tile)") {
    ir::Node* n = g->add_node("Tile", {g->add_value("a"), g->add_value("b")}, {g->add_value("y")}, "tile_node");
    try {
      train::gpu::run_backward_node(*n, 13, call, krt);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::Unsupported);
      CHECK(std::string(e.what()).find("tile_node") != std::string::npos);
    }
  }
  SECTION("a forward value the backward needs was not kept") {
    ir::Node* n = g->add_node("Mul", {g->add_value("a"), g->add_value("b")}, {g->add_value("y")}, "mul_node");
    call.inputs[0] = Tensor();
    try {
      train::gpu::run_backward_node(*n, 13, call, krt);
      FAIL("no error");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::Unsupported);
      CHECK(std::string(e.what()).find("was not kept") != std::string::npos);
    }
  }
  SECTION("host tensors are refused: copies must be explicit") {
    ir::Node* n = g->add_node("Add", {g->add_value("a"), g->add_value("b")}, {g->add_value("y")}, "add_node");
    call.inputs = {a, b};
    CHECK_THROWS_WITH(train::gpu::run_backward_node(*n, 13, call, krt), Catch::Contains("copies must be explicit"));
  }
}
