#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// Folds an inference-mode BatchNormalization into the Conv, ConvTranspose (group 1) or Gemm that
// feeds it, or into a MatMul with a constant 2-D weight followed by a bias Add. Guarded: the
// producer's output has the BN as its only consumer and is not a graph output, every parameter is
// a float initializer of the expected shape, and the BN normalises the producer's channel axis.
// Weights shared with other nodes are copied, never changed in place.
class FuseConvBn : public NodeRewritePass {
 public:
  // float32_only: leave float16/bfloat16 producers alone (`mpq run` executes those exactly as
  // written, rounding included, to show what low-precision hardware would compute).
  explicit FuseConvBn(bool float32_only = false) : float32_only_(float32_only) {}
  std::string name() const override { return "fuse_conv_bn"; }
  std::vector<std::string> target_ops() const override { return {"BatchNormalization"}; }

 protected:
  bool match(const ir::Model& model, const ir::Node& bn) const override;
  void apply(ir::Model& model, ir::Node& bn, PassStats& stats) override;

 private:
  bool float32_only_;
};

}  // namespace mpq::passes
