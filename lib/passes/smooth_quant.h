#pragma once
// SmoothQuant (Xiao et al., 2022): activation outliers sit in a few fixed channels (LayerNorm
// outputs of BERT-style encoders reach 10-30x the median channel), so one range per tensor or
// per token wastes most of the 8-bit levels on them. Per input channel j of a MatMul/Gemm weight,
//     s_j = max|X_j|^alpha / max_n |W_jn|^(1 - alpha),   X_j <- X_j / s_j,   W_jn <- W_jn * s_j
// leaves X.W unchanged in exact arithmetic and moves part of the range into the weights, which
// are quantized per output channel and absorb it better. alpha = 0.5 splits the difficulty evenly.
//
// X / s is folded into the LayerNormalization that produces X when every reader of X is smoothed
// (pre-LN blocks: the norm feeds only Q/K/V or the first FFN layer); otherwise a Mul by 1/s is
// inserted and the smoothed readers read its output (post-LN blocks, where the residual needs the
// unscaled X). max|X_j| comes from calibration data (collect_channel_amax).
#include <map>
#include <set>
#include <string>
#include <vector>

#include "data/feeds.h"
#include "ir/graph.h"
#include "runtime/kernel.h"

namespace mpq::passes {

struct SmoothQuantOptions {
  double alpha = 0.5;  // in [0, 1]: 0 leaves X alone, 1 moves all of its range into W
  std::set<std::string> exclude_nodes;
  std::set<std::string> exclude_ops;
};

struct SmoothQuantReport {
  int activations = 0;       // tensors smoothed
  int weights = 0;           // MatMul/Gemm weights rescaled
  int folded = 0;            // 1/s folded into a LayerNormalization
  int muls = 0;              // Mul nodes inserted
  double largest_factor = 1.0;  // max s_j (how far the worst channel was pulled in)
  std::vector<std::string> notes;
};

// Activation tensors SmoothQuant would rescale: inputs of MatMul/Gemm (transA = 0) with a float32
// rank-2 constant weight, outside Softmax/LayerNorm/GELU patterns and exclusions. Graph order.
std::vector<std::string> smooth_quant_targets(const ir::Model& model, const SmoothQuantOptions& options);

// Per-channel max |x| over the last axis of each named tensor on the feeds (all elements of the
// other axes, padding included).
std::map<std::string, std::vector<float>> collect_channel_amax(const ir::Model& model, const data::FeedSource& feeds,
                                                               const std::vector<std::string>& names,
                                                               int64_t max_samples = -1,
                                                               rt::BackendKind backend = rt::BackendKind::CPU,
                                                               int threads = 0);

// Rewrites `model` in place (targets without an entry in `channel_amax` are left alone).
SmoothQuantReport smooth_quant(ir::Model& model, const std::map<std::string, std::vector<float>>& channel_amax,
                               const SmoothQuantOptions& options);

}  // namespace mpq::passes
