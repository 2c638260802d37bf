#pragma once
// QOperator format: rewrites the quantized Conv and MatMul of a QDQ model (DequantizeLinear on
// every input) into QLinearConv / QLinearMatMul on int8 tensors, with the output quantized to its
// calibrated range and dequantized for float consumers. Gemm (no QLinear form in the ONNX domain)
// stays in QDQ form.
#include "calib/table.h"
#include "ir/graph.h"
#include "passes/insert_qdq.h"

namespace mpq::passes {

// Returns the number of nodes converted.
int convert_to_qoperator(ir::Model& model, const calib::CalibrationTable& table, const QdqOptions& options);

}  // namespace mpq::passes
