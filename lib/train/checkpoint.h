#pragma once
// Training checkpoints: named tensors plus JSON metadata in one file, written atomically (a
// temporary file beside the target, renamed into place), so a run killed at any moment leaves the
// previous checkpoint intact. A checksum over the whole payload turns a truncated or corrupted
// file into a clear error instead of silently resuming from garbage.
//
// Layout: "MPQCKPT1", u64 length of the JSON header, the header ({"meta": ..., "tensors": [{name,
// dtype, shape, offset, bytes}], "checksum": FNV-1a-64 of the tensor bytes}), then the tensor bytes.
#include <filesystem>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace mpq::train {

class Checkpoint {
 public:
  // Stores a host copy of `t` under `name` (replacing an earlier one).
  void put(const std::string& name, const Tensor& t);
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  // BadInput naming the checkpoint file when absent.
  const Tensor& get(const std::string& name) const;
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  nlohmann::json& meta() { return meta_; }
  const nlohmann::json& meta() const { return meta_; }
  const std::filesystem::path& source() const { return source_; }

  void save(const std::filesystem::path& file) const;
  static Checkpoint load(const std::filesystem::path& file);

 private:
  std::map<std::string, Tensor> tensors_;
  nlohmann::json meta_ = nlohmann::json::object();
  std::filesystem::path source_;
};

}  // namespace mpq::train
