#include "data/feeds.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "data/npy.h"
#include "ir/onnx_io.h"

namespace mpq::data {

std::string sanitize_name(const std::string& name) {
  if (name.empty()) return std::string(1, '_');
  std::string out = name;
  for (char& c : out) {
    unsigned char u = static_cast<unsigned char>(c);
    if (!(std::isalnum(u) || c == '.' || c == '_' || c == '-')) c = '_';
  }
  return out;
}

namespace {

bool is_tensor_file(const fs::path& p) {
  std::string ext = p.extension().string();
  return ext == ".npy" || ext == ".pb";
}

bool is_labels_file(const fs::path& p) {
  std::string f = p.filename().string();
  return f == "labels.npy" || f == "labels.txt";
}

std::vector<fs::path> sorted_entries(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (!name.empty() && name[0] == '.') continue;
    out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What a file holds without loading it when avoidable.
struct FileInfo {
  DType dtype;
  Shape shape;
};

FileInfo file_info(const fs::path& file) {
  if (file.extension() == ".npy") {
    NpyHeader h = read_npy_header(file);
    return {h.dtype, h.shape};
  }
  Tensor t = ir::load_tensor_pb(file);
  return {t.dtype(), t.shape()};
}

bool float_like(DType t) { return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16 || t == DType::Float64; }

void check_against(const fs::path& file, const FileInfo& info, const ir::Value& input, bool split_rows) {
  const ir::ValueType& vt = input.type;
  if (!vt.is_tensor()) return;
  if (vt.elem != DType::Undefined && info.dtype != vt.elem && !(float_like(info.dtype) && float_like(vt.elem)))
    fail_input("{}: holds {} data but model input '{}' is {}", file.string(), dtype_name(info.dtype), input.name(), vt.str());
  if (!vt.has_shape) return;
  Shape shape = info.shape;
  if (split_rows && !shape.empty()) shape[0] = 1;
  if (shape.size() != vt.dims.size())
    fail_input("{}: has shape {} (rank {}) but model input '{}' is {} (rank {})", file.string(), shape_str(info.shape),
               info.shape.size(), input.name(), vt.str(), vt.dims.size());
  for (size_t i = 0; i < shape.size(); ++i)
    if (vt.dims[i].known() && vt.dims[i].value != shape[i])
      fail_input("{}: has shape {} but model input '{}' is {}", file.string(), shape_str(info.shape), input.name(),
                 vt.str());
}

}  // namespace

std::vector<int64_t> read_labels(const fs::path& file) {
  if (file.extension() == ".npy") {
    Tensor t = read_npy(file);
    if (!dtype_is_integer(t.dtype())) fail_input("{}: labels must be integers, got {}", file.string(), dtype_name(t.dtype()));
    return t.to_int64_vector();
  }
  std::ifstream in(file);
  if (!in) fail_input("{}: cannot open labels file", file.string());
  std::vector<int64_t> labels;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    try {
      size_t used = 0;
      labels.push_back(std::stoll(line.substr(b), &used));
    } catch (const std::exception&) {
      fail_input("{}:{}: not an integer label: '{}'", file.string(), lineno, line);
    }
  }
  return labels;
}

FeedSource FeedSource::open(const fs::path& dir, const ir::Model& model, const DataOptions& options) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) fail_input("{}: data folder does not exist", dir.string());
  if (!fs::is_directory(dir, ec)) fail_input("{}: --data must be a folder", dir.string());
  FeedSource src;
  src.dir_ = dir;
  for (ir::Value* v : model.graph->required_inputs()) src.inputs_.push_back(v);
  if (src.inputs_.empty()) fail_input("{}: the model has no inputs to feed", dir.string());

  std::vector<fs::path> entries = sorted_entries(dir);
  std::vector<fs::path> subdirs, tensor_files, images;
  for (const fs::path& p : entries) {
    if (fs::is_directory(p, ec)) {
      bool has_data = false;
      for (const auto& e : fs::directory_iterator(p))
        if (is_tensor_file(e.path())) has_data = true;
      if (has_data) subdirs.push_back(p);
    } else if (is_labels_file(p)) {
      continue;
    } else if (is_tensor_file(p)) {
      tensor_files.push_back(p);
    } else if (is_image_file(p)) {
      images.push_back(p);
    }
  }

  if (!subdirs.empty()) {
    src.layout_ = Layout::FeedFolders;
    for (const fs::path& sub : subdirs) {
      Entry e;
      e.id = sub.filename().string();
      for (size_t k = 0; k < src.inputs_.size(); ++k) {
        const ir::Value* in = src.inputs_[k];
        fs::path candidates[] = {sub / (in->name() + ".npy"), sub / (sanitize_name(in->name()) + ".npy"),
                                 sub / fmt::format("input_{}.pb", k), sub / (sanitize_name(in->name()) + ".pb")};
        fs::path found;
        for (const fs::path& c : candidates)
          if (fs::is_regular_file(c, ec)) {
            found = c;
            break;
          }
        if (found.empty())
          fail_input("{}: no data for model input '{}' (looked for {}.npy or input_{}.pb)", sub.string(), in->name(),
                     sanitize_name(in->name()), k);
        FileInfo info = file_info(found);
        check_against(found, info, *in, false);
        if (k == 0) e.rows = info.shape.empty() ? 1 : info.shape[0];
        e.files.emplace_back(in->name(), found);
      }
      src.total_rows_ += e.rows;
      src.entries_.push_back(std::move(e));
    }
  } else if (!tensor_files.empty()) {
    src.layout_ = Layout::FlatFiles;
    if (src.inputs_.size() != 1)
      fail_input("{}: flat data files need a single-input model; this one has {} inputs, so use one subfolder per feed "
                 "holding <input name>.npy",
                 dir.string(), src.inputs_.size());
    const ir::Value* in = src.inputs_[0];
    bool fixed_batch_one = in->type.is_tensor() && in->type.has_shape && !in->type.dims.empty() &&
                           in->type.dims[0].known() && in->type.dims[0].value == 1;
    for (const fs::path& f : tensor_files) {
      FileInfo info = file_info(f);
      bool split = fixed_batch_one && !info.shape.empty() && info.shape[0] > 1;
      check_against(f, info, *in, split);
      std::string stem = f.stem().string();
      if (split) {
        for (int64_t r = 0; r < info.shape[0]; ++r) {
          src.entries_.push_back(Entry{fmt::format("{}_{}", stem, r), {{in->name(), f}}, r, 1});
          src.total_rows_ += 1;
        }
      } else {
        int64_t rows = info.shape.empty() ? 1 : info.shape[0];
        src.entries_.push_back(Entry{stem, {{in->name(), f}}, -1, rows});
        src.total_rows_ += rows;
      }
    }
  } else if (!images.empty()) {
    src.layout_ = Layout::Images;
    if (src.inputs_.size() != 1)
      fail_input("{}: image folders need a single-input model; this one has {} inputs", dir.string(), src.inputs_.size());
    const ir::Value* in = src.inputs_[0];
    if (in->type.is_tensor() && in->type.elem != DType::Float32 && in->type.elem != DType::Undefined)
      fail_input("{}: image data needs a float32 model input, '{}' is {}", dir.string(), in->name(), in->type.str());
    ImageSpec spec;
    if (options.image_spec) spec = *options.image_spec;
    else if (fs::is_regular_file(dir / "preprocess.json", ec)) spec = ImageSpec::from_json_file(dir / "preprocess.json");
    std::vector<int64_t> dims;
    if (in->type.has_shape)
      for (const auto& d : in->type.dims) dims.push_back(d.known() ? d.value : 0);
    spec.complete_from_shape(dims);
    if (spec.height <= 0 || spec.width <= 0)
      fail_input("{}: model input '{}' has no fixed image size; give \"size\" in preprocess.json", dir.string(), in->name());
    src.image_spec_ = spec;
    FileInfo info{DType::Float32, spec.layout == "NHWC" ? Shape{1, spec.height, spec.width, spec.channels == 0 ? 3 : spec.channels}
                                                       : Shape{1, spec.channels == 0 ? 3 : spec.channels, spec.height, spec.width}};
    check_against(images.front(), info, *in, false);
    for (const fs::path& f : images) {
      src.entries_.push_back(Entry{f.stem().string(), {{in->name(), f}}, -1, 1});
      src.total_rows_ += 1;
    }
  } else {
    fail_input("{}: no feeds found (expected subfolders with .npy/.pb files, flat .npy/.pb files, or images)", dir.string());
  }

  if (options.max_feeds >= 0 && static_cast<size_t>(options.max_feeds) < src.entries_.size()) {
    src.entries_.resize(static_cast<size_t>(options.max_feeds));
    src.total_rows_ = 0;
    for (const Entry& e : src.entries_) src.total_rows_ += e.rows;
  }
  for (const char* name : {"labels.npy", "labels.txt"}) {
    if (fs::is_regular_file(dir / name, ec)) {
      src.load_labels(dir / name);
      break;
    }
  }
  return src;
}

