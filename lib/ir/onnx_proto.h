#pragma once
// Conversions between the IR and ONNX protobuf classes, for the edges that need the protos
// themselves (checker, shape inference, tensor files). Everything else uses onnx_io.h.
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "core/file_io.h"
#include "ir/graph.h"

namespace mpq::ir {

// Resolves external data for tensors, confined to one folder; caches file mappings.
class ExternalDataReader {
 public:
  explicit ExternalDataReader(std::filesystem::path base_dir) : base_dir_(std::move(base_dir)) {}
  // Bytes [offset, offset+length) of `location`; length < 0 means to the end of the file.
  std::shared_ptr<void> read(const std::string& tensor_name, const std::string& location, int64_t offset,
                             int64_t length, size_t expected_bytes);
  // Bytes read per location, in first-use order.
  const std::vector<std::pair<std::string, uint64_t>>& usage() const { return usage_; }

 private:
  std::vector<std::pair<std::string, uint64_t>> usage_;
  std::filesystem::path base_dir_;
  std::map<std::string, std::shared_ptr<MappedFile>> files_;
};

Tensor tensor_from_proto(const onnx::TensorProto& p, ExternalDataReader* external);

// Called for each tensor large enough to go to external data; returns true when it took the bytes
// (and filled location/offset/length in the proto).
using ExternalDataSink = std::function<bool(const Tensor& t, onnx::TensorProto* p)>;
void tensor_to_proto(const Tensor& t, onnx::TensorProto* p, const ExternalDataSink* sink = nullptr);

Model model_from_proto(const onnx::ModelProto& proto, const std::filesystem::path& base_dir,
                       const std::string& label);
void model_to_proto(const Model& model, onnx::ModelProto* proto, const ExternalDataSink* sink = nullptr);

}  // namespace mpq::ir
