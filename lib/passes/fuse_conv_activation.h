#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// Inference-time fusion for `mpq run` (as ONNX Runtime does at load time): a float32 Conv
// followed by a residual Add and/or an activation becomes one mpq::FusedConv node,
//   Y = activation(Conv(X, W, B) + Z),
// so the convolution's epilogue does the work while its output is still in cache instead of
// separate passes over memory. Activations: Relu, LeakyRelu, Clip (constant bounds), Sigmoid,
// HardSigmoid, Tanh, HardSwish (also in its pre-opset-14 export form x * HardSigmoid(x) with
// alpha 1/6, beta 0.5). Guarded: the Conv's (and Add's) output has exactly one consumer
// and is not a graph output, and Z has the Conv output's shape. Calibration runs it with the
// tensors the quantizers read kept as graph outputs (passes/inference_fusion.h); per-layer
// validation, which compares every tensor, does not run it.
class FuseConvActivation : public NodeRewritePass {
 public:
  std::string name() const override { return "fuse_conv_activation"; }
  std::vector<std::string> target_ops() const override;

 protected:
  bool match(const ir::Model& model, const ir::Node& node) const override;
  void apply(ir::Model& model, ir::Node& node, PassStats& stats) override;
};

// The domain and op type of the fused node, and the activations it accepts (attribute
// "activation"; its parameters in "activation_params"). Later passes add "fake_quant"
// (fuse_conv_fake_quant: quantization after the activation, last in the epilogue) and
// "x_block"/"z_block"/"y_block" (block_conv_layout: the tensors' layouts).
inline constexpr const char* kFusedConvDomain = "mpq";
inline constexpr const char* kFusedConvOp = "FusedConv";

inline bool is_fused_conv(const ir::Node& n) { return n.domain == kFusedConvDomain && n.op_type == kFusedConvOp; }

// Removes `absorbed` (an op now computed in `conv`'s epilogue) and makes `conv` write its output
// value instead of its own; counts and notes the fusion.
void absorb_into_conv(ir::Model& model, ir::Node& conv, ir::Node& absorbed, PassStats& stats);

// Turns a Conv into an mpq::FusedConv (same inputs and attributes; the model gets the mpq opset).
inline void make_fused_conv(ir::Model& model, ir::Node& conv) {
  conv.op_type = kFusedConvOp;
  conv.domain = kFusedConvDomain;
  if (model.opset(kFusedConvDomain) == 0) model.set_opset(kFusedConvDomain, 1);
}

}  // namespace mpq::passes
