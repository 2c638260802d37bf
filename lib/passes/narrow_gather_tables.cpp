#include "passes/narrow_gather_tables.h"

#include <cmath>

#include "passes/precision_policy.h"
#include "passes/quantize_embeddings.h"
#include "runtime/low_precision.h"

namespace mpq::passes {

NarrowedTables narrow_gather_tables(ir::Graph& g, DType low, int64_t min_elements, const std::set<std::string>& keep_fp32) {
  NarrowedTables out;
  for (const EmbeddingTable& e : find_embedding_tables(g, min_elements, keep_fp32, keep_fp32)) {
    const Tensor& t = e.table->initializer();
    const float* p = t.data<float>();
    bool fits = true;
    for (int64_t i = 0; i < t.numel() && fits; ++i) fits = std::isfinite(p[i]) && std::fabs(p[i]) <= precision::low_max(low);
    if (!fits) continue;
    Tensor narrow = rt::narrow_from_float32(t, low);
    const uint16_t* bits = static_cast<const uint16_t*>(narrow.raw_data());
    int64_t underflow = 0;
    for (int64_t i = 0; i < t.numel(); ++i)
      if (p[i] != 0.0f && (bits[i] & 0x7fffu) == 0) ++underflow;
    ir::Value* stored = g.add_initializer(g.unique_name(e.table->name() + "_" + std::string(precision::low_suffix(low))), narrow);
    if (underflow) {
      out.underflow_values += underflow;
      out.underflow_tensors.emplace_back(stored->name(), underflow);
    }
    for (ir::Node* gather : e.gathers) {
      ir::Value* wide = gather->output(0);
      ir::Value* rows = g.add_value(g.unique_name(wide->name() + "_" + std::string(precision::low_suffix(low))),
                                    ir::ValueType::tensor_unranked(low));
      g.set_node_output(gather, 0, rows);
      g.set_node_input(gather, 0, stored);
      ir::Node* cast = g.add_node("Cast", {rows}, {wide}, gather->name.empty() ? std::string() : gather->name + "_to_fp32");
      cast->set_attr(ir::Attribute::make_int("to", static_cast<int64_t>(DType::Float32)));
    }
    out.bytes_saved += static_cast<int64_t>(t.nbytes() - narrow.nbytes());
    g.clear_initializer(e.table);
    ++out.tables;
  }
  if (out.tables) {
    g.topological_sort();
    g.remove_unused_values();
  }
  return out;
}

}  // namespace mpq::passes
