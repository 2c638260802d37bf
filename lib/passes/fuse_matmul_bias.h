#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// Inference-time fusion for `mpq run` (ONNX Runtime fuses MatMul + Add into Gemm/FusedMatMul at
// load time the same way): a float32 MatMul with a constant 2-D right operand B [K, N] whose only
// consumer is an Add of a constant bias of N values (or one) becomes one mpq::MatMulBias node,
//   Y = MatMul(A, B) + bias,
// which starts Y as the bias rows and lets the GEMM accumulate onto them (the linear layers of
// every transformer export). Guarded: the MatMul's output is read only by that Add and is not a
// graph output; the bias has rank <= 1. Never used where intermediate tensors must stay
// observable (calibration, per-layer validation).
class FuseMatMulBias : public NodeRewritePass {
 public:
  std::string name() const override { return "fuse_matmul_bias"; }
  std::vector<std::string> target_ops() const override { return {"Add"}; }

 protected:
  bool match(const ir::Model& model, const ir::Node& node) const override;
  void apply(ir::Model& model, ir::Node& node, PassStats& stats) override;
};

}  // namespace mpq::passes
