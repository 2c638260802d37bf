#pragma once
// FP16 / BF16 conversion that keeps numerically fragile ops in FP32 (`mpq convert`).
//
// Every float32 tensor gets a precision, FP32 or low (FP16/BF16), from the op policy
// (precision_policy.h: low for Conv/MatMul/Gemm..., FP32 for Exp/Pow/Softmax/norms/long reductions/
// Range/TopK/NMS..., "follow" for element-wise and data-movement ops, where mixed inputs take the
// widest type), from the written-out LayerNorm pattern (patterns.h), from user overrides, from
// initializers that would overflow FP16, from magnitudes seen on real data, and from what ONNX's
// schema allows for the op at the model's opset. Then:
//  - one Cast per boundary tensor and precision, shared by every consumer that needs it; no Cast
//    chains and no no-op Casts are left; existing Casts to float32 are retargeted;
//  - initializers and Constant/ConstantOfShape values are converted only where consumed in low
//    precision (a copy is made when FP32 consumers remain); integer and shape tensors are untouched;
//    Shape/Size and Cast read whatever precision is there and never get a Cast;
//  - Resize roi/scales, Upsample scales, RoiAlign rois and Dropout ratio stay FP32;
//  - If/Loop/Scan bodies are converted with their interface kept; values they read from the
//    enclosing graph are given to them in FP32;
//  - with keep_io_types the graph inputs and outputs stay float32 (Casts right at the interface);
//  - BF16 needs opset >= 13 for Cast and most ops; the model is raised to opset 16 (where Relu, Pow,
//    Where, LeakyRelu, PRelu accept bfloat16) when it is older, or the conversion fails with why.
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dtype.h"
#include "ir/graph.h"
#include "passes/pass.h"

namespace mpq::passes {

struct ConvertOptions {
  DType low = DType::Float16;  // Float16 or BFloat16
  bool keep_io_types = true;
  std::set<std::string> keep_fp32;  // op types or node names kept in FP32
  std::set<std::string> force_low;  // op types or node names run in low precision whatever the policy
  // Data-aware mode: max |x| seen on real data per top-level value name (inf for non-finite).
  // Every node with a float input or output above max_magnitude (or above the low type's range)
  // stays in FP32.
  const std::unordered_map<std::string, double>* magnitudes = nullptr;
  double max_magnitude = 4096.0;
  // BF16 only: raise older models to opset 16 (false: fail instead).
  bool raise_opset = true;
  // Embedding tables (float32 initializers of at least this many values read only through
  // Gather) whose Gather stays FP32 are stored in the low type with a Cast after the Gather
  // (narrow_gather_tables.h); 0 turns this off.
  int64_t narrow_tables_min_elements = 4096;
};

struct KeptNode {
  std::string node;      // node name (or label when unnamed)
  std::string op;        // op type
  std::string category;  // user, schema, pattern, policy, constant, data, custom, subgraph, follow
  std::string reason;    // one line
};

struct ConvertReport {
  DType low = DType::Float16;
  int nodes_low = 0;   // compute nodes now running in low precision
  int nodes_fp32 = 0;  // compute nodes left in FP32 (all of `kept`)
  std::vector<KeptNode> kept;
  std::map<std::string, int> kept_by_category;
  int casts_inserted = 0;    // Cast nodes added at precision boundaries (after clean-up)
  int casts_retargeted = 0;  // existing Casts to float32 now producing the low type
  int casts_removed = 0;     // existing or inserted Casts removed as no-ops or chains
  int initializers_converted = 0;  // initializers and Constant values stored in the low type
  int initializer_copies = 0;      // low-precision copies made where FP32 consumers remain
  int64_t underflow_values = 0;    // non-zero values that became zero in the low type
  std::vector<std::pair<std::string, int64_t>> underflow_tensors;  // tensor name, count
  int overflow_constants = 0;      // constants above the low type's range (consumers kept FP32)
  int tables_narrowed = 0;         // Gather tables stored low with a Cast after the Gather
  int64_t table_bytes_saved = 0;
  int64_t opset_before = 0, opset_after = 0;
  int subgraphs = 0;  // If/Loop/Scan bodies converted
  std::vector<std::string> notes;
};

// Converts `model` in place. Throws BadInput when the model cannot be converted (BF16 on a model
// that cannot reach opset 13, an unknown --keep-fp32/--force-low entry, both lists naming the same
// thing).
ConvertReport convert_precision(ir::Model& model, const ConvertOptions& options);

// Where the precisions ended up in a converted model's top-level graph: compute nodes by type,
// FP32 islands (connected FP32 compute nodes) and the Casts around them.
struct PrecisionLayout {
  int low_nodes = 0;         // nodes with a float16/bfloat16 output (Cast and Constant not counted)
  int fp32_nodes = 0;        // nodes with a float32 output (Cast and Constant not counted)
  int islands = 0;           // connected groups of FP32 nodes
  int casts = 0;             // every Cast node
  int interface_casts = 0;   // Casts reading a graph input or producing a graph output
  int boundary_casts = 0;    // Casts between a low node and an FP32 island
  std::vector<int> casts_per_island;  // boundary Casts touching each island
  int max_casts_per_island() const;
};
PrecisionLayout describe_precision(const ir::Model& model);

// Registry entry: FP16 with default options (keep_io_types on).
class ConvertPrecision : public Pass {
 public:
  ConvertPrecision() = default;
  explicit ConvertPrecision(ConvertOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "convert_precision"; }
  PassStats run(ir::Model& model) override;
  const ConvertReport& report() const { return report_; }

 private:
  ConvertOptions options_;
  ConvertReport report_;
};

}  // namespace mpq::passes
