#pragma once
#include <set>

#include "passes/pass.h"

namespace mpq::passes {

// Turns Constant nodes into initializers and evaluates nodes whose inputs are all constant
// (Shape of a statically shaped value counts as constant), replacing them with initializers.
// Skips nodes with subgraphs, random ops, nodes producing graph outputs, results larger than
// `max_output_bytes`, and the op types in `keep` (by default QuantizeLinear/DequantizeLinear, whose
// pattern is the point of a QDQ model).
class FoldConstants : public Pass {
 public:
  std::string name() const override { return "fold_constants"; }
  PassStats run(ir::Model& model) override;

  std::set<std::string> keep = {"QuantizeLinear", "DequantizeLinear"};
  size_t max_output_bytes = size_t(64) << 20;
};

}  // namespace mpq::passes
