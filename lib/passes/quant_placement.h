#pragma once
// Where quantizers go: the one placement function behind both QDQ export (insert_qdq) and
// quantization-aware training (insert_fake_quant), so a fine-tuned model and its export cannot
// disagree. It decides, without changing the graph:
//  - anchors: Conv, ConvTranspose, Gemm and MatMul whose inputs get quantized (weights per output
//    channel or per tensor, activations per tensor); excluded nodes and nodes inside Softmax,
//    LayerNorm or GELU patterns are skipped with a reason;
//  - activation tensors to quantize, each with the consumer inputs that read its dequantized value
//    (anchors, plus MaxPool/Concat/nearest-Resize inputs and residual Add/pooling neighbours);
//  - scale groups: tensors that must share one scale (the inputs and output of MaxPool, Concat and
//    nearest Resize, so those ops run on integers without extra rounding), with their merged range;
//  - graph outputs produced by anchors, quantized in place;
//  - embedding tables: large float32 initializers read only through Gather, stored as int8 rows
//    with one scale per row (quantize_embeddings.h; fake-quant mirrors this with a per-row
//    symmetric quantizer on the table).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "calib/table.h"
#include "ir/graph.h"
#include "passes/insert_qdq.h"
#include "passes/quantize_embeddings.h"

namespace mpq::passes {

struct QuantPlacement {
  struct Anchor {
    ir::Node* node = nullptr;
    std::vector<size_t> activation_inputs;
    bool has_weight = false;  // input 1 is a float32 constant weight
    int weight_axis = -1;     // its output-channel axis (0 Conv, 1 ConvTranspose, N for Gemm/MatMul)
    bool quantize_bias = false;
  };
  struct Activation {
    ir::Value* value = nullptr;
    std::vector<std::pair<ir::Node*, size_t>> consumers;  // inputs that read the dequantized tensor
    int group = 0;
  };
  struct Output {
    ir::Value* value = nullptr;  // a graph output produced by an anchor
    int group = 0;
  };
  std::vector<Anchor> anchors;
  std::vector<Activation> activations;  // in insertion order
  std::vector<Output> outputs;
  std::vector<calib::TensorCalib> group_ranges;  // merged calibration range of each scale group
  std::vector<EmbeddingTable> embeddings;        // Gather tables stored int8 per row
  bool per_channel = true;
  QdqReport report;  // quantized / skipped / notes (counts of inserted pairs are left to the caller)
};

// Plans quantization of `model` (its opset already raised where needed; see insert_qdq).
QuantPlacement place_quantizers(ir::Model& model, const calib::CalibrationTable& table, const QdqOptions& options,
                                bool per_channel);

}  // namespace mpq::passes
