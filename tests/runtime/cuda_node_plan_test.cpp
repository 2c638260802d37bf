// The CUDA per-node decision (runtime/cuda/node_plan.h): for supported nodes, the launch kind and
// an output shape equal to what mpq's CPU kernel produces; for the rest, a CPU fallback with a
// reason. Host logic only.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "runtime/cuda/node_plan.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::rt::cuda_plan;
using Attrs = std::vector<ir::Attribute>;

namespace {

NodeLaunch plan(const std::string& op, const std::vector<Tensor>& ins, const Attrs& attrs, int opset,
                const std::string& domain = "") {
  ir::Model m;
  m.set_opset("", opset);
  ir::Graph* g = m.graph.get();
  std::vector<ir::Value*> vals;
  for (size_t i = 0; i < ins.size(); ++i) vals.push_back(ins[i].defined() ? g->add_value("in" + std::to_string(i)) : nullptr);
  ir::Value* out = g->add_value("y");
  ir::Node* n = g->add_node(op, vals, {out}, "node_under_test", domain);
  for (const auto& a : attrs) n->set_attr(a);
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : ins) {
    shapes.push_back(t.defined() ? t.shape() : Shape{});
    dtypes.push_back(t.defined() ? t.dtype() : DType::Undefined);
    ptrs.push_back(t.defined() ? &t : nullptr);
  }
  return plan_node(*n, domain.empty() ? opset : 1, shapes, dtypes, ptrs);
}

// Planned on CUDA with the CPU kernel's output shape.
void check_planned(const std::string& op, const std::vector<Tensor>& ins, const Attrs& attrs, int opset, LaunchKind kind,
                   const std::string& domain = "") {
  INFO(op);
  const NodeLaunch l = plan(op, ins, attrs, opset, domain);
  INFO("fallback reason: " << l.reason);
  REQUIRE(l.kind == kind);
  const Tensor cpu = test::run_node(op, ins, attrs, 1, opset, 1, domain).at(0);
  CHECK(l.out_shape == cpu.shape());
}

Tensor f(Shape s, uint32_t seed = 1) { return test::random_tensor(s, seed); }
Tensor i64(Shape s, std::vector<int64_t> v) { return Tensor::from<int64_t>(std::move(s), v); }

}  // namespace

