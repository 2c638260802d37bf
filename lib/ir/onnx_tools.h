#pragma once
// libonnx-backed tools: the ONNX checker and ONNX shape inference.
#include <string>

#include "ir/graph.h"

namespace mpq::ir {

struct CheckResult {
  bool ran = false;  // false when libonnx cannot check this IR version / opset
  bool ok = false;
  std::string message;  // the checker's complaint, or why it did not run
};
// Runs onnx::checker::check_model. libonnx 1.12 knows IR versions up to 8 and opsets up to 17;
// newer models are reported as not checked rather than failed.
CheckResult check_model(const Model& model);

// Highest default-domain opset the linked libonnx knows.
int64_t libonnx_max_opset();

// Fills in types of values whose type is unknown or less specific, using libonnx shape inference
// (with data propagation). Best effort: returns the number of values it typed, and never fails a
// model it cannot infer (new opsets, custom domains); `note` receives the reason it stopped.
int infer_shapes(Model& model, std::string* note = nullptr);

}  // namespace mpq::ir
