#include "passes/block_conv_layout.h"

#include <fmt/format.h>

#include <unordered_map>

#include "core/error.h"
#include "passes/fuse_conv_activation.h"
#include "runtime/cpu/channel_blocks.h"

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

int64_t output_channels(const ir::Node& conv) { return constant_value(conv.input(1))->dim(0); }

// Whether the output of `producer` may stay blocked: every reader is a blockable convolution taking
// it as X (input 0) or Z (input 3), and nothing else (graph output, subgraph) sees it.
bool blockable_edge(const ir::Model& model, const ir::Node& producer) {
  const ir::Value* v = producer.output(0);
  if (!v || v->is_graph_output() || v->uses().empty()) return false;
  if (v->type.is_tensor() && v->type.elem != DType::Undefined && v->type.elem != DType::Float32) return false;
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
  // Decide every edge on the graph as written, then rewrite. An edge is named by its producer.
  std::vector<ir::Node*> producers;
  for (const auto& node : model.graph->nodes())
    if (blockable_conv(*node) && blockable_edge(model, *node) && (channels_last_ || output_channels(*node) % block_ == 0))
      producers.push_back(node.get());
  // A convolution reads and writes its kept tensors in one layout family: oneDNN's direct kernels
  // take nChw16c in and out, or NHWC in and out, not one of each (mixed, they fall back to mpq's
  // kernels with conversions). So the edges that meet at a convolution (its X, its Z, its Y) form
  // groups, and a group whose channel counts are not all multiples of the block is kept NHWC:
  // channels-last is the blocked layout with one block of all C channels, so it fits any count.
  std::vector<size_t> parent(producers.size());
  for (size_t i = 0; i < parent.size(); ++i) parent[i] = i;
  auto find = [&](size_t i) {
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
  };
  std::unordered_map<const ir::Node*, size_t> edge_at;  // a convolution -> one kept edge it reads or writes
  auto meet = [&](const ir::Node* conv, size_t e) {
    auto [it, inserted] = edge_at.try_emplace(conv, e);
    if (!inserted) parent[find(e)] = find(it->second);
  };
  for (size_t e = 0; e < producers.size(); ++e) {
    meet(producers[e], e);
    for (const ir::Use& u : producers[e]->output(0)->uses()) meet(u.node, e);
  }
  std::vector<char> channels_last(producers.size(), 0);
  for (size_t e = 0; e < producers.size(); ++e)
    if (output_channels(*producers[e]) % block_ != 0) channels_last[find(e)] = 1;

  for (size_t e = 0; e < producers.size(); ++e) {
    ir::Node* p = producers[e];
    ir::Value* v = p->output(0);
    const int64_t block = channels_last[find(e)] ? rt::cpu::kChannelsLast : block_;
    if (!is_fused_conv(*p)) make_fused_conv(model, *p);
    p->set_attr(ir::Attribute::make_int("y_block", block));
    for (const ir::Use& u : v->uses()) {
      if (!is_fused_conv(*u.node)) make_fused_conv(model, *u.node);
      u.node->set_attr(ir::Attribute::make_int(u.input_index == 0 ? "x_block" : "z_block", block));
    }
    ++stats.changed;
    stats.notes.push_back(fmt::format("{} stays {} from {} to {} reader(s)", v->name(),
                                      block == block_ ? fmt::format("in {}-channel blocks", block_) : std::string("channels-last (NHWC)"),
                                      p->label(), v->uses().size()));
  }
  return stats;
}

}  // namespace mpq::passes