TEST_CASE("nodes the CUDA bodies run, with the CPU kernels' output shapes", "[cuda_plan]") {
  check_planned("Relu", {f({2, 3})}, {}, 13, LaunchKind::Unary);
  check_planned("Add", {f({2, 1, 5}), f({3, 1})}, {}, 13, LaunchKind::Binary);
  check_planned("ReduceMean", {f({2, 3, 4})}, {ir::Attribute::make_ints("axes", {1}), ir::Attribute::make_int("keepdims", 0)}, 13,
                LaunchKind::Reduce);
  check_planned("ReduceSum", {f({2, 3, 4}), i64({1}, {-1})}, {}, 13, LaunchKind::Reduce);
  check_planned("Softmax", {f({2, 3, 4})}, {ir::Attribute::make_int("axis", 1)}, 13, LaunchKind::Softmax);
  check_planned("LayerNormalization", {f({2, 3, 4}), f({4}), f({4})}, {}, 17, LaunchKind::LayerNorm);
  check_planned("MaxPool", {f({1, 2, 7, 6})},
                {ir::Attribute::make_ints("kernel_shape", {3, 2}), ir::Attribute::make_ints("strides", {2, 2}),
                 ir::Attribute::make_ints("pads", {1, 0, 1, 1}), ir::Attribute::make_int("ceil_mode", 1)},
                13, LaunchKind::Pool2d);
  check_planned("Transpose", {f({2, 3, 4})}, {ir::Attribute::make_ints("perm", {2, 0, 1})}, 13, LaunchKind::StridedCopy);
  check_planned("Slice", {f({5, 6}), i64({2}, {1, -1}), i64({2}, {4, 0}), i64({2}, {0, 1}), i64({2}, {2, -2})}, {}, 13,
                LaunchKind::StridedCopy);
  check_planned("Gather", {f({5, 6}), i64({2, 2}, {0, 4, -1, 2})}, {ir::Attribute::make_int("axis", 1)}, 13, LaunchKind::Gather);
  check_planned("Concat", {f({2, 3}), f({2, 1})}, {ir::Attribute::make_int("axis", 1)}, 13, LaunchKind::Concat);
  check_planned("QuantizeLinear", {f({2, 3}), Tensor::from<float>({3}, {0.1f, 0.2f, 0.3f}), Tensor::from<int8_t>({3}, {0, 1, 2})}, {}, 13,
                LaunchKind::Quantize);
  check_planned("DequantizeLinear", {Tensor::from<uint8_t>({2}, {3, 4}), Tensor::scalar<float>(0.5f), Tensor::scalar<uint8_t>(1)}, {}, 13,
                LaunchKind::Dequantize);
  check_planned("FakeQuant", {f({2, 3}), Tensor::scalar<float>(0.1f), Tensor::scalar<int32_t>(0)}, {}, 13, LaunchKind::FakeQuant,
                "mpq");
  check_planned("MatMul", {f({2, 3, 4}), f({4, 5})}, {}, 13, LaunchKind::Gemm);
  check_planned("Gemm", {f({4, 3}), f({5, 4})}, {ir::Attribute::make_int("transA", 1), ir::Attribute::make_int("transB", 1)}, 13,
                LaunchKind::Gemm);
  check_planned("Conv", {f({1, 4, 9, 9}), f({6, 2, 3, 3})},
                {ir::Attribute::make_int("group", 2), ir::Attribute::make_ints("pads", {1, 1, 1, 1}),
                 ir::Attribute::make_ints("strides", {2, 2})},
                13, LaunchKind::Conv);
  check_planned("Resize", {f({1, 2, 5, 7}), Tensor(), Tensor::from<float>({4}, {1, 1, 2.0f, 0.43f})},
                {ir::Attribute::make_string("mode", "linear")}, 13, LaunchKind::Resize2d);
  check_planned("Resize", {f({1, 2, 5, 7}), Tensor(), Tensor(), i64({4}, {1, 2, 3, 11})},
                {ir::Attribute::make_string("coordinate_transformation_mode", "asymmetric")}, 13, LaunchKind::Resize2d);
  check_planned("HardSigmoid", {f({2, 3})}, {ir::Attribute::make_float("alpha", 0.25f)}, 13, LaunchKind::Unary);
  const NodeLaunch hs = plan("HardSigmoid", {f({2, 3})}, {ir::Attribute::make_float("alpha", 0.25f)}, 13);
  CHECK(hs.alpha == 0.25f);
  CHECK(hs.beta == 0.5f);
  check_planned("HardSwish", {f({2, 3})}, {}, 14, LaunchKind::Unary);
  // Shape-only ops (one device copy under the new shape) and global pooling (one reduction).
  check_planned("Flatten", {f({2, 3, 4, 5})}, {ir::Attribute::make_int("axis", -2)}, 13, LaunchKind::Unary);
  check_planned("Flatten", {f({2, 3})}, {ir::Attribute::make_int("axis", 0)}, 13, LaunchKind::Unary);
  check_planned("Reshape", {f({2, 3, 4}), i64({3}, {0, -1, 2})}, {}, 14, LaunchKind::Unary);
  check_planned("Reshape", {f({2, 3, 4}), i64({2}, {4, 6})}, {}, 13, LaunchKind::Unary);
  check_planned("Reshape", {f({2, 3})}, {ir::Attribute::make_ints("shape", {3, -1})}, 4, LaunchKind::Unary);
  check_planned("Squeeze", {f({2, 1, 3, 1}), i64({1}, {-1})}, {}, 13, LaunchKind::Unary);
  check_planned("Squeeze", {f({1, 2, 1})}, {}, 13, LaunchKind::Unary);
  check_planned("Squeeze", {f({2, 1, 3, 1})}, {ir::Attribute::make_ints("axes", {1})}, 11, LaunchKind::Unary);
  check_planned("Unsqueeze", {f({2, 3}), i64({2}, {0, -1})}, {}, 13, LaunchKind::Unary);
  check_planned("Unsqueeze", {f({2, 3})}, {ir::Attribute::make_ints("axes", {1})}, 11, LaunchKind::Unary);
  check_planned("GlobalAveragePool", {f({2, 3, 5, 7})}, {}, 13, LaunchKind::Reduce);
  check_planned("GlobalMaxPool", {f({2, 3, 9})}, {}, 13, LaunchKind::Reduce);
  const NodeLaunch gap = plan("GlobalAveragePool", {f({2, 3, 5, 7})}, {}, 13);
  CHECK(gap.axis.outer == 6);
  CHECK(gap.axis.n == 35);
  CHECK(gap.axis.inner == 1);
  const NodeLaunch mm = plan("MatMul", {f({2, 3, 4}), f({4, 5})}, {}, 13);
  CHECK(mm.gemm.n == 6);  // batch folded into M (cuBLASLt's n)
  CHECK_FALSE(mm.has_bias);
  // Same batch dimensions on both sides: one strided-batched GEMM.
  check_planned("MatMul", {f({2, 3, 4, 5}), f({2, 3, 5, 6})}, {}, 13, LaunchKind::Gemm);
  const NodeLaunch bmm = plan("MatMul", {f({2, 3, 4, 5}), f({2, 3, 5, 6})}, {}, 13);
  CHECK(bmm.gemm.c.batch == 6);
  CHECK(bmm.gemm.a.batch_stride == 30);  // cuBLASLt's A is mpq's B, [5, 6] per batch
  CHECK(bmm.gemm.c.batch_stride == 24);
  // Gemm's C and Conv's B become a broadcast Add over the output.
  check_planned("Gemm", {f({3, 5}), f({5, 4}), f({3, 1})}, {}, 13, LaunchKind::Gemm);
  const NodeLaunch gb = plan("Gemm", {f({3, 5}), f({5, 4}), f({3, 1})}, {}, 13);
  CHECK(gb.has_bias);
  CHECK(gb.bias.b_stride[0] == 1);
  CHECK(gb.bias.b_stride[1] == 0);
  const NodeLaunch cb = plan("Conv", {f({1, 4, 9, 9}), f({6, 4, 3, 3}), f({6})}, {}, 13);
  REQUIRE(cb.kind == LaunchKind::Conv);
  CHECK(cb.has_bias);
  CHECK(cb.bias.rank == 4);
  CHECK(cb.bias.b_stride[1] == 1);
  CHECK(cb.bias.b_stride[2] == 0);
  CHECK_THROWS_AS(plan("Conv", {f({1, 4, 9, 9}), f({6, 4, 3, 3}), f({5})}, {}, 13), Error);
  // ConvTranspose: the backward-data plan of the convolution from Y's shape back to X's.
  using A = ir::Attribute;
  check_planned("ConvTranspose", {f({2, 6, 4, 5}), f({6, 3, 2, 2}), f({3})}, {A::make_ints("strides", {2, 2})}, 13,
                LaunchKind::ConvTranspose);
  check_planned("ConvTranspose", {f({1, 4, 5, 4}), f({4, 3, 3, 3})},
                {A::make_int("group", 2), A::make_ints("strides", {2, 3}), A::make_ints("pads", {1, 1, 1, 1}),
                 A::make_ints("output_padding", {1, 2})},
                13, LaunchKind::ConvTranspose);
  check_planned("ConvTranspose", {f({2, 3, 7}), f({3, 2, 3})}, {A::make_ints("dilations", {2})}, 13, LaunchKind::ConvTranspose);
  const NodeLaunch ct = plan("ConvTranspose", {f({2, 6, 4, 5}), f({6, 3, 2, 2}), f({3})}, {A::make_ints("strides", {2, 2})}, 13);
  CHECK(ct.conv.y_shape == std::vector<int64_t>{2, 6, 4, 5});  // the convolution maps Y's shape onto X's
  CHECK(ct.has_bias);
  CHECK_THROWS_AS(plan("ConvTranspose", {f({1, 4, 5, 5}), f({3, 2, 3, 3})}, {}, 13), Error);  // W[0] != X's channels
  check_planned("FakeQuantBias", {f({4}), f({1}), f({4})}, {}, 13, LaunchKind::FakeQuantBias, "mpq");
  CHECK(plan("FakeQuantBias", {f({4}), f({1}), f({3})}, {}, 13, "mpq").kind == LaunchKind::Fallback);  // the CPU reports it
  // Cast between the float types (FP16 / BF16 inputs included, which no other plan takes).
  const int fp16 = static_cast<int>(DType::Float16), bf16 = static_cast<int>(DType::BFloat16);
  check_planned("Cast", {f({2, 3})}, {A::make_int("to", fp16)}, 13, LaunchKind::Cast);
  const NodeLaunch cast = plan("Cast", {f({2, 3}).cast_to(DType::Float16)}, {A::make_int("to", bf16)}, 13);
  CHECK(cast.kind == LaunchKind::Cast);
  CHECK(cast.cast_to == DType::BFloat16);
  CHECK(cast.out_shape == Shape{2, 3});
}

