#pragma once
// The CUDA executor's per-node decision, made on the host: which shared kernel body (or cuBLASLt /
// cuDNN plan) runs an ONNX node with these input shapes and types, with what launch parameters -
// or why it falls back to the CPU kernel (logged once per op type by gpu::FallbackLog). Pure host
// logic, unit-tested against the CPU kernels' output shapes (tests/runtime/cuda_node_plan_test.cpp).
// The CUDA graph runner calls it for every node (runtime/cuda/graph_runner.h).
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"
#include "kernels/params.h"
#include "runtime/cuda/plan_conv.h"
#include "runtime/cuda/plan_gemm.h"
#include "runtime/cuda/plan_shape.h"

namespace mpq::rt::cuda_plan {

enum class LaunchKind {
  Fallback,
  Unary,
  Binary,
  Reduce,
  Softmax,
  LayerNorm,
  Pool2d,
  Resize2d,
  Gather,
  StridedCopy,  // Transpose, Slice
  Concat,
  Quantize,
  Dequantize,
  FakeQuant,
  Gemm,
  Conv,
  // ConvTranspose: cuDNN's backward-data of the convolution `conv` plans, which maps the
  // ConvTranspose's output shape to its input shape with the same weights.
  ConvTranspose,
  // mpq FakeQuantBias: the bias (rank 1) at input_scale * weight_scale[c] (quant_channels weight
  // scales: 1 or one per channel).
  FakeQuantBias,
  // Cast between FP32, FP16 and BF16 (runtime/cuda/device_convert.h); `cast_to` is the target.
  Cast,
};
const char* launch_kind_name(LaunchKind k);

struct NodeLaunch {
  LaunchKind kind = LaunchKind::Fallback;
  std::string reason;  // Fallback: why the CPU runs it
  Shape out_shape;
  cuda::UnaryOp unary = cuda::UnaryOp::Identity;
  float alpha = 0.0f, beta = 0.0f;  // HardSigmoid / HardSwish
  // Gather: the indices were known on the host and are all in range, so the runner needs no
  // out-of-range flag read back from the device (a synchronization per node).
  bool indices_checked = false;
  cuda::BinaryOp binary = cuda::BinaryOp::Add;
  cuda::ReduceOp reduce = cuda::ReduceOp::Sum;
  bool log_softmax = false;
  AxisView axis;  // Reduce / Softmax / Gather / Concat (of the output for Concat)
  cuda::Broadcast2 broadcast;
  cuda::StridedView view;
  cuda::Pool2dGeom pool;
  bool pool_max = false, count_include_pad = false;
  cuda::Resize2dGeom resize;
  float epsilon = 1e-5f;
  int64_t quant_channels = 1;  // Q/DQ/FakeQuant: scale length (1: per tensor)
  GemmPlan gemm;
  ConvPlan conv;
  // Gemm's C (beta = 1) or Conv's B, added to the library's output in place by the broadcasting
  // Add body: output (a) + bias (b).
  bool has_bias = false;
  cuda::Broadcast2 bias;
  DType cast_to = DType::Undefined;
};

// Choices the caller makes for every node. allow_tf32: FP32 GEMMs and convolutions may use TF32
// tensor-core math (as PyTorch's allow_tf32; `--tf32`), 10 mantissa bits in the products.
struct PlanOptions {
  bool allow_tf32 = false;
};

// The bodies and library plans are FP32: a graph runner gives a node with FP16/BF16 inputs its
// inputs widened and rounds its float outputs back (runtime/low_precision.h's rule), so only Cast
// sees the low types here.
// `inputs`: the node's input tensors where known at planning time (constant initializers such as
// Resize scales, Slice starts, Reshape shapes; null otherwise), `shapes` / `dtypes` for every input
// (omitted optional inputs: empty shape and DType::Undefined). `opset`: the node's domain version.
NodeLaunch plan_node(const ir::Node& node, int opset, const std::vector<Shape>& shapes, const std::vector<DType>& dtypes,
                     const std::vector<const Tensor*>& inputs, const PlanOptions& options = {});

}  // namespace mpq::rt::cuda_plan
