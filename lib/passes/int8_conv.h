#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// Inference on the CPU: marks the mpq::FusedConv nodes of a QDQ model that oneDNN can run in
// integers, with the attribute int8_scales = [x_scale, w_scale[0], ..., w_scale[M - 1]]
// (runtime/cpu/conv_onednn.h, Int8ConvScales). The model stays a float graph; the attribute only
// lets the kernel compute the same products as int8 x int8 -> int32 sums, about half the FP32
// kernel's time on 3x3 convolutions (scripts/bench_int8_conv.py, docs/runtime.md). mpq's own
// kernels, and oneDNN where it has no int8 kernel, ignore it.
//
// Marked only where every value is on an int8 grid, so that nothing is approximated:
// - X comes from a FakeQuant with one scale (fuse_qdq_pair's node) or from a convolution with that
//   FakeQuant fused (fuse_conv_fake_quant's fake_quant attribute), directly or through a MaxPool,
//   Concat or reshaping of such values (drop_redundant_fake_quant's fake_quant_grid), whose range
//   relative to the zero point lies within [-128, 127];
// - W is a float32 constant in which every output channel's values are integers in [-127, 127]
//   times one scale: what folding a DequantizeLinear of int8 (or 4-bit) weights gives, to float
//   rounding, per channel or per tensor;
// - B, if any, is a constant; the convolution is 2-D, group 1, with at least 8 input channels
//   (measured: the 3-channel first convolutions gain 0-30% or lose, less than the input's
//   conversion to int8 costs), no dilation. 1x1 convolutions are marked since mpq quantizes the
//   input itself (runtime/cpu/quantize_nhwc): MobileNetV3 INT8 5-8% faster, ResNet INT8 0-3%
//   (before, with oneDNN's reorder, MobileNetV3 was 12-17% slower); but not a 1x1 convolution of one
//   unpadded pixel by X's declared type (squeeze-and-excitation's), which mpq's float one-pixel
//   product runs 2-3x faster than oneDNN's int8 kernel (MobileNetV3 INT8 at batch 1 8% faster);
// - oneDNN computes int8 exactly on this CPU (runtime/cpu/conv_onednn.h,
//   onednn_int8_convolutions: VNNI).
class MarkInt8Conv : public NodeRewritePass {
 public:
  std::string name() const override { return "mark_int8_conv"; }
  std::vector<std::string> target_ops() const override { return {"FusedConv"}; }

 protected:
  bool match(const ir::Model& model, const ir::Node& node) const override;
  void apply(ir::Model& model, ir::Node& node, PassStats& stats) override;
};

// False where MPQ_INT8_CONV=0 in the environment: fuse_for_inference then marks nothing and every
// convolution runs in float, for comparisons (as MPQ_ONEDNN=0 and MPQ_BATCH_SPLIT=0 do for theirs).
bool int8_conv_enabled();

// The per-output-channel scales on whose integer grid (within [-qmax, qmax]) every weight of
// w [M, ...] lies, to within 1e-3 of a step; empty where a channel has none. A channel's scale is
// max |w| / k for the largest k <= qmax that puts every value on the grid.
std::vector<float> int8_weight_scales(const Tensor& w, int qmax = 127);

}  // namespace mpq::passes
