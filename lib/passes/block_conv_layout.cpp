#include "passes/block_conv_layout.h"

#include <fmt/format.h>

#include "core/error.h"
#include "passes/fuse_conv_activation.h"

namespace mpq::passes {

namespace {

// A single-output float32 2-D Conv or FusedConv with constant weights: the convolutions the oneDNN
// path can take channel-blocked tensors for.
bool blockable_conv(const ir::Node& n) {
  const bool plain = n.domain.empty() && n.op_type == "Conv";
  if ((!plain && !is_fused_conv(n)) || n.num_outputs() != 1 || n.num_inputs() < 2) return false;
  const Tensor* w = constant_value(n.input(1));
  return w && w->dtype() == DType::Float32 && w->rank() == 4 && w->dim(0) > 0;
}

// Whether the output of `producer` may stay blocked: every reader is a blockable convolution taking
// it as X (input 0) or Z (input 3), and nothing else (graph output, subgraph) sees it.
bool blockable_edge(const ir::Model& model, const ir::Node& producer, int64_t block) {
  const ir::Value* v = producer.output(0);
  if (!v || v->is_graph_output() || v->uses().empty()) return false;
  if (v->type.is_tensor() && v->type.elem != DType::Undefined && v->type.elem != DType::Float32) return false;
  if (constant_value(producer.input(1))->dim(0) % block != 0) return false;
  if (consumer_count(model, v) != v->uses().size()) return false;  // read inside a subgraph
  for (const ir::Use& u : v->uses()) {
    if (!blockable_conv(*u.node)) return false;
    if (u.input_index != 0 && !(u.input_index == 3 && is_fused_conv(*u.node))) return false;
  }
  return true;
}

}  // namespace

PassStats BlockConvLayout::run(ir::Model& model) {
  PassStats stats;
  if (block_ != 8 && block_ != 16) throw Error(ErrorKind::Internal, fmt::format("block_conv_layout: block {}", block_));
  // Decide every edge on the graph as written, then rewrite.
  std::vector<ir::Node*> producers;
  for (const auto& node : model.graph->nodes())
    if (blockable_conv(*node) && blockable_edge(model, *node, block_)) producers.push_back(node.get());
  for (ir::Node* p : producers) {
    ir::Value* v = p->output(0);
    if (!is_fused_conv(*p)) make_fused_conv(model, *p);
    p->set_attr(ir::Attribute::make_int("y_block", block_));
    for (const ir::Use& u : v->uses()) {
      if (!is_fused_conv(*u.node)) make_fused_conv(model, *u.node);
      u.node->set_attr(ir::Attribute::make_int(u.input_index == 0 ? "x_block" : "z_block", block_));
    }
    ++stats.changed;
    stats.notes.push_back(fmt::format("{} stays in {}-channel blocks from {} to {} reader(s)", v->name(), block_,
                                      p->label(), v->uses().size()));
  }
  return stats;
}

}  // namespace mpq::passes
