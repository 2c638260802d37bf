#pragma once
// Evaluates a single node with its registered CPU kernel: constant folding in passes, and tests.
#include <vector>

#include "ir/graph.h"
#include "runtime/kernel.h"

namespace mpq::rt {

// `inputs` follow node.inputs() (nullptr for omitted ones); returns one tensor per node output
// (undefined for omitted outputs). Nodes with subgraphs are not supported here.
std::vector<Tensor> evaluate_node(const ir::Node& node, int opset, const std::vector<const Tensor*>& inputs);
// Same, with the kernel's work spread over `pool` (the CUDA path's CPU fallbacks use the
// executor's pool).
std::vector<Tensor> evaluate_node(const ir::Node& node, int opset, const std::vector<const Tensor*>& inputs, ThreadPool& pool);

}  // namespace mpq::rt
