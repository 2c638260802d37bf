#include "passes/pass.h"

#include <algorithm>

#include "core/error.h"
#include "ir/verify.h"
#include "passes/convert_precision.h"
#include "passes/drop_redundant_fake_quant.h"
#include "passes/fold_constants.h"
#include "passes/block_conv_layout.h"
#include "passes/fuse_conv_activation.h"
#include "passes/fuse_conv_bn.h"
#include "passes/fuse_gelu.h"
#include "passes/fuse_gelu_mlp.h"
#include "passes/fuse_layer_norm.h"
#include "passes/fuse_matmul_bias.h"
#include "passes/move_conv_before_resize.h"
#include "passes/fuse_conv_fake_quant.h"
#include "passes/int8_conv.h"
#include "passes/fuse_qdq_pair.h"
#include "passes/quantize_dynamic.h"

namespace mpq::passes {

PassStats NodeRewritePass::run(ir::Model& model) {
  PassStats stats;
  std::vector<std::string> targets = target_ops();
  std::vector<ir::Node*> snapshot;
  for (const auto& n : model.graph->nodes())
    if (targets.empty() || std::find(targets.begin(), targets.end(), n->op_type) != targets.end())
      snapshot.push_back(n.get());
  for (ir::Node* n : snapshot) {
    // A previous rewrite may have removed this node.
    bool alive = false;
    for (const auto& p : model.graph->nodes())
      if (p.get() == n) alive = true;
    if (!alive || !match(model, *n)) continue;
    apply(model, *n, stats);
  }
  if (stats.changed) {
    model.graph->topological_sort();
    model.graph->remove_dead_nodes();
    remove_unused_initializers(model);
  }
  return stats;
}

void PassRegistry::add(const std::string& name, PassFactory factory) {
  for (const auto& [n, f] : factories_)
    if (n == name) fail_internal("pass registry: '{}' registered twice", name);
  factories_.emplace_back(name, std::move(factory));
}

std::unique_ptr<Pass> PassRegistry::create(const std::string& name) const {
  for (const auto& [n, f] : factories_)
    if (n == name) return f();
  fail_input("unknown pass '{}'", name);
}

std::vector<std::string> PassRegistry::names() const {
  std::vector<std::string> out;
  for (const auto& [n, f] : factories_) out.push_back(n);
  return out;
}

const PassRegistry& PassRegistry::global() {
  static const PassRegistry* r = [] {
    auto* reg = new PassRegistry();
    register_all_passes(*reg);
    return reg;
  }();
  return *r;
}

void register_all_passes(PassRegistry& r) {
  r.add("fold_constants", [] { return std::make_unique<FoldConstants>(); });
  r.add("fuse_conv_bn", [] { return std::make_unique<FuseConvBn>(); });
  r.add("fuse_conv_activation", [] { return std::make_unique<FuseConvActivation>(); });
  r.add("fuse_layer_norm", [] { return std::make_unique<FuseLayerNorm>(); });
  r.add("fuse_gelu", [] { return std::make_unique<FuseGelu>(); });
  r.add("fuse_matmul_bias", [] { return std::make_unique<FuseMatMulBias>(); });
  r.add("fuse_gelu_mlp", [] { return std::make_unique<FuseGeluMlp>(); });
  r.add("move_conv_before_resize", [] { return std::make_unique<MoveConvBeforeResize>(); });
  r.add("fuse_qdq_pair", [] { return std::make_unique<FuseQdqPair>(); });
  r.add("fuse_conv_fake_quant", [] { return std::make_unique<FuseConvFakeQuant>(); });
  r.add("drop_redundant_fake_quant", [] { return std::make_unique<DropRedundantFakeQuant>(); });
  r.add("mark_int8_conv", [] { return std::make_unique<MarkInt8Conv>(); });
  // The AVX2 block; `mpq run` constructs it with the block of the CPU it runs on.
  r.add("block_conv_layout", [] { return std::make_unique<BlockConvLayout>(8); });
  r.add("convert_precision", [] { return std::make_unique<ConvertPrecision>(); });
  r.add("quantize_dynamic", [] { return std::make_unique<QuantizeDynamic>(); });
}

PassStats run_pass(Pass& pass, ir::Model& model, bool verify) {
  PassStats stats = pass.run(model);
  if (verify) {
    auto problems = ir::verify(model);
    if (!problems.empty()) fail_internal("pass {} left the graph broken: {}", pass.name(), problems.front());
  }
  return stats;
}

std::vector<PassStats> run_passes(ir::Model& model, const std::vector<std::string>& names, bool verify) {
  std::vector<PassStats> out;
  for (const std::string& n : names) {
    auto pass = PassRegistry::global().create(n);
    out.push_back(run_pass(*pass, model, verify));
  }
  return out;
}

size_t consumer_count(const ir::Model& model, const ir::Value* v) {
  size_t n = v->uses().size() + (v->is_graph_output() ? 1 : 0);
  for (const auto& node : model.graph->nodes())
    for (ir::Graph* sub : node->subgraphs())
      for (const std::string& ref : ir::outer_references(*sub))
        if (ref == v->name()) ++n;
  return n;
}

}  // namespace mpq::passes

namespace mpq::passes {

size_t remove_unused_initializers(ir::Model& model) {
  ir::Graph& g = *model.graph;
  std::vector<ir::Value*> unused;
  for (ir::Value* v : g.initializers())
    if (!v->is_graph_input() && consumer_count(model, v) == 0) unused.push_back(v);
  for (ir::Value* v : unused) g.clear_initializer(v);
  g.remove_unused_values();
  return unused.size();
}

}  // namespace mpq::passes
