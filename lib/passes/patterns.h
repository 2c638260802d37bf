#pragma once
// Recognisers for numerically fragile subgraphs that quantization must not cut into and that
// FP16 conversion keeps in FP32: Softmax, LayerNorm (the LayerNormalization op or its written-out
// ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div form) and GELU (erf form x*0.5*(1+erf(x/sqrt2)) and
// the tanh approximation).
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"

namespace mpq::passes {

enum class PatternKind { Softmax, LayerNorm, Gelu };
const char* pattern_name(PatternKind k);

struct PatternMatch {
  PatternKind kind;
  std::vector<ir::Node*> nodes;  // every node of the pattern
  ir::Value* input = nullptr;    // the tensor the pattern normalises / activates
  ir::Value* output = nullptr;   // its final output
};

// The other input of a binary node.
ir::Value* other_input(const ir::Node* n, const ir::Value* v);
// `v` is a floating-point constant of one element within `tol` of `target`.
bool scalar_const_near(const ir::Value* v, double target, double tol);

// The written-out forms, recognised at one anchor node (LayerNorm: its Sub; GELU: its Erf). The
// recognisers check the structure only (which constants are scalars, which values feed which
// node), not whether an intermediate is also read elsewhere; fusion passes check that themselves.
bool match_written_layernorm(ir::Node* sub, PatternMatch& m);
bool match_written_gelu_erf(ir::Node* erf, PatternMatch& m);

// True when every value produced inside `m`, except its final output, is read only by nodes of
// `m` (no other node, no subgraph, not a graph output): the nodes can then be replaced by one.
bool match_is_self_contained(const ir::Model& model, const PatternMatch& m);

// All matches in the top-level graph (a node belongs to at most one match).
std::vector<PatternMatch> find_fragile_patterns(const ir::Graph& graph);

// Node -> index of its match in `matches`.
std::unordered_map<const ir::Node*, size_t> pattern_membership(const std::vector<PatternMatch>& matches);

// True when `v` is produced inside a pattern and consumed inside the same pattern (an interior
// edge), or is read by a pattern node other than through the pattern's input.
bool is_interior_edge(const ir::Value* v, const std::vector<PatternMatch>& matches,
                      const std::unordered_map<const ir::Node*, size_t>& membership);

}  // namespace mpq::passes
