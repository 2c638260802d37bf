#include "passes/quantize_embeddings.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "calib/qparams.h"
#include "calib/quant_ref.h"
#include "core/error.h"
#include "passes/pass.h"

namespace mpq::passes {

std::vector<EmbeddingTable> find_embedding_tables(const ir::Graph& g, int64_t min_elements,
                                                  const std::set<std::string>& exclude_nodes,
                                                  const std::set<std::string>& exclude_ops) {
  std::vector<EmbeddingTable> out;
  if (exclude_ops.count("Gather")) return out;
  for (ir::Value* v : g.initializers()) {
    if (!v->is_constant() || v->is_graph_output()) continue;
    const Tensor& t = v->initializer();
    if (t.dtype() != DType::Float32 || t.rank() != 2 || t.numel() < min_elements || v->uses().empty()) continue;
    EmbeddingTable e;
    e.table = v;
    bool ok = true;
    for (const ir::Use& u : v->uses()) {
      ir::Node* n = u.node;
      if (n->graph() != &g || n->op_type != "Gather" || !n->domain.empty() || u.input_index != 0 ||
          n->attr_int("axis", 0) != 0 || exclude_nodes.count(n->name)) {
        ok = false;
        break;
      }
      if (std::find(e.gathers.begin(), e.gathers.end(), n) == e.gathers.end()) e.gathers.push_back(n);
    }
    if (ok) out.push_back(std::move(e));
  }
  return out;
}

int64_t quantize_embedding_tables(ir::Graph& g, const std::vector<EmbeddingTable>& tables,
                                  const std::map<std::string, std::vector<float>>* learned) {
  int64_t saved = 0;
  for (const EmbeddingTable& e : tables) {
    const Tensor& t = e.table->initializer();
    const int64_t rows = t.dim(0), cols = t.dim(1);
    const int64_t table_bytes = static_cast<int64_t>(t.nbytes());
    Tensor q(DType::Int8, t.shape());
    Tensor scales(DType::Float32, Shape{rows, 1});
    const float* src = t.data<float>();
    int8_t* dst = q.data<int8_t>();
    float* s = scales.data<float>();
    const std::vector<float>* given = nullptr;
    if (learned) {
      auto it = learned->find(e.table->name());
      if (it != learned->end()) given = &it->second;
    }
    if (given && static_cast<int64_t>(given->size()) != rows)
      fail_input("embedding table '{}': {} learned row scales for {} rows", e.table->name(), given->size(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = src + r * cols;
      float amax = 0.0f;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
      s[r] = given ? (*given)[static_cast<size_t>(r)] : calib::safe_scale(amax, 127);
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = static_cast<int8_t>(calib::quantize_ref(row[c], s[r], 0, -127, 127));
    }
    const std::string base = e.table->name();
    ir::Value* qv = g.add_initializer(g.unique_name(base + "_int8"), q);
    ir::Value* sv = g.add_initializer(g.unique_name(base + "_row_scale"), scales);
    for (ir::Node* gather : e.gathers) {
      ir::Value* ids = gather->input(1);
      ir::Value* out = gather->output(0);
      const std::string name = gather->name;
      const std::string stem = out->name();
      g.remove_node(gather);
      ir::Value* gq = g.add_value(g.unique_name(stem + "_int8"));
      ir::Value* gs = g.add_value(g.unique_name(stem + "_scale"));
      ir::Value* gf = g.add_value(g.unique_name(stem + "_float"));
      g.add_node("Gather", {qv, ids}, {gq}, name);
      g.add_node("Gather", {sv, ids}, {gs});
      ir::Node* cast = g.add_node("Cast", {gq}, {gf});
      cast->set_attr(ir::Attribute::make_int("to", static_cast<int64_t>(DType::Float32)));
      g.add_node("Mul", {gf, gs}, {out});
    }
    saved += table_bytes - static_cast<int64_t>(q.nbytes() + scales.nbytes());
    g.clear_initializer(e.table);
  }
  if (!tables.empty()) {
    g.topological_sort();
    g.remove_unused_values();
  }
  return saved;
}

}  // namespace mpq::passes
