#pragma once
// Runs a reference and a candidate model on the same feeds and folds their outputs (and, with
// per_layer, every matched intermediate tensor) into streaming error statistics.
//
// Per-layer streaming: the two executors run in lock step, one at a time. The reference runs
// until it has produced `window_bytes` of tensors the candidate will ask for, then hands over; the
// candidate consumes each reference tensor as soon as it computes its counterpart (the pair is
// folded into that layer's ErrorStats and released) and hands back when it needs one the
// reference has not produced yet. Memory therefore holds a window of activations, never all the
// activations of a feed, and nothing across feeds.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "data/feeds.h"
#include "ir/graph.h"
#include "runtime/executor.h"
#include "validate/metrics.h"
#include "validate/per_layer.h"

namespace mpq::validate {

struct CompareOptions {
  rt::BackendKind backend = rt::BackendKind::CPU;
  int threads = 0;
  int64_t batch_rows = 64;    // a feed holding more rows (dynamic batch) runs in slices of this many
  int64_t max_samples = -1;   // stop after this many rows (< 0: all)
  int class_axis = 1;         // where class scores lie, for top-1 (negative counts from the end)
  std::string label_output;   // output the labels refer to ("" = first classifier-shaped output)
  bool per_layer = false;
  double jump_db = 10.0;
  int64_t window_bytes = 32ll << 20;  // reference activations held before handing over (per_layer)
  std::function<void(int64_t done, int64_t total)> progress;  // rows
};

struct OutputResult {
  std::string name;
  Shape shape;  // of the first run (batch slice)
  DType ref_dtype = DType::Undefined;
  DType cand_dtype = DType::Undefined;
  ErrorStats stats;
  std::optional<Top1Stats> top1;  // when the output holds class scores
  bool labelled = false;          // the labels refer to this output
};

struct CompareResult {
  int64_t feeds = 0;  // feeds read
  int64_t rows = 0;   // batch rows (samples) compared
  int64_t runs = 0;   // executor runs per model
  std::vector<OutputResult> outputs;
  bool have_labels = false;
  std::optional<PerLayerResult> per_layer;

  // The labelled output (nullptr without labels).
  const OutputResult* labelled_output() const;
};

// BadInput on missing outputs, inputs that do not fit, shape mismatches, label count mismatches.
CompareResult compare_models(const ir::Model& ref, const ir::Model& cand, const data::FeedSource& feeds,
                             const CompareOptions& options);

// ---- pieces shared with the sensitivity search

// One executor run's worth of data: a feed, or a slice of rows of one.
struct Chunk {
  rt::Feeds tensors;
  int64_t rows = 1;
  int64_t first_row = 0;  // index of its first row over the whole data (for labels)
  std::string feed_id;
};
// Calls fn for every chunk in order; returns the number of feeds read. Feeds with more than
// batch_rows rows are sliced along axis 0 when every input's first dimension equals the row count.
int64_t for_each_chunk(const data::FeedSource& feeds, int64_t batch_rows, int64_t max_rows,
                       const std::function<void(const Chunk&)>& fn);
// Converts float feeds to the float type each model input declares (a FP16 model with FP16 inputs
// gets the same data as its FP32 reference).
rt::Feeds adapt_feeds(const ir::Model& model, const rt::Feeds& feeds);
// Checks that the candidate produces every output of the reference (BadInput otherwise) and
// returns the candidate output index for each reference output.
std::vector<size_t> map_outputs(const ir::Model& ref, const ir::Model& cand);

}  // namespace mpq::validate
