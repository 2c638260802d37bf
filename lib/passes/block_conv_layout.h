#pragma once
#include <cstdint>

#include "passes/pass.h"

namespace mpq::passes {

// Inference-time layout choice for `mpq run` on the CPU, after fuse_conv_activation: a float32
// tensor that flows only from one 2-D convolution into others (as their X or residual Z) stays in
// oneDNN's channel-blocked layout (nChw8c on AVX2, nChw16c on AVX-512) instead of being reordered
// to NCHW after the producer and back before every consumer, as ONNX Runtime's NCHWc
// transformation does. The producing and consuming convolutions become mpq::FusedConv nodes
// carrying x_block / z_block / y_block attributes; the tensor keeps its NCHW shape (its channels
// are a multiple of the block, or it is channels-last, so it holds the same number of elements).
// A tensor may also reach its convolutions through mpq::FakeQuant nodes with one scale (what
// passes/fuse_qdq_pair makes of a QDQ model's activation QuantizeLinear -> DequantizeLinear pairs):
// element-wise with one set of parameters, they compute the same values in any layout. And through
// a squeeze-and-excitation block: a GlobalAveragePool reading it becomes mpq::GlobalAveragePool and
// a Mul by a per-channel scale [1 or N, C, 1, 1] (by declared types) mpq::ScaleChannels, both with
// the tensor's layout as x_block (runtime/cpu/layout_ops.cpp: the plain ops' bits); the scaled
// tensor is kept in that layout for the convolutions after it. MobileNetV3's three blocks each had
// a conversion to NCHW after their depthwise convolution and one back before the next (about 1 us
// each at 7 x 7). A tensor only global pools read (a network's last convolution before its pool)
// is kept in its producer's layout too where its channels fit it.
// Guarded: never a graph output or a value a subgraph reads, never a tensor any other op reads,
// float32 only, channels a multiple of the block (without `channels_last` below). The kernel runs a blocked convolution through oneDNN, or through mpq's
// kernels with explicit conversions where oneDNN has no direct kernel for the shape, so the choice
// is always safe; it only pays where oneDNN runs both ends.
//
// With `channels_last` (oneDNN runs NHWC convolutions directly on this CPU), channel counts that are
// not a multiple of the block do not stop it: the tensors that meet at a convolution (its X, Z and
// Y) form groups, and a group with such a count is kept channels-last (NHWC, runtime/cpu/
// channel_blocks.h's kChannelsLast) as a whole, since oneDNN's direct kernels take one layout family
// in and out, not nChw16c on one side and NHWC on the other. MobileNets' 24-, 72- and 120-channel
// tensors stay NHWC from one convolution to the next instead of being reordered around each.
class BlockConvLayout : public Pass {
 public:
  // block: 8 or 16 (runtime/cpu/conv_onednn.h's onednn_channel_block()).
  explicit BlockConvLayout(int64_t block, bool channels_last = false) : block_(block), channels_last_(channels_last) {}
  std::string name() const override { return "block_conv_layout"; }
  std::vector<std::string> target_ops() const override { return {"Conv", "FusedConv"}; }
  PassStats run(ir::Model& model) override;

 private:
  int64_t block_;
  bool channels_last_;
};

}  // namespace mpq::passes