TEST_CASE("everything else falls back to the CPU with a reason", "[cuda_plan]") {
  auto reason = [](const NodeLaunch& l) {
    CHECK(l.kind == LaunchKind::Fallback);
    return l.reason;
  };
  CHECK(reason(plan("TopK", {f({4}), i64({1}, {2})}, {}, 13)) == "no CUDA kernel");
  CHECK(reason(plan("Relu", {Tensor::from<double>({2}, {1.0, 2.0})}, {}, 13)) == "input type float64");
  CHECK(reason(plan("Softmax", {f({2, 3})}, {}, 11)).find("opset < 13") != std::string::npos);
  CHECK(reason(plan("ReduceSum", {f({2, 3})}, {ir::Attribute::make_ints("axes", {0, 1})}, 11)).find("several axes") !=
        std::string::npos);
  CHECK(reason(plan("Gemm", {f({2, 3}), f({3, 4}), f({4})}, {ir::Attribute::make_float("beta", 0.5f)}, 13)) ==
        "Gemm beta != 1");
  CHECK(reason(plan("MatMul", {f({2, 3, 4}), f({1, 4, 5})}, {}, 13)).find("broadcast batch") != std::string::npos);
  CHECK(reason(plan("Conv", {f({1, 2, 5, 5}), f({2, 2, 3, 3})}, {ir::Attribute::make_ints("pads", {0, 1, 1, 1})}, 13))
            .find("asymmetric") != std::string::npos);
  CHECK(reason(plan("ConvTranspose", {f({1, 2, 5, 5}), f({2, 2, 3, 3})}, {ir::Attribute::make_string("auto_pad", "SAME_UPPER")},
                    13)) == "auto_pad");
  CHECK(reason(plan("ConvTranspose", {f({1, 2, 5, 5}), f({2, 2, 3, 3})}, {ir::Attribute::make_ints("output_shape", {9, 9})},
                    13)) == "output_shape");
  CHECK(reason(plan("ConvTranspose", {f({1, 2, 5, 5}), f({2, 2, 3, 3})}, {ir::Attribute::make_ints("pads", {0, 1, 1, 1})}, 13))
            .find("asymmetric") != std::string::npos);
  CHECK(reason(plan("MaxPool", {f({1, 2, 5, 5, 5})}, {ir::Attribute::make_ints("kernel_shape", {2, 2, 2})}, 13))
            .find("2-D") != std::string::npos);
  CHECK(reason(plan("Add", {f(Shape(9, 1)), f({1})}, {}, 13)) == "rank above 8");
  CHECK(reason(plan("Relu", {f({2})}, {}, 13, "com.microsoft")).find("domain") != std::string::npos);
  CHECK(reason(plan("Cast", {i64({2}, {1, 2})}, {ir::Attribute::make_int("to", static_cast<int>(DType::Float32))}, 13))
            .find("between FP32, FP16 and BF16") != std::string::npos);
  CHECK(reason(plan("Cast", {f({2})}, {ir::Attribute::make_int("to", static_cast<int>(DType::Int64))}, 13))
            .find("between FP32, FP16 and BF16") != std::string::npos);
  CHECK(reason(plan("Relu", {f({2}).cast_to(DType::Float16)}, {}, 13)) == "input type float16");
  CHECK(std::string(launch_kind_name(LaunchKind::Fallback)) == "cpu-fallback");
  // Shape-only ops the CPU kernel must see: a shape computed at run time, or one it rejects (its
  // message names the problem; the planner does not guess).
  {
    ir::Model m;
    m.set_opset("", 13);
    ir::Graph* g = m.graph.get();
    ir::Node* n = g->add_node("Reshape", {g->add_value("x"), g->add_value("shape")}, {g->add_value("y")}, "reshape");
    const Tensor x = f({2, 3});
    const NodeLaunch l = plan_node(*n, 13, {x.shape(), {2}}, {DType::Float32, DType::Int64}, {nullptr, nullptr});
    CHECK(reason(l) == "Reshape: shape not constant");
  }
  CHECK(reason(plan("Reshape", {f({2, 3}), i64({2}, {4, -1})}, {}, 13)).find("cannot reshape [2,3] (6 elements) to [4,-1]") != std::string::npos);
  CHECK(reason(plan("Reshape", {f({2, 3}), i64({2}, {-1, -1})}, {}, 13)).find("more than one -1") != std::string::npos);
  CHECK(reason(plan("Reshape", {f({2, 3}), i64({2}, {5, 1})}, {}, 13)).find("cannot reshape") != std::string::npos);
  CHECK(reason(plan("Squeeze", {f({2, 3}), i64({1}, {1})}, {}, 13)).find("its size is not 1") != std::string::npos);
  CHECK(reason(plan("Unsqueeze", {f({2, 3}), i64({2}, {1, 1})}, {}, 13)).find("repeated") != std::string::npos);
  CHECK(reason(plan("Flatten", {f({2, 3})}, {ir::Attribute::make_int("axis", 3)}, 13)).find("range") != std::string::npos);
  CHECK(reason(plan("GlobalAveragePool", {f({2, 3})}, {}, 13)) == "rank below 3");
  CHECK(reason(plan("HardSwish", {f({2, 3})}, {}, 13)) == "HardSwish before opset 14");
  // Gather indices known on the host: checked there (no device flag), or the CPU kernel reports them.
  CHECK(reason(plan("Gather", {f({5, 6}), i64({2}, {1, 6})}, {ir::Attribute::make_int("axis", 1)}, 13)) == "Gather index out of range");
  CHECK(reason(plan("Gather", {f({5, 6}), i64({1}, {-6})}, {}, 13)) == "Gather index out of range");
  CHECK(plan("Gather", {f({5, 6}), i64({2}, {-5, 4})}, {}, 13).indices_checked);
  CHECK(reason(plan("Reshape", {Tensor::from<int64_t>({2}, {1, 2}), i64({1}, {2})}, {}, 13)) == "input type int64");
}

