#pragma once
// One streaming calibration pass: the executor runs every feed, an observer folds every float
// activation into its TensorStats (running min/max and a widening histogram), and nothing is kept
// per sample, so memory does not grow with the number of feeds.
#include <functional>
#include <string>

#include "calib/range_methods.h"
#include "calib/table.h"
#include "data/feeds.h"
#include "ir/graph.h"
#include "runtime/kernel.h"

namespace mpq::calib {

struct CalibOptions {
  RangeMethod method = RangeMethod::Entropy;
  RangeOptions range;
  int64_t max_samples = -1;      // feeds to use (< 0: all)
  int batch_size = 1;            // feeds concatenated per run (needs a dynamic batch dimension)
  int bins = 2048;
  std::string activation_type = "int8";  // int8 symmetric, or uint8 asymmetric
  bool reduce_range = false;
  rt::BackendKind backend = rt::BackendKind::CPU;
  int threads = 0;
  std::function<void(int64_t done, int64_t total)> progress;
};

// Fails (BadInput) when the data does not fit the model; warns about NaN/inf per tensor.
CalibrationTable calibrate(const ir::Model& model, const data::FeedSource& feeds, const CalibOptions& options);
// The same over feeds produced on demand (`get(i)` for i < count), e.g. batches of rows held in
// memory by the QAT loop.
CalibrationTable calibrate(const ir::Model& model, int64_t count, const std::function<data::Feed(int64_t)>& get,
                           const CalibOptions& options);

// Quantization parameters for one tensor's statistics under the options (shared with quantize).
TensorCalib make_tensor_calib(const std::string& name, const TensorStats& stats, const CalibOptions& options);

}  // namespace mpq::calib
