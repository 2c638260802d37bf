// Whole models through the CUDA graph runner (runtime/cuda/graph_runner.h) on this machine: the
// host harness's kernel table and host memory stand in for the GPU, so every planned node runs the
// shared kernel bodies and every other node the CPU kernel with explicit copies. Outputs must
// agree with mpq's CPU executor. Inputs are seeded random data (symbolic dimensions set to 2,
// integer inputs to 1).
#include <catch2/catch.hpp>

#include <string>

#include "ir/onnx_io.h"
#include "node_cases.h"
#include "runtime/cuda/graph_runner.h"
#include "runtime/executor.h"

using namespace mpq;
using namespace mpq::test;

namespace {

rt::Feeds random_feeds(const ir::Model& m) {
  rt::Feeds feeds;
  uint32_t seed = 7;
  for (const ir::Value* v : m.graph->required_inputs()) {
    Shape s;
    for (const ir::Dim& d : v->type.dims) s.push_back(d.known() ? d.value : 2);
    if (v->type.elem == DType::Float32) {
      feeds[v->name()] = test::random_tensor(s, seed++, -1, 1);
    } else if (v->type.elem == DType::Int64) {
      feeds[v->name()] = Tensor::from<int64_t>(s, std::vector<int64_t>(static_cast<size_t>(shape_numel(s)), 1));
    } else {
      FAIL("input type " << dtype_name(v->type.elem) << " not handled by this test");
    }
  }
  return feeds;
}

}  // namespace

TEST_CASE("test models run through the CUDA graph runner on the host kernel table", "[cuda][host_bodies][runner]") {
  for (const char* name : {"resnet_bn_op13", "resnet_bn_op17", "mobilenetv3_op13", "transformer_op13", "unet_op13", "tiny_bert"}) {
    INFO(name);
    const ir::Model m = ir::load_model(test::source_dir() / "tests/models" / (std::string(name) + ".onnx"));
    const rt::Feeds feeds = random_feeds(m);
    rt::Executor cpu(m);
    const std::vector<Tensor> want = cpu.run(feeds);
    HostMemory mem;
    rt::gpu::CachingAllocator alloc(mem);
    rt::gpu::KernelRuntime krt{mpq::cuda::host_ops_table(), alloc, mem, nullptr};
    rt::gpu::FallbackLog log;
    rt::gpu::GraphRunStats stats;
    const std::vector<Tensor> got = rt::gpu::run_graph(m, feeds, krt, log, &stats);
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("output " << i);
      REQUIRE(got[i].shape() == want[i].shape());
      if (want[i].dtype() == DType::Float32) CHECK(test::rel_l2(got[i], want[i]) < 1e-5);
    }
    int device_nodes = 0;
    std::string device_ops, cpu_ops;
    for (const auto& [op, n] : stats.on_device) {
      device_nodes += n;
      device_ops += op + ":" + std::to_string(n) + " ";
    }
    for (const auto& [op, n] : stats.on_cpu) cpu_ops += op + ":" + std::to_string(n) + " ";
    INFO("kernel table: " << device_ops << "| CPU fallback: " << cpu_ops);
    CHECK(device_nodes > 0);
    CHECK(log.ops().size() == stats.on_cpu.size());
    CHECK(alloc.stats().in_use == 0);  // every device tensor was released
  }
}
