#pragma once
// Embedding tables in int8: a large float32 initializer read only through Gather (axis 0) is
// stored as int8 rows with one scale per row, and dequantized after the Gather:
//     Gather(table, ids)  ->  Mul(Cast<float>(Gather(table_q, ids)), Gather(row_scales, ids))
// so only the gathered rows are converted at run time (a DequantizeLinear on the whole table
// would convert all of it on every run), and the output keeps its name. Per-row symmetric scales
// (amax / 127) keep each token's vector to int8 precision whatever the other rows hold. Word
// embeddings are half of a small encoder's weights (all-MiniLM-L6-v2: 30522 x 384 of 22.6M), so an
// INT8 encoder file is near 25% of FP32 only with them.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace mpq::passes {

struct EmbeddingTable {
  ir::Value* table = nullptr;       // the float32 initializer
  std::vector<ir::Node*> gathers;   // every consumer (all Gather on axis 0)
};

// Tables worth storing in a smaller type: float32 rank-2 initializers with at least
// `min_elements` values whose every consumer is a Gather (default domain, axis 0, the table as
// data) not named in `exclude_nodes` and "Gather" not in `exclude_ops`. Graph order.
std::vector<EmbeddingTable> find_embedding_tables(const ir::Graph& graph, int64_t min_elements,
                                                  const std::set<std::string>& exclude_nodes = {},
                                                  const std::set<std::string>& exclude_ops = {});

// Default size above which a Gather table counts as an embedding (16 KiB of float32).
inline constexpr int64_t kEmbeddingMinElements = 4096;

// Rewrites each table as int8 rows + per-row scales (see above); returns the bytes saved. Scales
// given in `learned` (by table name, one per row: QAT's) replace the amax / 127 ones.
int64_t quantize_embedding_tables(ir::Graph& graph, const std::vector<EmbeddingTable>& tables,
                                  const std::map<std::string, std::vector<float>>* learned = nullptr);

}  // namespace mpq::passes
