#pragma once
// A readable, deterministic text form of a model or graph, used by `mpq inspect --graph`, by the
// round-trip tests (import → export → import must give the same text) and in pass tests.
//
//   graph "main" {
//     input x: float32[N,3,32,32]
//     init w: float32[16,3,3,3] #9f2c1e0a4b7d3355 {0.01, -0.2, ...}
//     y: float32[N,16,32,32] = Conv "conv1" (x, w, _) {kernel_shape: ints [3,3], group: int 1}
//     output y
//   }
#include <string>

#include "ir/graph.h"

namespace mpq::ir {

struct DumpOptions {
  bool show_types = true;
  bool show_doc_strings = true;
  int max_values = 4;  // initializer/attribute tensor values shown in braces
};

std::string dump(const Model& model, const DumpOptions& options = {});
std::string dump(const Graph& graph, const DumpOptions& options = {});
// 64-bit FNV-1a of a tensor's dtype, shape and bytes (or strings).
uint64_t tensor_digest(const Tensor& t);

}  // namespace mpq::ir
