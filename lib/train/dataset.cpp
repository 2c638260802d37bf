#include "train/dataset.h"

#include <cstring>
#include <numeric>

#include "core/error.h"

namespace mpq::train {

RowDataset RowDataset::load(const std::filesystem::path& dir, const ir::Model& model) {
  RowDataset d;
  d.dir_ = dir;
  const data::FeedSource src = data::FeedSource::open(dir, model);
  if (src.size() == 0) fail_input("{}: no data", dir.string());
  for (const ir::Value* v : model.graph->required_inputs()) {
    d.names_.push_back(v->name());
    if (!v->type.has_shape || v->type.dims.empty() || v->type.dims[0].known()) d.batchable_ = false;
  }
  std::vector<std::vector<Tensor>> parts(d.names_.size());
  for (size_t i = 0; i < src.size(); ++i) {
    data::Feed f = src.get(i);
    for (size_t k = 0; k < d.names_.size(); ++k) {
      const Tensor& t = f.tensors.at(d.names_[k]);
      if (t.rank() == 0) fail_input("{}: input '{}' of feed '{}' is a scalar; training needs a batch axis", dir.string(), d.names_[k], f.id);
      parts[k].push_back(t);
    }
    d.rows_ += f.rows;
  }
  for (size_t k = 0; k < d.names_.size(); ++k) {
    Shape shape = parts[k][0].shape();
    int64_t rows = 0;
    for (const Tensor& t : parts[k]) {
      if (Shape(t.shape().begin() + 1, t.shape().end()) != Shape(shape.begin() + 1, shape.end()) || t.dtype() != parts[k][0].dtype())
        fail_input("{}: feeds of input '{}' differ in type or shape ({} and {})", dir.string(), d.names_[k],
                   shape_str(shape), shape_str(t.shape()));
      rows += t.dim(0);
    }
    shape[0] = rows;
    Tensor all(parts[k][0].dtype(), shape);
    size_t off = 0;
    for (const Tensor& t : parts[k]) {
      std::memcpy(static_cast<char*>(all.raw_data()) + off, t.raw_data(), t.nbytes());
      off += t.nbytes();
    }
    if (rows != d.rows_) fail_input("{}: input '{}' has {} rows, the feeds {}", dir.string(), d.names_[k], rows, d.rows_);
    d.data_.push_back(std::move(all));
  }
  if (src.labels()) d.labels_ = *src.labels();
  return d;
}

data::Feed RowDataset::feed(const std::vector<int64_t>& idx) const {
  if (!batchable_ && idx.size() > 1)
    fail_input("the model fixes its batch size, so rows of {} cannot be stacked: use a batch size of 1", dir_.string());
  data::Feed f;
  f.rows = static_cast<int64_t>(idx.size());
  for (size_t k = 0; k < names_.size(); ++k) {
    const Tensor& all = data_[k];
    Shape shape = all.shape();
    shape[0] = static_cast<int64_t>(idx.size());
    Tensor t(all.dtype(), shape);
    const size_t row_bytes = all.nbytes() / static_cast<size_t>(std::max<int64_t>(all.dim(0), 1));
    for (size_t r = 0; r < idx.size(); ++r) {
      if (idx[r] < 0 || idx[r] >= rows_) fail_internal("row {} of {}", idx[r], rows_);
      std::memcpy(static_cast<char*>(t.raw_data()) + r * row_bytes,
                  static_cast<const char*>(all.raw_data()) + static_cast<size_t>(idx[r]) * row_bytes, row_bytes);
    }
    f.tensors[names_[k]] = std::move(t);
  }
  return f;
}

rt::Feeds RowDataset::batch(const std::vector<int64_t>& idx) const {
  data::Feed f = feed(idx);
  return rt::Feeds(f.tensors.begin(), f.tensors.end());
}

Tensor RowDataset::labels(const std::vector<int64_t>& idx) const {
  if (labels_.empty()) fail_input("{}: no labels.npy or labels.txt beside the data", dir_.string());
  Tensor t(DType::Int64, {static_cast<int64_t>(idx.size())});
  for (size_t r = 0; r < idx.size(); ++r) t.data<int64_t>()[r] = labels_.at(static_cast<size_t>(idx[r]));
  return t;
}

std::vector<int64_t> RowDataset::range(int64_t begin, int64_t end) {
  std::vector<int64_t> v(static_cast<size_t>(std::max<int64_t>(end - begin, 0)));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p = RowDataset::range(0, n);
  // SplitMix64 and a Fisher-Yates shuffle: fully specified, unlike std::shuffle's distribution.
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) * 0xBF58476D1CE4E5B9ull + 1;
  auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(next() % static_cast<uint64_t>(i + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

}  // namespace mpq::train
