#pragma once
#include "passes/pass.h"

namespace mpq::passes {

// False when MPQ_GELU_MLP=0 is set: `mpq run` then keeps the nodes apart (for comparisons).
bool gelu_mlp_enabled();

// Inference-time fusion for `mpq run`: a transformer's feed-forward block as the earlier fusions
// leave it,
//   mpq::MatMulBias(X, W1, b1) -> Gelu -> mpq::MatMulBias(., W2, b2)
// becomes one mpq::GeluMlp(X, W1, b1, W2, b2) (runtime/cpu/mlp.cpp), which runs each thread's band
// of rows through all three steps: one parallel loop instead of three, the hidden rows kept in
// the thread's own cache. The same bits as the three nodes.
//
// Guarded: the Gelu is mpq::Gelu or ONNX Gelu (opset 20+; approximate "none" or "tanh"); W1 [K, H]
// and W2 [H, N] are float32 constants that mpq's own small-B kernel takes on this CPU
// (small_gemm_applies: K * H and H * N at most kSmallGemmMaxB, H and N at least 16, AVX2 and FMA;
// larger products stay MatMulBias nodes, on OpenBLAS or oneDNN's matmul); the biases are
// constants of rank <= 1; the first product's and the Gelu's outputs are read only inside the
// pattern and are not graph outputs (a tensor kept for calibration stays observable).
//
// A pre-norm block around it folds in too: a LayerNormalization over the last axis (constant
// scale and bias of K values, its other outputs unread) whose output only the first product reads
// becomes the node's layer_norm (inputs 5 and 6, its epsilon), and an Add of the block's output and
// the block's own input X (N == K), read by nothing else, its residual: x + MLP(LayerNorm(x)),
// a transformer layer's second half, as one node with one fork and join.

class FuseGeluMlp : public NodeRewritePass {
 public:
  std::string name() const override { return "fuse_gelu_mlp"; }
  std::vector<std::string> target_ops() const override { return {"Gelu"}; }

 protected:
  bool match(const ir::Model& model, const ir::Node& node) const override;
  void apply(ir::Model& model, ir::Node& node, PassStats& stats) override;
};

}  // namespace mpq::passes
