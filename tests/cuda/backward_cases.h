#pragma once
// Shared by backward_runner_test (host kernel table, host memory) and gpu_backward_runner_test
// (GPU launchers, cuDNN / cuBLASLt, device memory): one node's backward through
// train::gpu::run_backward_node, given exactly the forward values the CPU training engine keeps for
// the op (its GradDef's saved inputs and outputs, so a runner that reads anything else fails),
// compared with mpq's CPU backward kernel.
#include <catch2/catch.hpp>

#include "cpu_backward.h"
#include "host_grid.h"
#include "node_cases.h"
#include "train/cuda/backward_runner.h"

namespace mpq::test {


struct GradCase {
  std::string op;
  std::vector<Tensor> inputs;  // undefined: omitted optional input
  Attrs attrs;
  int opset;
  std::vector<char> wanted;
  std::string domain = "";  // mpq's own ops: "mpq", opset 1
};

// The forward on the CPU, then the backward both ways: the CPU backward kernel, and the runner
// with `table` and `mem` given what the CPU engine keeps; every wanted gradient compared.
inline void check_backward(const cuda::OpsTable& table, DeviceMemoryBackend& mem, const GradCase& c, uint32_t seed,
                           double rtol, double atol) {
  INFO(c.domain << (c.domain.empty() ? "" : "::") << c.op << " (opset " << c.opset << ")");
  const Tensor y = test::run_node(c.op, c.inputs, c.attrs, 1, c.opset, 1, c.domain).at(0);
  const Tensor dy = test::random_tensor(y.shape(), seed);
  const std::vector<Tensor> want = cpu_backward_inputs(c.op, c.opset, c.inputs, y, dy, c.attrs, c.wanted, {}, false, c.domain);

  const int op_opset = c.domain.empty() ? c.opset : 1;
  const train::GradDef* def = train::GradRegistry::global().find(c.domain, c.op, op_opset, rt::BackendKind::CPU);
  REQUIRE(def);
  CachingAllocator alloc(mem);
  KernelRuntime krt{table, alloc, mem, nullptr};
  ir::Model model;
  model.set_opset("", c.opset);
  if (!c.domain.empty()) model.set_opset(c.domain, 1);
  ir::Graph* g = model.graph.get();
  std::vector<ir::Value*> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) ins.push_back(c.inputs[i].defined() ? g->add_value("in" + std::to_string(i)) : nullptr);
  ir::Node* node = g->add_node(c.op, ins, {g->add_value("y")}, "node_under_test");
  node->domain = c.domain;
  for (const auto& a : c.attrs) node->set_attr(a);

  {
    train::gpu::BackwardCall call;
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const Tensor& t = c.inputs[i];
      const bool present = t.defined();
      call.present.push_back(present ? 1 : 0);
      call.input_shapes.push_back(present ? t.shape() : Shape{});
      // Constants the engine knows on the host: integer inputs (axes, shapes), Clip's bounds and
      // Resize's roi and scales.
      call.host_inputs.push_back(
          present && (t.dtype() != DType::Float32 || ((c.op == "Clip" || c.op == "Resize") && i > 0)) ? &t : nullptr);
      call.inputs.push_back(present && train::in_mask(def->saved_inputs, i) ? to_device(t, alloc, mem, nullptr, "in", "Input") : Tensor());
    }
    call.outputs.push_back(train::in_mask(def->saved_outputs, 0) ? to_device(y, alloc, mem, nullptr, "y", "Output") : Tensor());
    call.grad_outputs.push_back(to_device(dy, alloc, mem, nullptr, "dy", "Gradient"));
    call.wanted = c.wanted;
    const std::vector<Tensor> got = train::gpu::run_backward_node(*node, op_opset, call, krt);
    REQUIRE(got.size() == c.inputs.size());
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      INFO("input " << i);
      if (!c.wanted[i]) {
        CHECK_FALSE(got[i].defined());
        continue;
      }
      REQUIRE(got[i].defined());
      REQUIRE(want.at(i).defined());
      CHECK(got[i].device() == Device::CUDA);
      const Tensor h = to_host(got[i], mem, nullptr, "grad", "Gradient");
      REQUIRE(h.shape() == want[i].shape());
      const int64_t bad = test::first_mismatch(h.data<float>(), want[i].data<float>(), h.numel(), rtol, atol);
      INFO("first mismatch at element " << bad << ": got " << (bad >= 0 ? h.data<float>()[bad] : 0.0f) << ", expected "
                                        << (bad >= 0 ? want[i].data<float>()[bad] : 0.0f));
      CHECK(bad == -1);
    }
  }
  CHECK(alloc.stats().in_use == 0);  // every device buffer went back to the allocator
}


