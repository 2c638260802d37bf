#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// Inference-time fusion for `mpq run` (ONNX Runtime does the same at load time): GELU as
// PyTorch exports nn.GELU() before opset 20,
//   Div(x, sqrt 2) | Mul(x, 1/sqrt 2) -> Erf -> Add(1) -> Mul(x, .) -> Mul(0.5)   (or Mul(0.5 x, .))
// becomes one mpq::Gelu node (ONNX Gelu with approximate="none", available at any opset): one
// pass over memory instead of five.
//
// Guarded: float32 input; the constants are scalars equal to sqrt 2 (or 1/sqrt 2), 1 and 0.5
// within 1e-6; no intermediate read outside the pattern or a graph output.
class FuseGelu : public NodeRewritePass {
 public:
  std::string name() const override { return "fuse_gelu"; }
  std::vector<std::string> target_ops() const override { return {"Erf"}; }

 protected:
  bool match(const ir::Model& model, const ir::Node& node) const override;
  void apply(ir::Model& model, ir::Node& node, PassStats& stats) override;
};

}  // namespace mpq::passes
