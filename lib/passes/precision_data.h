#pragma once
// The data side of `mpq convert`: magnitudes of every activation on real data (data-aware mode)
// and the comparison of a converted model with its FP32 reference (--validate).
//
// The metrics here (cosine, relative L2, max |error|, top-1 agreement) are small local helpers
// until lib/validate offers them; they should be unified with it.
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "data/feeds.h"
#include "ir/graph.h"
#include "runtime/executor.h"

namespace mpq::passes::precision {

using ProgressFn = std::function<void(int64_t done, int64_t total)>;

// Largest |x| of every float tensor of the top-level graph (graph inputs and node outputs) over
// every feed, by value name; infinity when a value held inf or NaN.
std::unordered_map<std::string, double> collect_magnitudes(const ir::Model& model, const data::FeedSource& feeds,
                                                          const rt::ExecOptions& exec, const ProgressFn& progress = {});

struct OutputComparison {
  std::string name;
  int64_t values = 0;     // elements compared over all feeds
  double cosine = 1.0;    // smallest cosine similarity over the feeds
  double rel_l2 = 0.0;    // largest ||cand - ref|| / ||ref|| over the feeds
  double max_abs = 0.0;   // largest |cand - ref|
  int64_t rows = 0;       // rows for top-1 (argmax over the last axis), 0 when not a score tensor
  int64_t top1_agree = 0;
  int64_t nonfinite = 0;  // candidate values that are inf/NaN where the reference is finite
};

struct Comparison {
  int64_t feeds = 0;
  std::vector<OutputComparison> outputs;  // in graph output order
};

// Runs `reference` and `candidate` on every feed (float32 feeds are rounded to the candidate's
// input type where its interface is FP16/BF16) and compares their outputs.
Comparison compare_models(const ir::Model& reference, const ir::Model& candidate, const data::FeedSource& feeds,
                          const rt::ExecOptions& exec, const ProgressFn& progress = {});

// Metrics for one pair of tensors (any numeric types; half types are widened).
OutputComparison compare_tensors(const Tensor& candidate, const Tensor& reference);
// Folds one feed's comparison into an accumulated one.
void merge_comparison(OutputComparison& into, const OutputComparison& feed);

}  // namespace mpq::passes::precision
