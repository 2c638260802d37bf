#pragma once
// A data folder (`--data DIR`, any layout of data/feeds.h) held in memory as rows, so that training
// can draw shuffled minibatches and calibration can take the first rows in batches. Models whose
// batch dimension is dynamic get minibatches of any size; a model that fixes batch 1 trains one row
// at a time.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/feeds.h"
#include "ir/graph.h"
#include "runtime/executor.h"

namespace mpq::train {

class RowDataset {
 public:
  static RowDataset load(const std::filesystem::path& dir, const ir::Model& model);

  int64_t rows() const { return rows_; }
  bool has_labels() const { return !labels_.empty(); }
  // Whether rows can be stacked into one feed (every input has a dynamic first dimension).
  bool batchable() const { return batchable_; }
  const std::filesystem::path& dir() const { return dir_; }
  // The rows `idx`, in that order, as one feed (BadInput when !batchable() and idx.size() > 1).
  rt::Feeds batch(const std::vector<int64_t>& idx) const;
  data::Feed feed(const std::vector<int64_t>& idx) const;
  // int64 [idx.size()] labels of those rows (BadInput naming the folder when it has none).
  Tensor labels(const std::vector<int64_t>& idx) const;
  // Rows [begin, end).
  static std::vector<int64_t> range(int64_t begin, int64_t end);

 private:
  std::filesystem::path dir_;
  std::vector<std::string> names_;
  std::vector<Tensor> data_;  // per input: [rows, ...]
  std::vector<int64_t> labels_;
  int64_t rows_ = 0;
  bool batchable_ = true;
};

// The permutation of [0, n) for `epoch` under `seed` (a fixed generator, the same on every
// platform and run, so a resumed run draws the same minibatches).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace mpq::train
