#pragma once
// FP16/BF16 storage for embedding tables whose Gather stays FP32. convert_precision decides a
// Gather of a constant table by its consumers: in an encoder those are the Adds feeding the
// embedding LayerNorm, which run in FP32, so the table (half of a small encoder's weights) stayed
// FP32 and a converted all-MiniLM-L6-v2 was 76% of its FP32 file. A Gather only copies rows, so the
// table can be stored in the low type and the gathered rows widened right after:
//     Gather(table, ids) -> Cast<float32>(Gather(table_low, ids))
// which is exact for every value the low type holds. Tables with a value beyond the low type's
// range are left in FP32.
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "ir/graph.h"

namespace mpq::passes {

struct NarrowedTables {
  int tables = 0;
  int64_t bytes_saved = 0;
  int64_t underflow_values = 0;  // non-zero values that became 0
  std::vector<std::pair<std::string, int64_t>> underflow_tensors;  // stored table name, count
};

// Tables as in quantize_embeddings.h (float32, rank 2, >= min_elements, read only by Gather on
// axis 0); Gathers named in `keep_fp32` (or all of them, when it holds "Gather") are left alone.
NarrowedTables narrow_gather_tables(ir::Graph& graph, DType low, int64_t min_elements,
                                    const std::set<std::string>& keep_fp32 = {});

}  // namespace mpq::passes