void FeedSource::load_labels(const fs::path& file) {
  std::vector<int64_t> labels = read_labels(file);
  // With --max-samples the feeds may be a prefix of the folder: keep the matching prefix.
  if (static_cast<int64_t>(labels.size()) < total_rows_)
    fail_input("{}: {} labels for {} data rows", file.string(), labels.size(), total_rows_);
  labels.resize(static_cast<size_t>(total_rows_));
  labels_ = std::move(labels);
}

Tensor FeedSource::load_file(const fs::path& file, const ir::Value& input) const {
  Tensor t;
  if (layout_ == Layout::Images) {
    t = load_image(file, *image_spec_);
  } else if (file.extension() == ".npy") {
    t = read_npy(file);
  } else {
    t = ir::load_tensor_pb(file);
  }
  if (input.type.is_tensor() && input.type.elem != DType::Undefined && t.dtype() != input.type.elem &&
      float_like(t.dtype()) && float_like(input.type.elem)) {
    t = t.cast_to(input.type.elem);
  }
  return t;
}

Feed FeedSource::get(size_t i) const {
  const Entry& e = entries_.at(i);
  Feed feed;
  feed.id = e.id;
  feed.rows = e.rows;
  for (const auto& [name, file] : e.files) {
    const ir::Value* input = nullptr;
    for (const ir::Value* v : inputs_)
      if (v->name() == name) input = v;
    if (e.row >= 0) {
      if (cached_path_ != file) {
        cached_tensor_ = load_file(file, *input);
        cached_path_ = file;
      }
      const Tensor& all = cached_tensor_;
      Shape row_shape = all.shape();
      row_shape[0] = 1;
      Tensor row(all.dtype(), row_shape);
      size_t bytes = row.nbytes();
      std::memcpy(row.raw_data(), static_cast<const uint8_t*>(all.raw_data()) + bytes * static_cast<size_t>(e.row), bytes);
      feed.tensors.emplace(name, std::move(row));
    } else {
      feed.tensors.emplace(name, load_file(file, *input));
    }
  }
  return feed;
}

