#pragma once
// Dynamic quantization (`mpq quantize --mode dynamic`): int8 weights per output channel (stored as
// uint8 + 128 with zero point 128, exact in ONNX Runtime on x86 CPUs without VNNI), activation
// ranges computed by the model itself on every run, so no calibration data is needed. The way
// encoders (BERT, MiniLM, sentence embedders) are usually quantized: their activation ranges
// vary from sentence to sentence and token to token, which a calibrated per-tensor range fits badly.
//
// Quantized: MatMul with a float32 rank-2 constant weight, and Gemm (transA = 0, alpha = 1) with a
// constant B; MatMuls of two activations (attention) stay float, as they hold no weights and their
// inputs (softmax probabilities, per-head keys) lose most to 8 bits. Embedding tables (Gather of a
// large initializer) become int8 rows (quantize_embeddings.h).
//
// Two forms of the activation quantizer, both standard ONNX that ONNX Runtime runs:
//  - per token (`Granularity::Token`, the default): one uint8 range per row of the last axis,
//    [min, max] of that token's vector (no zero forced into it):
//        lo = ReduceMin(x, -1), s = max((ReduceMax(x, -1) - lo) / 255, 1e-30)
//        q  = Cast<uint8>(Round((x - lo) / s))                                (shared by consumers)
//        y  = (Cast<float>(MatMulInteger(q, Wq)) * s + lo * colsum(Wq)) * w_scale
//    x = q*s + lo exactly up to rounding, so x.W = s*(q.Wq)*w_scale + lo*colsum(Wq)*w_scale. ONNX
//    Runtime's MatMulInteger takes only a scalar zero point for A, hence the explicit lo term.
//    On all-MiniLM-L6-v2 this is mean cosine 0.999 against 0.993 per tensor (see docs/quantize.md).
//  - per tensor (`Granularity::Tensor`): DynamicQuantizeLinear -> MatMulInteger(q, Wq, zp) ->
//    Cast -> Mul(x_scale * w_scale), exactly the graph ONNX Runtime's quantize_dynamic writes and
//    fuses into one DynamicQuantizeMatMul kernel on CPU (fastest there, less accurate).
// Every rewritten node's output keeps its name, so per-layer validation matches it.
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "passes/pass.h"
#include "passes/quantize_embeddings.h"

namespace mpq::passes {

struct DynamicQuantOptions {
  enum class Granularity { Token, Tensor };
  Granularity granularity = Granularity::Token;
  bool per_channel = true;     // int8 weights per output channel (false: one scale per weight)
  bool reduce_range = false;   // 7-bit weights [-63, 63] for x86 CPUs without VNNI (see insert_qdq.h)
  bool quantize_embeddings = true;
  int64_t embedding_min_elements = kEmbeddingMinElements;
  std::set<std::string> exclude_nodes;
  std::set<std::string> exclude_ops;
};

struct DynamicQuantReport {
  std::map<std::string, int> quantized;                      // op type -> nodes quantized
  std::vector<std::pair<std::string, std::string>> skipped;  // node label, reason
  int activations = 0;       // activation tensors quantized at run time (each shared by its readers)
  int weight_tensors = 0;
  int embedding_tables = 0;
  int64_t embedding_bytes_saved = 0;
  std::vector<std::string> notes;
};

// Rewrites `model` in place. The opset is raised to 13 when below 11 (MatMulInteger, Round and
// DynamicQuantizeLinear need 10-11); a model that cannot be raised is refused (BadInput).
DynamicQuantReport quantize_dynamic(ir::Model& model, const DynamicQuantOptions& options);

const char* granularity_name(DynamicQuantOptions::Granularity g);
// "token" / "tensor"; BadInput otherwise.
DynamicQuantOptions::Granularity parse_granularity(const std::string& name);

// Registry entry: dynamic quantization with default options (per token, embeddings int8).
class QuantizeDynamic : public Pass {
 public:
  QuantizeDynamic() = default;
  explicit QuantizeDynamic(DynamicQuantOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "quantize_dynamic"; }
  PassStats run(ir::Model& model) override;
  const DynamicQuantReport& report() const { return report_; }

 private:
  DynamicQuantOptions options_;
  DynamicQuantReport report_;
};

}  // namespace mpq::passes
