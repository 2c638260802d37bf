#pragma once
// Raises a model's default-domain opset (10..12 -> 13..) by rewriting the ops whose signature
// changed on the way: attributes that became inputs (Squeeze/Unsqueeze/ReduceSum axes, Split
// split, Pad pads, Clip min/max) and the Softmax family's axis semantics. Per-axis
// QuantizeLinear/DequantizeLinear need opset 13.
#include <string>

#include "ir/graph.h"

namespace mpq::passes {

// Returns false (with the reason, and the model untouched) when the model cannot be raised:
// an opset below 10, a subgraph, or an op whose change is not handled.
bool upgrade_opset(ir::Model& model, int target, std::string* why_not);

}  // namespace mpq::passes
