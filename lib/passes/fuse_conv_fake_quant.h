#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// The FakeQuant's [scale, lo, hi] (lo and hi relative to the zero point) when they are constants
// of the kind the fused epilogue takes; false otherwise. Also passes/int8_conv's test of an input
// grid.
bool scalar_fake_quant(const ir::Node& fq, float& scale, float& lo, float& hi);

// Inference-time fusion for `mpq run` on the CPU: an mpq::FakeQuant with one scale (what
// fuse_qdq_pair makes of a QDQ model's activation QuantizeLinear -> DequantizeLinear pair) right
// after a float32 Conv or mpq::FusedConv runs in the convolution's epilogue, as the attribute
// fake_quant = [scale, qmin - zero_point, qmax - zero_point]. The values are FakeQuant's
// (runtime/cpu/quant_internal.h, fake_quantize_value; oneDNN as post-ops: division, clamp, rounding
// half to even, product), except for a NaN: FakeQuant and mpq's kernels make it 0, oneDNN's
// post-ops (qmin - zero_point) * scale. One pass over
// the activation fewer, and the quantization runs on the convolution's threads, on data still in
// cache: a separate FakeQuant on a second thread read what the other core had written.
//
// Guarded: the convolution's output is read by this FakeQuant alone and is no graph output; the
// convolution has no fake_quant yet; scale (float32) and zero point (any integer type) are
// constant scalars; qmin and qmax lie within +-2^24, where they and their difference with the zero
// point are exact in float32.
class FuseConvFakeQuant : public NodeRewritePass {
 public:
  std::string name() const override { return "fuse_conv_fake_quant"; }
  std::vector<std::string> target_ops() const override { return {"FakeQuant"}; }

 protected:
  bool match(const ir::Model& model, const ir::Node& node) const override;
  void apply(ir::Model& model, ir::Node& node, PassStats& stats) override;
};

}  // namespace mpq::passes
