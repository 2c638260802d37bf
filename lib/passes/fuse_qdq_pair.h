#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// Inference-time fusion for `mpq run` on the CPU: an activation's QuantizeLinear -> DequantizeLinear
// pair in a QDQ model (the fake quantization ONNX Runtime turns into int8 kernels) becomes one
// mpq::FakeQuant node, which computes the same values bit for bit (runtime/cpu/fake_quant.h): one
// pass over memory instead of two, no int8 tensor in between, and an element-wise op with one
// scale that block_conv_layout lets a channel-blocked tensor flow through, so the convolutions
// around it need no reorders.
//
// Guarded: a float32 input that is not a constant; a per-tensor (scalar) float32 scale and an int8
// or uint8 zero point (or none: uint8), constants; every reader of the quantized tensor is a DequantizeLinear with the same scale and
// zero point values; neither the quantized tensor nor any reader's output but the first is a graph
// output (a reader's output is replaced by the fused node's).
class FuseQdqPair : public NodeRewritePass {
 public:
  std::string name() const override { return "fuse_qdq_pair"; }
  std::vector<std::string> target_ops() const override { return {"QuantizeLinear"}; }

 protected:
  bool match(const ir::Model& model, const ir::Node& node) const override;
  void apply(ir::Model& model, ir::Node& node, PassStats& stats) override;
};

}  // namespace mpq::passes
