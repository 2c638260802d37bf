#pragma once
// Sensitivity search with FP32 fallback: quantize everything, measure the top-1 drop on labelled
// (or unlabelled) data, and when it is over budget keep the fewest quantized layers in float
// needed to meet it.
//
//   1. drop0 = drop of the fully quantized model. Done when drop0 <= budget.
//   2. Rank the quantized compute nodes (Conv, ConvTranspose, Gemm, MatMul reading a
//      DequantizeLinear) by the accuracy they cost:
//        exclusion: quantize with that one node kept in float and measure again (one evaluation per
//                   node; cost = drop0 - drop, ties broken by the output SNR gained);
//        snr:       one per-layer streaming comparison of the fully quantized model; cost = the
//                   noise the node's output adds by itself (local SNR, lowest first).
//   3. Greedily keep the worst-ranked nodes in float, re-measuring after each, until the budget
//      holds; then try dropping each kept node again (pruning) so the set stays small.
// The drop is the accuracy drop against labels when the data has them, otherwise the fraction of
// samples whose top-1 class differs from the FP32 model's. The FP32 side is run once and cached
// (only its class scores: rows x classes floats).
//
// lib/validate does not depend on lib/passes: the caller passes the quantizer as a function.
#include <nlohmann/json.hpp>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "data/feeds.h"
#include "ir/graph.h"
#include "validate/compare.h"

namespace mpq::validate {

// Builds the quantized model with the given node names kept in float.
using QuantizeFn = std::function<ir::Model(const std::set<std::string>& keep_float)>;

enum class SensitivityRank { Auto, Exclusion, Snr };

struct SensitivityOptions {
  double max_top1_drop = 0.01;  // fraction (0.01 = one percentage point)
  SensitivityRank rank = SensitivityRank::Auto;  // Auto: exclusion up to 24 candidate nodes, else snr
  int max_keep = -1;            // stop after keeping this many nodes in float (< 0: no limit)
  bool prune = true;
  CompareOptions compare;       // backend, threads, batch rows, max samples, class axis, label output
  std::function<void(const std::string&)> log;  // one line per evaluation (stderr in the CLI)
};

struct Evaluation {
  double drop = 0;            // accuracy drop (labels) or top-1 disagreement
  double agreement = 0;       // top-1 agreement with the reference
  double accuracy = 0;        // candidate accuracy (NaN without labels)
  double output_snr_db = 0;   // SNR of the class-score output
};

struct NodeCost {
  std::string node;
  std::string op_type;
  double cost = 0;              // exclusion: drop0 - drop with the node in float; snr: -local SNR dB
  double drop_in_float = 0;     // exclusion only (NaN for snr)
  double snr_db_in_float = 0;   // exclusion only: output SNR with the node in float
  double local_snr_db = 0;      // snr only: noise the node's output adds (NaN for exclusion)
};

struct SensitivityStep {
  std::vector<std::string> kept;
  Evaluation eval;
};

struct SensitivityResult {
  bool labels = false;
  std::string metric;  // "accuracy_drop" or "top1_disagreement"
  std::string output;  // class-score output used
  int64_t samples = 0;
  double reference_accuracy = 0;  // NaN without labels
  double budget = 0;
  std::string rank_method;  // "exclusion" or "snr"
  int candidates = 0;       // quantized compute nodes considered
  Evaluation initial;
  Evaluation final_eval;
  std::vector<NodeCost> ranking;       // most costly first
  std::vector<std::string> kept;       // nodes kept in float, in the order they were added
  std::vector<SensitivityStep> steps;  // greedy and pruning evaluations
  bool met = false;
  int evaluations = 0;
};

// Names of the quantized compute nodes of a QDQ model (Conv/ConvTranspose/Gemm/MatMul with an
// input produced by DequantizeLinear), in graph order, with their op types.
std::vector<std::pair<std::string, std::string>> quantized_compute_nodes(const ir::Model& model);

SensitivityResult run_sensitivity(const ir::Model& reference, const data::FeedSource& feeds, const QuantizeFn& quantize,
                                  const SensitivityOptions& options);

nlohmann::json sensitivity_to_json(const SensitivityResult& r);

}  // namespace mpq::validate
