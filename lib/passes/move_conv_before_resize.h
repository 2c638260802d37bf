#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// Inference-time rewrite for `mpq run`: a 1x1 convolution (stride 1, no padding, one group) whose
// input is a Resize of scales that change only the spatial axes runs before the Resize instead,
//   Conv(Resize(X)) -> Resize(Conv(X)).
// Both are linear per pixel and channel: the Conv mixes channels at each pixel, the Resize mixes
// pixels of each channel with weights that sum to 1 (nearest, linear and cubic, antialiased or
// not), so the bias passes through too and the outputs are equal up to float rounding. The Conv
// then runs on the smaller (input) resolution and the Resize on the Conv's channels: a decoder's
// 2x upsampling followed by a 1x1 projection (U-Net) does a quarter of its multiply-adds.
// Only where it saves work: an upsampling, and a count of multiply-adds and interpolation taps
// per output pixel that falls (it does whenever the Conv keeps or cuts the channel count).
// Guarded: float32; the Resize's output is read only by the Conv and is not a graph output (so
// values kept observable for calibration stay as written); scales are a constant of 1 on the batch
// and channel axes; not tf_crop_and_resize (its extrapolated pixels are a constant, not a weighted
// sum), not an `axes` attribute, not sizes (they name the channel count).
class MoveConvBeforeResize : public NodeRewritePass {
 public:
  std::string name() const override { return "move_conv_before_resize"; }
  std::vector<std::string> target_ops() const override { return {"Conv"}; }

 protected:
  bool match(const ir::Model& model, const ir::Node& node) const override;
  void apply(ir::Model& model, ir::Node& node, PassStats& stats) override;
};

}  // namespace mpq::passes
