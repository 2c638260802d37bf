#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// The fake-quantization grid a value's elements lie on: every element is k * scale (the float32
// product) for an integer k in [lo, hi]. Known where the value comes from
// - an mpq::FakeQuant with one scale (scalar_fake_quant), or a convolution with one fused
//   (the fake_quant attribute of fuse_conv_fake_quant),
// - or from an op that only moves or selects elements (MaxPool's values, Concat, Reshape, Flatten,
//   Transpose, Squeeze, Unsqueeze, Identity) whose data inputs all lie on grids of the same scale
//   (lo and hi: the widest bounds among them).
// False otherwise. passes/int8_conv takes a convolution's input grid from here.
struct FakeQuantGrid {
  float scale = 0.0f, lo = 0.0f, hi = 0.0f;
};
bool fake_quant_grid(const ir::Value* v, FakeQuantGrid& grid);

// Inference on the CPU: drops an mpq::FakeQuant whose input already lies on its grid: the same
// scale (bit for bit) and bounds within its own. A QDQ model quantizes the output of a MaxPool or
// Concat again with its input's parameters (mpq quantize and ONNX Runtime's quantizer share them);
// that FakeQuant gives back its input value for value (x = k * s: x / s is within a few ulps of the
// integer k, which rounds back to k and clamps to itself; a NaN or inf never lies on a grid), so it
// only costs a pass over the tensor: 4 of INT8 U-Net's 7 FakeQuants at batch 1.
// Kept where the FakeQuant's output is a graph output.
class DropRedundantFakeQuant : public NodeRewritePass {
 public:
  std::string name() const override { return "drop_redundant_fake_quant"; }
  std::vector<std::string> target_ops() const override { return {"FakeQuant"}; }

 protected:
  bool match(const ir::Model& model, const ir::Node& node) const override;
  void apply(ir::Model& model, ir::Node& node, PassStats& stats) override;
};

}  // namespace mpq::passes
