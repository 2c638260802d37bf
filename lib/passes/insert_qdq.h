#pragma once
// QDQ insertion: turns an FP32 model plus a calibration table into a standard QDQ ONNX model that
// ONNX Runtime and TensorRT accept, following their conventions:
//  - activation QuantizeLinear -> DequantizeLinear on the inputs of Conv, ConvTranspose, Gemm and
//    MatMul (one pair per tensor, shared by every quantized consumer);
//  - weights stored as int8 initializers (symmetric, [-127, 127]) feeding a DequantizeLinear, per
//    channel on the output-channel axis (0 for Conv, 1 for ConvTranspose, the N axis for Gemm and
//    MatMul) or per tensor;
//  - bias as int32 with scale = input scale x weight scale (or kept in float);
//  - MaxPool, Concat and Resize whose output is quantized get their inputs quantized too, sharing one
//    scale (Concat inputs share the output's scale), so they run in int8 without extra rounding;
//    Add, Mul and pooling whose neighbours are already quantized read the shared DequantizeLinear;
//  - never inside Softmax, LayerNorm (op or written out) or GELU patterns;
//  - graph outputs stay float unless produced by Conv/Gemm/MatMul;
//  - embedding tables read through Gather are stored int8 per row (quantize_embeddings.h).
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "calib/qparams.h"
#include "calib/table.h"
#include "ir/graph.h"
#include "passes/quantize_embeddings.h"

namespace mpq::passes {

struct QdqOptions {
  bool per_channel = true;
  std::string activation_type = "int8";  // int8: symmetric, zero point 0; uint8: asymmetric
  bool symmetric = false;                // uint8 only: symmetric around 128
  // 7-bit weights ([-63, 63]), ONNX Runtime's reduce_range: x86 CPUs without VNNI multiply
  // uint8 x int8 with 16-bit pairwise sums that saturate on full-range weights.
  bool reduce_range = false;
  bool quantize_bias = true;             // int32 bias (false: bias stays float)
  bool quantize_outputs = true;          // graph outputs produced by Conv/Gemm/MatMul
  bool quantize_attention = false;       // MatMul with two activation inputs
  // Gather tables (word/position embeddings) of at least this many float32 values: int8 rows with
  // a per-row scale, dequantized after the Gather (quantize_embeddings.h).
  bool quantize_embeddings = true;
  int64_t embedding_min_elements = kEmbeddingMinElements;
  std::set<std::string> exclude_nodes;   // node names kept in float
  std::set<std::string> exclude_ops;     // op types kept in float
  int weight_bits = 8;                   // 8: [-127, 127]; 4: [-7, 7] (stored as int8 values)
  // Scales learned by quantization-aware training, replacing those the calibration table gives:
  // activation parameters by tensor name, weight scales (one per channel, or one) by initializer name.
  std::map<std::string, calib::QParams> activation_qparams;
  std::map<std::string, std::vector<float>> weight_scales;
};

struct QdqReport {
  std::map<std::string, int> quantized;                    // op type -> nodes quantized
  std::vector<std::pair<std::string, std::string>> skipped;  // node label, reason
  int activation_pairs = 0;
  int weight_tensors = 0;
  int int32_biases = 0;
  int embedding_tables = 0;
  int64_t embedding_bytes_saved = 0;
  bool per_channel = true;
  std::vector<std::string> notes;
};

// Rewrites `model` in place; the model's opset is raised to 13 when per-channel weights need it
// (or the weights fall back to per tensor, with a note, when the model cannot be raised).
QdqReport insert_qdq(ir::Model& model, const calib::CalibrationTable& table, const QdqOptions& options);

// The opset step of insert_qdq on its own (fake-quant insertion takes it too, so both see the same
// graph): raises the opset to 13 where possible; returns whether weights can be per channel.
bool prepare_opset_for_qdq(ir::Model& model, bool per_channel, std::vector<std::string>& notes);
// Quantization parameters of an activation with calibration range `c` under the options.
calib::QParams activation_qparams(const calib::TensorCalib& c, const QdqOptions& options);
// Largest weight magnitude in integer steps: 127, 63 with reduce_range, 7 with 4-bit weights.
int weight_qmax(const QdqOptions& options);

// Quantization parameters of a weight tensor (int8 symmetric, per channel along `axis`, or per
// tensor when axis < 0), and its quantized values.
struct QuantizedWeight {
  Tensor values;  // int8, same shape
  Tensor scales;  // float32 [C] or scalar
  std::vector<float> scale_list;
};
// `qmax` is 127, 63 for reduce_range, 7 for 4-bit weights.
QuantizedWeight quantize_weight(const Tensor& w, int axis, int qmax = 127);
// Symmetric scales from each channel's largest magnitude: amax / qmax (never zero).
std::vector<float> weight_channel_scales(const Tensor& w, int axis, int qmax = 127);
// Quantizes with given scales (one per channel along `axis`, or one when axis < 0).
QuantizedWeight quantize_weight_with_scales(const Tensor& w, int axis, const std::vector<float>& scales, int qmax);

// Scalar zero-point initializers, one per (integer type, value), named zp0, zp1, ...: every Q/DQ
// pair with that zero point reads the same one (with int8 activations, all of them).
class ZeroPoints {
 public:
  explicit ZeroPoints(ir::Graph& g) : g_(g) {}
  ir::Value* get(DType type, int32_t value);

 private:
  ir::Graph& g_;
  std::map<std::pair<DType, int32_t>, ir::Value*> by_value_;
};

}  // namespace mpq::passes