// TF32 only when asked (PlanOptions::allow_tf32, `--tf32`): FP32 matrix products get the fast-TF32
// compute type and convolutions cuDNN's tensor-op math; by default FP32 math.
TEST_CASE("TF32 is planned only when asked", "[cuda_plan]") {
  ir::Model m;
  m.set_opset("", 13);
  ir::Graph* g = m.graph.get();
  ir::Node* mm = g->add_node("MatMul", {g->add_value("a"), g->add_value("b")}, {g->add_value("y")}, "mm");
  ir::Node* conv = g->add_node("Conv", {g->add_value("x"), g->add_value("w")}, {g->add_value("z")}, "conv");
  for (bool tf32 : {false, true}) {
    INFO("allow_tf32 " << tf32);
    const PlanOptions o{tf32};
    const NodeLaunch lm = plan_node(*mm, 13, {{4, 8}, {8, 16}}, {DType::Float32, DType::Float32}, {nullptr, nullptr}, o);
    REQUIRE(lm.kind == LaunchKind::Gemm);
    CHECK(lm.gemm.compute == (tf32 ? LtCompute::F32_FAST_TF32 : LtCompute::F32));
    const NodeLaunch lc = plan_node(*conv, 13, {{1, 3, 8, 8}, {4, 3, 3, 3}}, {DType::Float32, DType::Float32}, {nullptr, nullptr}, o);
    REQUIRE(lc.kind == LaunchKind::Conv);
    CHECK(lc.conv.math == (tf32 ? ConvMath::TensorOp : ConvMath::Fma));
  }
}