// Every op the runner takes, in odd shapes: broadcasting, groups, dilations, transposes, batches,
// pads, omitted bounds, keepdims off, axes as an input.
inline std::vector<GradCase> backward_cases() {
  using A = ir::Attribute;
  const Tensor x4 = f({2, 3, 6, 5}, 1);
  return {
      {"Relu", {x4}, {}, 14, {1}},
      {"Sigmoid", {x4}, {}, 13, {1}},
      {"Tanh", {x4}, {}, 13, {1}},
      {"HardSwish", {f({3, 7}, 2, -5, 5)}, {}, 14, {1}},
      {"HardSigmoid", {x4}, {A::make_float("alpha", 0.3f)}, 6, {1}},
      {"Exp", {x4}, {}, 13, {1}},
      {"Add", {f({2, 3, 4}, 3), f({3, 1}, 4)}, {}, 14, {1, 1}},
      {"Sub", {f({2, 3, 4}, 5), f({4}, 6)}, {}, 14, {1, 1}},
      {"Mul", {f({2, 3, 4}, 7), f({2, 1, 4}, 8)}, {}, 14, {1, 1}},
      {"Mul", {f({3, 4}, 9), f({3, 4}, 10)}, {}, 14, {0, 1}},
      {"Conv", {f({2, 4, 9, 8}, 11), f({6, 2, 3, 3}, 12), f({6}, 13)},
       {A::make_ints("pads", {1, 1, 1, 1}), A::make_ints("strides", {2, 1}), A::make_int("group", 2)}, 11, {1, 1, 1}},
      {"Conv", {f({1, 3, 7, 7}, 14), f({3, 1, 3, 3}, 15)},
       {A::make_ints("pads", {2, 2, 2, 2}), A::make_ints("dilations", {2, 2}), A::make_int("group", 3)}, 11, {1, 1}},
      {"Conv", {f({2, 3, 11}, 16), f({4, 3, 3}, 17)}, {A::make_ints("strides", {2})}, 11, {0, 1}},
      // ConvTranspose: dX a convolution of dY, dW its filter gradient, dB per channel; with
      // groups, pads and output_padding, and 1-D.
      {"ConvTranspose", {f({2, 6, 4, 5}, 69), f({6, 3, 2, 2}, 70), f({3}, 71)}, {A::make_ints("strides", {2, 2})}, 11, {1, 1, 1}},
      {"ConvTranspose", {f({1, 4, 5, 4}, 72), f({4, 3, 3, 3}, 73)},
       {A::make_int("group", 2), A::make_ints("strides", {2, 3}), A::make_ints("pads", {1, 1, 1, 1}),
        A::make_ints("output_padding", {1, 2})},
       11, {1, 1}},
      {"ConvTranspose", {f({2, 3, 7}, 74), f({3, 2, 3}, 75)}, {A::make_ints("dilations", {2}), A::make_ints("pads", {1, 1})}, 11,
       {1, 1}},
      {"Gemm", {f({5, 7}, 18), f({3, 7}, 19), f({3}, 20)}, {A::make_int("transB", 1)}, 13, {1, 1, 1}},
      {"Gemm", {f({7, 5}, 21), f({7, 3}, 22)}, {A::make_int("transA", 1)}, 13, {1, 1}},
      {"MatMul", {f({3, 5, 7}, 23), f({3, 7, 4}, 24)}, {}, 13, {1, 1}},
      {"MatMul", {f({2, 3, 5, 7}, 25), f({7, 4}, 26)}, {}, 13, {1, 1}},
      {"MaxPool", {x4}, {A::make_ints("kernel_shape", {3, 3}), A::make_ints("strides", {2, 2}), A::make_ints("pads", {1, 1, 1, 1})}, 12, {1}},
      {"AveragePool", {x4}, {A::make_ints("kernel_shape", {2, 3}), A::make_ints("pads", {0, 1, 1, 0})}, 11, {1}},
      {"GlobalAveragePool", {x4}, {}, 1, {1}},
      {"GlobalMaxPool", {x4}, {}, 1, {1}},
      {"Softmax", {f({3, 4, 5}, 27)}, {A::make_int("axis", 1)}, 13, {1}},
      {"LogSoftmax", {f({3, 4, 5}, 28)}, {}, 13, {1}},
      {"Clip", {x4, Tensor::scalar<float>(-0.5f), Tensor::scalar<float>(1.0f)}, {}, 13, {1, 0, 0}},
      {"Clip", {x4, Tensor(), Tensor::scalar<float>(0.25f)}, {}, 13, {1, 0, 0}},
      {"Clip", {x4}, {A::make_float("min", -1.0f), A::make_float("max", 0.5f)}, 6, {1}},
      {"ReduceMean", {x4}, {A::make_ints("axes", {1, 3}), A::make_int("keepdims", 0)}, 13, {1}},
      {"ReduceSum", {x4, i64({1}, {-2})}, {}, 13, {1, 0}},
      {"ReduceSum", {x4}, {A::make_int("keepdims", 0)}, 13, {1}},
      {"Transpose", {x4}, {A::make_ints("perm", {2, 0, 3, 1})}, 13, {1}},
      {"Flatten", {x4}, {A::make_int("axis", 2)}, 13, {1}},
      {"Reshape", {x4, i64({2}, {6, -1})}, {}, 14, {1, 0}},
      {"Unsqueeze", {x4, i64({1}, {0})}, {}, 13, {1, 0}},
      {"Div", {f({2, 3, 4}, 33), f({3, 1}, 34, 0.5f, 2.0f)}, {}, 14, {1, 1}},
      {"Concat", {f({2, 3, 4}, 35), f({2, 5, 4}, 36), f({2, 1, 4}, 37)}, {A::make_int("axis", -2)}, 13, {1, 0, 1}},
      // Per channel with zero points, clipping on both sides (values beyond the range), and per tensor.
      {"FakeQuant", {f({2, 3, 5, 4}, 38, -3, 3), Tensor::from<float>({3}, {0.02f, 0.05f, 0.1f}), Tensor::from<int32_t>({3}, {0, 2, -1})},
       {A::make_int("qmin", -8), A::make_int("qmax", 7), A::make_int("axis", 1)}, 13, {1, 1, 0}, "mpq"},
      {"FakeQuant", {f({3, 7}, 39, -2, 2), Tensor::scalar<float>(0.03f)}, {A::make_int("qmin", -128), A::make_int("qmax", 127)}, 13,
       {0, 1}, "mpq"},
      // Over the last axis with a bias, and without one (dScale only wanted, then dX only).
      {"LayerNormalization", {f({3, 5, 7}, 42), f({7}, 43, 0.5f, 1.5f), f({7}, 44)}, {A::make_float("epsilon", 1e-3f)}, 17, {1, 1, 1}},
      {"LayerNormalization", {f({4, 33}, 45), f({33}, 46)}, {A::make_int("axis", 1)}, 17, {0, 1}},
      {"LayerNormalization", {f({2, 1, 9}, 47), f({9}, 48), f({9}, 49)}, {}, 17, {1, 0, 0}},
      // Repeated and negative indices; a middle axis with 2-D indices.
      {"Gather", {f({5, 3}, 50), i64({4}, {1, -1, 1, 0})}, {}, 13, {1, 0}},
      {"Gather", {f({2, 6, 3}, 51), i64({2, 2}, {5, 0, 0, -6})}, {A::make_int("axis", 1)}, 13, {1, 0}},
      // Slice with negative steps and axes (opset 13) and by attributes (opset 9); Pad by input
      // and by attribute; Expand over new and size-1 dimensions; PRelu with a per-channel slope;
      // Where with a broadcast condition and branches.
      {"Slice", {f({4, 6, 5}, 52), i64({2}, {1, -1}), i64({2}, {4, 0}), i64({2}, {0, 2}), i64({2}, {2, -2})}, {}, 13, {1, 0, 0, 0, 0}},
      {"Slice", {f({3, 5}, 53)}, {A::make_ints("starts", {0, 1}), A::make_ints("ends", {2, 4})}, 9, {1}},
      {"Pad", {f({2, 3, 4}, 54), i64({6}, {0, 1, 2, 1, 0, 1}), Tensor::scalar<float>(0.5f)}, {}, 13, {1, 0, 0}},
      {"Pad", {f({3, 4}, 55)}, {A::make_ints("pads", {1, 0, 0, 2})}, 2, {1}},
      {"Expand", {f({3, 1, 4}, 56), i64({4}, {2, 3, 5, 4})}, {}, 13, {1, 0}},
      {"PRelu", {f({2, 3, 4, 5}, 57), f({3, 1, 1}, 58, 0.05f, 0.3f)}, {}, 16, {1, 1}},
      {"Where", {bools({3, 1}, {1, 0, 1}), f({3, 4}, 59), f({4}, 60)}, {}, 16, {0, 1, 1}},
      // Resize: nearest upsampling by scales, linear (half-pixel) by sizes to odd lengths; Neg.
      {"Resize", {f({2, 3, 4, 5}, 61), Tensor(), Tensor::from<float>({4}, {1, 1, 2, 2})}, {}, 13, {1, 0, 0}},
      {"Resize", {f({1, 2, 5, 3}, 62), Tensor(), Tensor(), i64({4}, {1, 2, 7, 8})}, {A::make_string("mode", "linear")}, 13,
       {1, 0, 0, 0}},
      {"Neg", {f({3, 7}, 63)}, {}, 13, {1}},
      // Pow's base: the exact square, cube and square-root slopes, a general exponent per column,
      // and a base broadcast against its exponent (the gradient summed back to the base's shape).
      {"Pow", {f({2, 3, 4}, 64, 0.2f, 2.0f), Tensor::scalar<float>(2.0f)}, {}, 13, {1, 0}},
      {"Pow", {f({3, 5}, 65, 0.2f, 2.0f), Tensor::scalar<float>(0.5f)}, {}, 15, {1, 0}},
      {"Pow", {f({3, 5}, 66, -2.0f, 2.0f), Tensor::scalar<float>(3.0f)}, {}, 15, {1, 0}},
      {"Pow", {f({4}, 67, 0.3f, 2.0f), f({3, 4}, 68, -1.5f, 2.5f)}, {}, 15, {1, 0}},
      {"FakeQuantBias", {f({6}, 40), Tensor::scalar<float>(0.05f), f({6}, 41, 0.01f, 0.1f)}, {}, 13, {1, 0, 0}, "mpq"},
  };
}

inline void run_backward_cases(const cuda::OpsTable& table, DeviceMemoryBackend& mem, double rtol, double atol) {
  uint32_t seed = 200;
  for (const GradCase& c : backward_cases()) check_backward(table, mem, c, seed++, rtol, atol);
}

}  // namespace mpq::test
