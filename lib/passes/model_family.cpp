#include "passes/model_family.h"

#include <fmt/format.h>

#include "passes/pass.h"
#include "passes/patterns.h"

namespace mpq::passes {

const char* family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::Transformer: return "transformer";
    case ModelFamily::Cnn: return "CNN";
    case ModelFamily::Other: return "other";
  }
  return "?";
}

FamilyGuess guess_model_family(const ir::Model& model) {
  const ir::Graph& g = *model.graph;
  int64_t conv_weights = 0, dense_weights = 0;
  int softmax = 0, layernorm = 0;
  for (const auto& n : g.nodes()) {
    if (!n->domain.empty()) continue;
    const std::string& op = n->op_type;
    const Tensor* w = constant_value(n->input(1));
    if ((op == "Conv" || op == "ConvTranspose") && w) conv_weights += w->numel();
    if ((op == "MatMul" || op == "Gemm") && w) dense_weights += w->numel();
  }
  for (const PatternMatch& m : find_fragile_patterns(g)) {
    if (m.kind == PatternKind::Softmax) ++softmax;
    if (m.kind == PatternKind::LayerNorm) ++layernorm;
  }
  FamilyGuess guess;
  guess.why = fmt::format("{} Softmax, {} LayerNorm, {} MatMul/Gemm and {} Conv weight values", softmax, layernorm,
                          dense_weights, conv_weights);
  if ((softmax > 0 || layernorm > 0) && dense_weights > conv_weights) guess.family = ModelFamily::Transformer;
  else if (conv_weights > 0) guess.family = ModelFamily::Cnn;
  return guess;
}

}  // namespace mpq::passes
