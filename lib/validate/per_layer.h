#pragma once
// Layer-by-layer comparison: which tensor of the candidate stands for which tensor of the
// reference, and, once the error statistics of every matched tensor are in, a ranking that names
// the layers where the error enters.
//
// Matching is by name. mpq's own passes keep tensor names: insert_qdq leaves `t` where it was and
// adds `t_quantized` / `t_dequantized` after it (a graph output produced by Conv/Gemm/MatMul keeps
// its name on the DequantizeLinear); FP16 conversion adds Casts. So a reference tensor R matches
//   1. the candidate tensor named R, when there is one (exact);
//   2. otherwise a float candidate tensor reached from R through DequantizeLinear, QuantizeLinear or
//      Cast nodes only, or named R_dequantized (the one with the fewest such steps).
// A candidate tensor declared with a non-float type (a QOperator model's int8 `R`) is never an
// exact match.
// Tensors that exist only in one model (BatchNormalization folded into Conv, constants) are not
// compared; their count is reported.
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "validate/metrics.h"

namespace mpq::validate {

struct LayerMatch {
  std::string ref_name;
  // Elements whose reference magnitude reaches this are attention-mask fill values (see
  // mask_thresholds) and are left out of the statistics; +inf for ordinary tensors.
  double mask_threshold = std::numeric_limits<double>::infinity();
  std::string cand_name;
  const ir::Node* ref_node = nullptr;  // producer in the reference (nullptr for graph inputs)
  bool exact = true;                   // same name in both models
  int hops = 0;                        // DequantizeLinear/QuantizeLinear/Cast steps (rule 2)
};

struct LayerMatching {
  std::vector<LayerMatch> matches;                      // reference graph order
  std::unordered_map<std::string, size_t> by_ref;       // reference tensor -> matches index
  std::unordered_map<std::string, size_t> by_cand;      // candidate tensor -> matches index
  std::vector<std::string> unmatched;                   // reference node outputs with no counterpart
};

// Tensors that carry an additive attention mask: reached from a float constant holding a value of
// magnitude >= 1e4 (-3.4e38 = float32 min, -1e9, -10000: the fill values exporters use) through
// element-wise and data-movement ops only (Where, Mul, Sub, Add, Cast, Expand, Reshape, ...), up to
// the Softmax that consumes them. In those tensors an element at or beyond half the fill value's
// magnitude is the mask, not signal: it is identical in both models and would dominate sum(r^2),
// giving an SNR of several hundred dB that says nothing, and an upstream figure that hides the
// error the scores carry. Name -> threshold.
std::unordered_map<std::string, double> mask_thresholds(const ir::Model& ref);

// Match the top-level tensors (graph inputs and node outputs; Constant nodes skipped) of two models.
LayerMatching match_layers(const ir::Model& ref, const ir::Model& cand);

// Names a candidate tensor may stand for under rule 2, with the steps each takes: every tensor up
// its chain of DequantizeLinear/QuantizeLinear/Cast producers (1, 2, ... steps), and the name
// without a "_dequantized" suffix (1 step). Empty for a tensor with neither.
std::vector<std::pair<std::string, int>> candidate_origins(const ir::Value& cand_value);

struct LayerResult {
  std::string name;       // reference tensor
  std::string cand_name;  // candidate tensor compared with it
  std::string node;       // reference producer node name ("" for graph inputs)
  std::string op_type;    // reference producer op ("input" for graph inputs)
  int64_t order = 0;      // position in the reference's execution
  bool graph_input = false;
  ErrorStats stats;
  int64_t masked = 0;  // mask fill elements left out of stats (mask_thresholds)
  // Filled by rank_layers:
  double snr_db = 0;           // stats.snr_db()
  double upstream_snr_db = 0;  // worst SNR among the nearest compared tensors this layer reads (+inf: exact inputs)
  double drop_db = 0;          // upstream_snr_db - snr_db (+inf when the inputs were exact)
  // SNR of the noise this layer adds by itself: noise powers add, so
  // local = -10 log10(10^(-snr/10) - 10^(-upstream/10)); +inf when the layer adds none.
  double local_snr_db = 0;
};

struct PerLayerResult {
  std::vector<LayerResult> layers;  // execution order (graph inputs left out)
  std::vector<size_t> ranking;      // indices into layers, worst local SNR first
  // The first layer in execution order whose local SNR is within jump_db of the worst layer's:
  // where the error first jumps.
  std::optional<size_t> first_jump;
  double jump_db = 10.0;
  std::vector<std::string> unmatched;  // reference tensors with no candidate counterpart
  int64_t peak_window_bytes = 0;       // most reference activation bytes held at once
  int64_t masked = 0;                  // attention-mask fill elements left out, over all layers
};

// Computes snr/upstream/drop/local for every layer, the ranking and the first jump. `inputs` holds
// the statistics of graph inputs (their SNR is the start of every upstream chain).
void rank_layers(const ir::Model& ref, PerLayerResult& result, const std::vector<LayerResult>& inputs);

// "+inf"-safe formatting helpers shared by the reports.
std::string format_db(double db);

}  // namespace mpq::validate
