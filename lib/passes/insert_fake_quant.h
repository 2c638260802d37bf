#pragma once
// Fake quantization for quantization-aware training: mpq::FakeQuant nodes (runtime/cpu/fake_quant.h)
// at exactly the places insert_qdq puts QuantizeLinear/DequantizeLinear (both call
// place_quantizers), with the initial scales insert_qdq would give (activation_qparams on the
// calibration table's ranges; weight scales from each output channel's largest magnitude), so that
// before training the fake-quantized model computes what the post-training QDQ model computes.
//   - activations: one FakeQuant per quantized tensor, its scale (a trainable step size with LSQ)
//     shared by every tensor of a scale group; graph outputs produced by Conv/Gemm/MatMul too;
//   - weights: a FakeQuant between the float weight and its Conv/ConvTranspose/Gemm/MatMul, per
//     output channel or per tensor, symmetric in [-qmax, qmax];
//   - embedding tables read through Gather: per-row FakeQuant in [-127, 127] (the export stores them
//     int8 per row, quantize_embeddings.h), with learned per-row step sizes the export uses;
//   - biases: the export stores them as int32 at input scale x weight scale, so training sees that
//     rounding too (mpq::FakeQuantBias, an identity gradient); with the learned scales the trained
//     model and its export then compute the same values in mpq, bit for bit.
// strip_fake_quant() is the way back for the export: it reads the learned scales off the FakeQuant
// nodes and removes them, leaving the float graph with the trained weights, ready for insert_qdq
// with QdqOptions::activation_qparams / weight_scales.
#include <map>
#include <string>
#include <vector>

#include "calib/qparams.h"
#include "calib/table.h"
#include "ir/graph.h"
#include "passes/insert_qdq.h"

namespace mpq::passes {

struct FakeQuantReport {
  QdqReport report;
  std::vector<std::string> activation_scales;  // step-size initializers of activations
  std::vector<std::string> weight_scales;      // step-size initializers of weights
  std::vector<std::string> weights;            // the float weights behind weight FakeQuant nodes
  int nodes = 0;
};

FakeQuantReport insert_fake_quant(ir::Model& model, const calib::CalibrationTable& table, const QdqOptions& options);

struct LearnedScales {
  std::map<std::string, calib::QParams> activations;  // by the quantized tensor's name
  std::map<std::string, std::vector<float>> weights;  // by weight initializer name
};

// Removes every mpq::FakeQuant node, rewiring its consumers (and graph outputs) to its input, and
// returns the scales it held.
LearnedScales strip_fake_quant(ir::Model& model);

}  // namespace mpq::passes
