#pragma once
// Structural checks run after import and after every pass in tests.
#include <string>
#include <vector>

#include "ir/graph.h"

namespace mpq::ir {

// Returns the problems found (empty when the graph is sound): a value produced twice or
// both produced and fed, a node input nobody defines, a cycle, a graph output with no definition,
// use lists out of sync, initializers whose declared type disagrees with their data, and invalid
// element types. Subgraphs are checked with their enclosing scopes visible.
std::vector<std::string> verify(const Model& model);
std::vector<std::string> verify(const Graph& graph);
// Throws a BadInput error with the first problem.
void verify_or_throw(const Model& model);

}  // namespace mpq::ir
