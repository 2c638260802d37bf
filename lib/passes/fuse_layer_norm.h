#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// Inference-time fusion for `mpq run` (ONNX Runtime does the same at load time): LayerNorm as
// PyTorch exports it before opset 17,
//   ReduceMean(x) -> Sub -> Pow(2) -> ReduceMean -> Add(eps) -> Sqrt -> Div -> Mul(gamma) [-> Add(beta)],
// becomes one mpq::LayerNormalization node (the ONNX op's semantics, available at any opset):
// one pass over each row instead of nine nodes and eight intermediate tensors.
//
// Guarded: float32 input; both ReduceMeans over the last axis only, keeping it; Pow's exponent
// exactly 2 (or Mul(d, d)); eps, gamma and beta constants of rank <= 1 (gamma and beta broadcast
// along the last axis, as the Mul and Add do); no intermediate read outside the pattern or a
// graph output. Never used where intermediate tensors must stay observable (calibration,
// per-layer validation).
class FuseLayerNorm : public NodeRewritePass {
 public:
  std::string name() const override { return "fuse_layer_norm"; }
  std::vector<std::string> target_ops() const override { return {"Sub"}; }

 protected:
  bool match(const ir::Model& model, const ir::Node& node) const override;
  void apply(ir::Model& model, ir::Node& node, PassStats& stats) override;
};

}  // namespace mpq::passes
