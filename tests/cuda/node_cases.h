#pragma once
// Shared by node_runner_test (host kernel table, host memory) and gpu_node_runner_test (GPU
// launchers, device memory): ONNX nodes planned by plan_node, run by run_planned_node, compared
// with mpq's CPU kernels (bit-exact for the quantization ops).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/ops_table.h"
#include "runtime/cuda/device_tensor.h"
#include "runtime/cuda/node_plan.h"
#include "runtime/cuda/node_runner.h"
#include "test_util.h"

namespace mpq::test {

using rt::gpu::CachingAllocator;
using rt::gpu::CopyKind;
using rt::gpu::DeviceMemoryBackend;
using rt::gpu::KernelRuntime;
using rt::gpu::to_device;
using rt::gpu::to_host;
using rt::gpu::run_planned_node;
using Attrs = std::vector<ir::Attribute>;


struct HostMemory : DeviceMemoryBackend {
  int allocate(void** p, size_t bytes) override {
    *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    return *p ? 0 : 2;
  }
  int release(void* p) override {
    std::free(p);
    return 0;
  }
  int copy(void* dst, const void* src, size_t bytes, CopyKind, void*) override {
    std::memcpy(dst, src, bytes);
    return 0;
  }
  int synchronize(void*) override { return 0; }
};

inline Tensor f(Shape s, uint32_t seed, float lo = -2, float hi = 2) { return test::random_tensor(s, seed, lo, hi); }
inline Tensor i64(Shape s, std::vector<int64_t> v) { return Tensor::from<int64_t>(std::move(s), v); }
inline Tensor bools(Shape s, const std::vector<int>& v) {
  Tensor t(DType::Bool, std::move(s));
  for (size_t i = 0; i < v.size(); ++i) t.data<bool>()[i] = v[i] != 0;
  return t;
}

inline void check_node(const cuda::OpsTable& table, DeviceMemoryBackend& mem, const std::string& op, const std::vector<Tensor>& ins, const Attrs& attrs, int opset, size_t n_out = 1,
                const std::string& domain = "", double rtol = 2e-6, double atol = 1e-7) {
  INFO(op);
  CachingAllocator alloc(mem);
  KernelRuntime rt{table, alloc, mem, nullptr};
  ir::Model m;
  m.set_opset("", opset);
  ir::Graph* g = m.graph.get();
  std::vector<ir::Value*> vals;
  for (size_t i = 0; i < ins.size(); ++i) vals.push_back(ins[i].defined() ? g->add_value("in" + std::to_string(i)) : nullptr);
  std::vector<ir::Value*> outs;
  for (size_t i = 0; i < n_out; ++i) outs.push_back(g->add_value("out" + std::to_string(i)));
  ir::Node* node = g->add_node(op, vals, outs, "node_under_test", domain);
  for (const auto& a : attrs) node->set_attr(a);
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  std::vector<const Tensor*> consts;
  std::vector<Tensor> dev;
  for (const Tensor& t : ins) {
    shapes.push_back(t.defined() ? t.shape() : Shape{});
    dtypes.push_back(t.defined() ? t.dtype() : DType::Undefined);
    consts.push_back(t.defined() ? &t : nullptr);
    dev.push_back(t.defined() ? to_device(t, alloc, mem, nullptr, "in", "Input") : Tensor());
  }
  const rt::cuda_plan::NodeLaunch l = rt::cuda_plan::plan_node(*node, domain.empty() ? opset : 1, shapes, dtypes, consts);
  INFO("plan: " << rt::cuda_plan::launch_kind_name(l.kind) << " " << l.reason);
  REQUIRE(l.kind != rt::cuda_plan::LaunchKind::Fallback);
  const std::vector<Tensor> got = run_planned_node(l, *node, dev, rt);
  const std::vector<Tensor> want = test::run_node(op, ins, attrs, n_out, opset, 1, domain);
  REQUIRE(got.size() >= n_out);
  for (size_t i = 0; i < n_out; ++i) {
    INFO("output " << i);
    CHECK(got[i].device() == Device::CUDA);
    const Tensor h = to_host(got[i], mem, nullptr, "out", "Output");
    REQUIRE(h.shape() == want[i].shape());
    REQUIRE(h.dtype() == want[i].dtype());
    for (int64_t k = 0; k < h.numel(); ++k) {
      INFO("element " << k);
      const double a = h.get_double(k), b = want[i].get_double(k);
      REQUIRE(std::fabs(a - b) <= atol + rtol * std::fabs(b));
    }
  }
}


// MatMul / Gemm (cuBLASLt plans) and Conv (cuDNN plans) through the table's library entries: on
// the host the direct bodies run the plan's geometry, so these check the plans themselves (operand
// swap, transposes, batch strides, groups, pads, dilations, 1-D and 3-D) against the CPU kernels.
// Sums accumulate in another order than the CPU's blocked kernels: a small absolute tolerance.
inline void run_linalg_node_cases(const cuda::OpsTable& t, DeviceMemoryBackend& mem) {
  using ir::Attribute;
  const double rtol = 1e-5, atol = 1e-5;
  check_node(t, mem, "MatMul", {f({3, 5}, 31), f({5, 4}, 32)}, {}, 13, 1, "", rtol, atol);
  check_node(t, mem, "MatMul", {f({2, 3, 5}, 33), f({5, 7}, 34)}, {}, 13, 1, "", rtol, atol);
  check_node(t, mem, "MatMul", {f({2, 3, 4, 5}, 35), f({2, 3, 5, 6}, 36)}, {}, 13, 1, "", rtol, atol);
  check_node(t, mem, "Gemm", {f({5, 3}, 37), f({4, 5}, 38), f({4}, 39)},
             {Attribute::make_int("transA", 1), Attribute::make_int("transB", 1)}, 13, 1, "", rtol, atol);
  check_node(t, mem, "Gemm", {f({3, 5}, 40), f({5, 4}, 41), f({3, 1}, 42)}, {}, 13, 1, "", rtol, atol);
  check_node(t, mem, "Conv", {f({2, 4, 7, 6}, 43), f({6, 2, 3, 3}, 44), f({6}, 45)},
             {Attribute::make_int("group", 2), Attribute::make_ints("strides", {2, 1}), Attribute::make_ints("pads", {1, 1, 1, 1}),
              Attribute::make_ints("dilations", {1, 2})},
             13, 1, "", rtol, atol);
  check_node(t, mem, "Conv", {f({1, 3, 5, 5}, 46), f({3, 1, 3, 3}, 47)},
             {Attribute::make_int("group", 3), Attribute::make_ints("pads", {1, 1, 1, 1})}, 13, 1, "", rtol, atol);
  check_node(t, mem, "Conv", {f({1, 3, 9}, 48), f({4, 3, 3}, 49)},
             {Attribute::make_ints("pads", {2, 2}), Attribute::make_ints("dilations", {2})}, 13, 1, "", rtol, atol);
  check_node(t, mem, "Conv", {f({1, 2, 4, 5, 5}, 50), f({3, 2, 2, 3, 3}, 51), f({3}, 52)},
             {Attribute::make_ints("strides", {1, 2, 1}), Attribute::make_ints("pads", {0, 1, 1, 0, 1, 1})}, 13, 1, "", rtol,
             atol);
  // ConvTranspose as cuDNN's backward-data: U-Net's 2x upsampling (stride 2, kernel 2, bias),
  // padded with output_padding and groups, dilated 1-D, and 3-D.
  check_node(t, mem, "ConvTranspose", {f({2, 6, 4, 5}, 53), f({6, 3, 2, 2}, 54), f({3}, 55)},
             {Attribute::make_ints("strides", {2, 2})}, 13, 1, "", rtol, atol);
  check_node(t, mem, "ConvTranspose", {f({1, 4, 5, 4}, 56), f({4, 3, 3, 3}, 57), f({6}, 58)},
             {Attribute::make_int("group", 2), Attribute::make_ints("strides", {2, 3}), Attribute::make_ints("pads", {1, 1, 1, 1}),
              Attribute::make_ints("output_padding", {1, 2})},
             13, 1, "", rtol, atol);
  check_node(t, mem, "ConvTranspose", {f({2, 3, 7}, 59), f({3, 2, 3}, 60)},
             {Attribute::make_ints("dilations", {2}), Attribute::make_ints("pads", {1, 1})}, 13, 1, "", rtol, atol);
  check_node(t, mem, "ConvTranspose", {f({1, 2, 3, 3, 2}, 61), f({2, 2, 2, 2, 2}, 62)},
             {Attribute::make_ints("strides", {2, 1, 2})}, 13, 1, "", rtol, atol);
}

// Gather with indices the planner does not see (computed on the device): the body flags an index
// out of range and the runner reads the flag back and fails naming the node.
inline void check_gather_device_indices(const cuda::OpsTable& table, DeviceMemoryBackend& mem) {
  CachingAllocator alloc(mem);
  KernelRuntime rt{table, alloc, mem, nullptr};
  ir::Model m;
  m.set_opset("", 13);
  ir::Graph* g = m.graph.get();
  ir::Node* node = g->add_node("Gather", {g->add_value("x"), g->add_value("i")}, {g->add_value("y")}, "gather_under_test");
  const Tensor x = f({5, 6}, 60);
  for (const bool in_range : {true, false}) {
    INFO("in range: " << in_range);
    const Tensor idx = in_range ? i64({3}, {4, -5, 0}) : i64({2}, {1, 5});
    const rt::cuda_plan::NodeLaunch l =
        rt::cuda_plan::plan_node(*node, 13, {x.shape(), idx.shape()}, {DType::Float32, DType::Int64}, {nullptr, nullptr});
    REQUIRE(l.kind == rt::cuda_plan::LaunchKind::Gather);
    REQUIRE_FALSE(l.indices_checked);
    const std::vector<Tensor> dev = {to_device(x, alloc, mem, nullptr, "x", "Input"), to_device(idx, alloc, mem, nullptr, "i", "Input")};
    if (!in_range) {
      CHECK_THROWS_WITH(run_planned_node(l, *node, dev, rt), Catch::Contains("gather_under_test") && Catch::Contains("outside"));
      continue;
    }
    const Tensor got = to_host(run_planned_node(l, *node, dev, rt).at(0), mem, nullptr, "y", "Output");
    const Tensor want = test::run_node("Gather", {x, idx}, {}, 1, 13, 1, "").at(0);
    REQUIRE(got.shape() == want.shape());
    for (int64_t k = 0; k < got.numel(); ++k) CHECK(got.get_double(k) == want.get_double(k));
  }
}

// The node cases both runner tests use (host kernel table here, GPU launchers on a GPU).
inline void run_node_cases(const cuda::OpsTable& t, DeviceMemoryBackend& mem) {
  check_node(t, mem, "Sigmoid", {f({3, 5}, 1)}, {}, 13);
  check_node(t, mem, "Mul", {f({2, 1, 5}, 2), f({3, 1}, 3)}, {}, 13);
  check_node(t, mem, "ReduceMax", {f({2, 3, 4}, 4)}, {ir::Attribute::make_ints("axes", {-2})}, 13);
  check_node(t, mem, "LogSoftmax", {f({2, 3, 4}, 5)}, {ir::Attribute::make_int("axis", 0)}, 13);
  check_node(t, mem, "LayerNormalization", {f({3, 7}, 6), f({7}, 7), f({7}, 8)}, {ir::Attribute::make_float("epsilon", 1e-3f)}, 17, 3,
             "", 1e-5);
  check_node(t, mem, "AveragePool", {f({1, 2, 7, 6}, 9)},
             {ir::Attribute::make_ints("kernel_shape", {3, 2}), ir::Attribute::make_ints("pads", {1, 1, 1, 0}),
              ir::Attribute::make_int("count_include_pad", 1)},
             13);
  check_node(t, mem, "Resize", {f({1, 2, 5, 7}, 10), Tensor(), Tensor::from<float>({4}, {1, 1, 1.6f, 0.6f})},
             {ir::Attribute::make_string("mode", "linear"), ir::Attribute::make_string("coordinate_transformation_mode", "align_corners")},
             13, 1, "", 1e-5);
  check_node(t, mem, "Transpose", {f({2, 3, 4}, 11)}, {ir::Attribute::make_ints("perm", {1, 2, 0})}, 13);
  check_node(t, mem, "Slice", {f({5, 6}, 12), i64({1}, {-1}), i64({1}, {-7}), i64({1}, {1}), i64({1}, {-2})}, {}, 13);
  check_node(t, mem, "Gather", {f({5, 6}, 13), i64({3}, {4, -5, 0})}, {}, 13);
  check_gather_device_indices(t, mem);
  check_node(t, mem, "Concat", {f({2, 3}, 14), f({2, 2}, 15), f({2, 1}, 16)}, {ir::Attribute::make_int("axis", -1)}, 13);
  check_node(t, mem, "QuantizeLinear", {f({2, 3, 4}, 17), Tensor::from<float>({3}, {0.01f, 0.02f, 0.03f}), Tensor::from<int8_t>({3}, {0, 5, -3})},
             {ir::Attribute::make_int("axis", 1)}, 13, 1, "", 0);
  check_node(t, mem, "QuantizeLinear", {f({7}, 18), Tensor::scalar<float>(0.02f), Tensor::scalar<uint8_t>(128)}, {}, 13, 1, "", 0);
  check_node(t, mem, "DequantizeLinear", {Tensor::from<uint8_t>({4}, {0, 7, 128, 255}), Tensor::scalar<float>(0.5f), Tensor::scalar<uint8_t>(3)},
             {}, 13, 1, "", 0);
  check_node(t, mem, "FakeQuant", {f({2, 3, 5}, 19), Tensor::from<float>({3}, {0.01f, 0.02f, 0.05f}), Tensor::from<int32_t>({3}, {0, 1, -1})},
             {ir::Attribute::make_int("qmin", -7), ir::Attribute::make_int("qmax", 7), ir::Attribute::make_int("axis", 1)}, 13, 1,
             "mpq", 0);
  check_node(t, mem, "FakeQuantBias", {f({5}, 28), Tensor::scalar<float>(0.05f), Tensor::from<float>({5}, {0.01f, 0.02f, 0.03f, 0.04f, 0.05f})},
             {}, 13, 1, "mpq", 0);
  check_node(t, mem, "FakeQuantBias", {f({3}, 29), Tensor::scalar<float>(0.05f), Tensor::scalar<float>(0.02f)}, {}, 13, 1, "mpq", 0);
  check_node(t, mem, "HardSigmoid", {f({2, 3, 5}, 26, -6, 6)}, {ir::Attribute::make_float("alpha", 1.0f / 6.0f)}, 13);
  check_node(t, mem, "HardSwish", {f({2, 3, 5}, 27, -5, 5)}, {}, 14);
  // Shape-only ops (identity copy under the new shape) and global pooling (reduction per row).
  check_node(t, mem, "Flatten", {f({2, 3, 4, 5}, 20)}, {ir::Attribute::make_int("axis", 2)}, 13);
  check_node(t, mem, "Reshape", {f({2, 3, 4}, 21), i64({3}, {0, -1, 2})}, {}, 14);
  check_node(t, mem, "Squeeze", {f({2, 1, 3, 1}, 22), i64({1}, {-1})}, {}, 13);
  check_node(t, mem, "Unsqueeze", {f({2, 3}, 23), i64({2}, {0, 3})}, {}, 13);
  check_node(t, mem, "GlobalAveragePool", {f({2, 3, 5, 7}, 24)}, {}, 13, 1, "", 1e-6);
  check_node(t, mem, "GlobalMaxPool", {f({2, 4, 9}, 25)}, {}, 13);
  run_linalg_node_cases(t, mem);
}

}  // namespace mpq::test
