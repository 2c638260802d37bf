#pragma once
// Whole test models through the CUDA graph runner (runtime/cuda/graph_runner.h) against mpq's CPU
// executor; shared by graph_runner_test (host kernel table, host memory) and gpu_graph_runner_test
// (GPU launchers, cudaMalloc). Inputs are seeded random data (symbolic dimensions set to 2, int64
// inputs to 1). Models come from $MPQ_TEST_MODELS (the GPU bundle's copy) or tests/models.
#include <cstdlib>
#include <string>

#include "ir/onnx_io.h"
#include "passes/convert_precision.h"
#include "node_cases.h"
#include "runtime/cuda/graph_runner.h"
#include "runtime/executor.h"

namespace mpq::test {

inline fs::path models_dir() {
  const char* env = std::getenv("MPQ_TEST_MODELS");
  return env && *env ? fs::path(env) : source_dir() / "tests/models";
}

// The models the bundle carries (scripts/gpu_bundle.sh copies exactly these).
inline const std::vector<std::string>& runner_models() {
  static const std::vector<std::string> m = {"resnet_bn_op13", "resnet_bn_op17", "mobilenetv3_op13",
                                             "transformer_op13", "unet_op13", "tiny_bert"};
  return m;
}

inline rt::Feeds random_feeds(const ir::Model& m) {
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

// One run of `m` (seeded random feeds) through the graph runner against the CPU executor: outputs
// of the same shapes and types, the float ones within `tolerance` (relative L2), and every device
// buffer back with the allocator afterwards.
inline void check_run_against_cpu(const ir::Model& m, const cuda::OpsTable& table, rt::gpu::DeviceMemoryBackend& mem,
                                  double tolerance, rt::gpu::FallbackLog& log, rt::gpu::GraphRunStats& stats) {
  const rt::Feeds feeds = random_feeds(m);
  rt::Executor cpu(m);
  const std::vector<Tensor> want = cpu.run(feeds);
  rt::gpu::CachingAllocator alloc(mem);
  rt::gpu::KernelRuntime krt{table, alloc, mem, nullptr};
  const std::vector<Tensor> got = rt::gpu::run_graph(m, feeds, krt, log, &stats);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("output " << i);
    REQUIRE(got[i].shape() == want[i].shape());
    REQUIRE(got[i].dtype() == want[i].dtype());
    if (want[i].dtype() == DType::Float32) CHECK(test::rel_l2(got[i], want[i]) < tolerance);
  }
  CHECK(alloc.stats().in_use == 0);  // every device tensor was released
}

inline void run_model_cases(const cuda::OpsTable& table, rt::gpu::DeviceMemoryBackend& mem) {
  for (const std::string& name : runner_models()) {
    INFO(name);
    const ir::Model m = ir::load_model(models_dir() / (name + ".onnx"));
    rt::gpu::FallbackLog log;
    rt::gpu::GraphRunStats stats;
    check_run_against_cpu(m, table, mem, 1e-5, log, stats);
    int device_nodes = 0;
    std::string device_ops, cpu_ops;
    for (const auto& [op, n] : stats.on_device) {
      device_nodes += n;
      device_ops += op + ":" + std::to_string(n) + " ";
    }
    for (const auto& [op, n] : stats.on_cpu) cpu_ops += op + ":" + std::to_string(n) + " ";
    INFO("kernel table: " << device_ops << "| CPU fallback: " << cpu_ops);
    CHECK(device_nodes > 0);
    // The heavy ops of these FP32 models all run through the library entries.
    for (const char* heavy : {"Conv", "ConvTranspose", "MatMul", "Gemm"}) {
      INFO(heavy);
      CHECK(stats.on_cpu.count(heavy) == 0);
    }
    CHECK(log.ops().size() == stats.on_cpu.size());
  }
}

// The same models converted to FP16 (and one to BF16) by `mpq convert`'s pass, inputs and outputs
// kept FP32: every planned node computes in FP32 on the device with its FP16/BF16 inputs widened
// and its outputs rounded back, as the CPU executor's low-precision rule does, and the boundary
// Casts run on the device. Outputs against the CPU executor on the same converted model, within
// `tolerance` (relative L2): the summation orders differ, and a last-bit difference can flip an
// FP16 rounding. On the host kernel table four of the five come out identical, the U-Net 1.1e-4.
inline void run_low_precision_model_cases(const cuda::OpsTable& table, rt::gpu::DeviceMemoryBackend& mem, double tolerance) {
  struct Case {
    const char* model;
    DType low;
  };
  for (const Case& c : {Case{"resnet_bn_op13", DType::Float16}, Case{"mobilenetv3_op13", DType::Float16},
                        Case{"unet_op13", DType::Float16}, Case{"transformer_op13", DType::Float16},
                        Case{"resnet_bn_op17", DType::BFloat16}}) {
    INFO(c.model << " " << dtype_name(c.low));
    ir::Model m = ir::load_model(models_dir() / (std::string(c.model) + ".onnx"));
    passes::ConvertOptions o;
    o.low = c.low;
    const passes::ConvertReport report = passes::convert_precision(m, o);
    REQUIRE(report.nodes_low > 0);
    rt::gpu::FallbackLog log;
    rt::gpu::GraphRunStats stats;
    check_run_against_cpu(m, table, mem, tolerance, log, stats);
    std::string cpu_ops;
    for (const auto& [op, n] : stats.on_cpu) cpu_ops += op + ":" + std::to_string(n) + " ";
    INFO("CPU fallback: " << cpu_ops);
    for (const char* op : {"Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Erf",
                           "HardSigmoid", "HardSwish", "Softmax", "Resize", "MaxPool", "GlobalAveragePool", "Transpose"}) {
      INFO(op);
      CHECK(stats.on_cpu.count(op) == 0);
    }
    CHECK(stats.on_device.count("Cast") > 0);  // at least the boundary Casts
  }
}

}  // namespace mpq::test