Feed concat_feeds(const std::vector<Feed>& feeds) {
  if (feeds.empty()) fail_internal("concat_feeds: no feeds");
  if (feeds.size() == 1) return feeds[0];
  Feed out;
  out.id = feeds.front().id;
  out.rows = 0;
  for (const Feed& f : feeds) out.rows += f.rows;
  for (const auto& [name, first] : feeds.front().tensors) {
    Shape shape = first.shape();
    if (shape.empty()) fail_input("input '{}': scalar feeds cannot be batched", name);
    int64_t rows = 0;
    for (const Feed& f : feeds) {
      const Tensor& t = f.tensors.at(name);
      if (t.rank() != first.rank() || t.dtype() != first.dtype() ||
          !std::equal(t.shape().begin() + 1, t.shape().end(), first.shape().begin() + 1))
        fail_input("input '{}': feeds {} and {} have shapes {} and {} that cannot be batched", name, feeds.front().id,
                   f.id, shape_str(first.shape()), shape_str(t.shape()));
      rows += t.shape()[0];
    }
    shape[0] = rows;
    Tensor batch(first.dtype(), shape);
    uint8_t* dst = static_cast<uint8_t*>(batch.raw_data());
    for (const Feed& f : feeds) {
      const Tensor& t = f.tensors.at(name);
      std::memcpy(dst, t.raw_data(), t.nbytes());
      dst += t.nbytes();
    }
    out.tensors.emplace(name, std::move(batch));
  }
  return out;
}

}  // namespace mpq::data
