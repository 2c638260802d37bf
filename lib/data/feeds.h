#pragma once
// Data folders (`--data DIR`) as a stream of feeds, following DESIGN.md:
//  1. one subfolder per feed holding `<input name>.npy` (raw or sanitised name) or `input_<k>.pb`
//     (so ONNX test-case folders with test_data_set_* work as they are);
//  2. flat `*.npy` / `*.pb` files for single-input models, one feed per file, used as is; where the
//     model fixes batch 1 and a file holds N rows, it is split into N feeds;
//  3. images (.png, .jpg, ...) for single-image-input models, with a preprocessing spec.
// Labels (`labels.npy` / `labels.txt` beside the feeds) are read when present. Feeds are loaded
// on demand, so memory does not grow with the number of feeds; shapes and dtypes are checked
// against the model when the source is opened, before any work starts.
#include <filesystem>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "data/image.h"
#include "ir/graph.h"

namespace mpq::data {

namespace fs = std::filesystem;

// Letters, digits, '.', '_' and '-' are kept; anything else becomes '_'.
std::string sanitize_name(const std::string& name);

struct Feed {
  std::string id;  // subfolder name or file stem (`_<k>` appended for split rows)
  std::unordered_map<std::string, Tensor> tensors;  // by model input name
  int64_t rows = 1;  // batch rows this feed holds (for labels)
};

struct DataOptions {
  std::optional<ImageSpec> image_spec;  // overrides preprocess.json
  int64_t max_feeds = -1;               // < 0: all
};

class FeedSource {
 public:
  enum class Layout { FeedFolders, FlatFiles, Images };

  // Scans `dir`, checks every feed's inputs (names, dtypes, ranks, fixed dims) against the model.
  static FeedSource open(const fs::path& dir, const ir::Model& model, const DataOptions& options = {});

  size_t size() const { return entries_.size(); }
  Layout layout() const { return layout_; }
  const fs::path& dir() const { return dir_; }
  // Loads feed i (thread-compatible, not thread-safe: caches the last file read for row splits).
  Feed get(size_t i) const;
  // Total batch rows over all feeds (labels must match this count).
  int64_t total_rows() const { return total_rows_; }
  // Labels in feed order, one per batch row; nullopt when no labels file is present.
  const std::optional<std::vector<int64_t>>& labels() const { return labels_; }
  // Reads labels from an explicit file (.npy or .txt), checking the count against total_rows().
  void load_labels(const fs::path& file);

 private:
  struct Entry {
    std::string id;
    std::vector<std::pair<std::string, fs::path>> files;  // input name -> file
    int64_t row = -1;                                     // >= 0: take this row of the file
    int64_t rows = 1;
  };
  fs::path dir_;
  Layout layout_ = Layout::FeedFolders;
  std::vector<Entry> entries_;
  std::vector<const ir::Value*> inputs_;
  std::optional<ImageSpec> image_spec_;
  std::optional<std::vector<int64_t>> labels_;
  int64_t total_rows_ = 0;
  mutable fs::path cached_path_;
  mutable Tensor cached_tensor_;

  Tensor load_file(const fs::path& file, const ir::Value& input) const;
};

// Read labels (.npy of integers, or .txt with one integer per line).
std::vector<int64_t> read_labels(const fs::path& file);

// Concatenate feeds along the batch axis (axis 0) of every input; used to batch feeds for models
// with a dynamic batch dimension.
Feed concat_feeds(const std::vector<Feed>& feeds);

}  // namespace mpq::data
