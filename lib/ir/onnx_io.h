#pragma once
// ONNX import and export: the only place the IR meets ONNX protobuf (together with the
// libonnx-backed checker and shape inference in onnx_tools.h).
#include <filesystem>
#include <string>

#include "ir/graph.h"

namespace mpq::ir {

namespace fs = std::filesystem;

// Load a model file. External data is memory-mapped from files inside the model's folder; a
// location that escapes the folder, a missing file or a short read is a BadInput error naming the
// tensor. Models whose .onnx file is under protobuf's 2 GB limit load regardless of the size of
// their external data.
Model load_model(const fs::path& path);
// Parse serialized ModelProto bytes; `base_dir` resolves external data, `label` names the source
// in errors.
Model parse_model(const std::string& bytes, const fs::path& base_dir, const std::string& label);

enum class ExternalData { Auto, Always, Never };
struct SaveOptions {
  // Auto: tensors go to "<model file name>.data" only when the model would not fit in 2 GB.
  ExternalData external = ExternalData::Auto;
  size_t external_min_bytes = 1024;  // smaller tensors stay inline
};
// Write atomically (temporary file + rename) into place.
void save_model(const Model& model, const fs::path& path, const SaveOptions& options = {});
// Serialized bytes of the model with every tensor inline (fails beyond protobuf's 2 GB limit).
std::string serialize_model(const Model& model);

// A single serialized onnx.TensorProto file (the `input_0.pb` files of ONNX test data).
Tensor load_tensor_pb(const fs::path& path, std::string* name = nullptr);
void save_tensor_pb(const Tensor& t, const std::string& name, const fs::path& path);

}  // namespace mpq::ir
