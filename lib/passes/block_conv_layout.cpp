#include "passes/block_conv_layout.h"

#include <fmt/format.h>

#include <unordered_map>

#include "core/error.h"
#include "passes/fuse_conv_activation.h"
#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/fake_quant.h"

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

// An element-wise node with one scale for the whole tensor (mpq::FakeQuant, which `mpq run` makes
// of a QDQ model's activation QuantizeLinear -> DequantizeLinear pairs): it computes the same values
// whatever the order of the elements, so a blocked tensor may flow through it.
bool layout_transparent(const ir::Node& n) {
  if (n.domain != rt::cpu::kFakeQuantDomain || n.op_type != rt::cpu::kFakeQuantOp) return false;
  if (n.num_outputs() != 1 || n.num_inputs() < 2) return false;
  const Tensor* scale = constant_value(n.input(1));
  const Tensor* zero_point = n.num_inputs() > 2 && n.input(2) ? constant_value(n.input(2)) : nullptr;
  return scale && scale->numel() == 1 && (n.num_inputs() < 3 || !n.input(2) || (zero_point && zero_point->numel() == 1));
}

// A float32 tensor of rank 4 by its declared type.
bool float_rank4(const ir::Value* v) {
  return v && v->type.is_tensor() && v->type.elem == DType::Float32 && v->type.has_shape && v->type.dims.size() == 4;
}

// A squeeze-and-excitation block's global average pool reading v: one pixel out, which is the same
// in every layout, so it can read v in v's layout (mpq::GlobalAveragePool, runtime/cpu/layout_ops).
bool layout_pool(const ir::Node& n, const ir::Value* v) {
  return n.domain.empty() && n.op_type == "GlobalAveragePool" && n.num_inputs() == 1 && n.num_outputs() == 1 &&
         float_rank4(v);
}

// A squeeze-and-excitation block's Mul of v [N, C, H, W] by a per-channel scale S [1 or N, C, 1, 1]
// (by declared types): which input v is, or -1. It becomes mpq::ScaleChannels, whose output keeps
// v's layout.
int channel_scale_input(const ir::Node& n, const ir::Value* v, int64_t channels) {
  if (!n.domain.empty() || n.op_type != "Mul" || n.num_inputs() != 2 || n.num_outputs() != 1) return -1;
  if (n.input(0) == n.input(1) || !float_rank4(v)) return -1;
  // v of one pixel would be a scale too: either side could be X, and every layout is the same.
  if (v->type.dims[2] == ir::Dim::fixed(1) && v->type.dims[3] == ir::Dim::fixed(1)) return -1;
  const int at = n.input(0) == v ? 0 : 1;
  const ir::Value* scale = n.input(1 - at);
  if (!float_rank4(scale)) return -1;
  const std::vector<ir::Dim>& d = scale->type.dims;
  const bool batch = d[0] == ir::Dim::fixed(1) || (d[0] == v->type.dims[0] && (d[0].known() || !d[0].param.empty()));
  if (!batch || d[1] != ir::Dim::fixed(channels) || d[2] != ir::Dim::fixed(1) || d[3] != ir::Dim::fixed(1)) return -1;
  return at;
}

// Collects the convolutions that read `v`, directly or through layout-transparent nodes, with the
// input they read it as, and the squeeze-and-excitation nodes on the way (`layout_nodes`: a global
// average pool reading it, a per-channel Mul passing it on); false when something else sees `v` or
// a value on the way: another op, a graph output, a subgraph, or a convolution input other than X
// (0) or Z (3). `channels`: v's channel count.
bool blockable_readers(const ir::Model& model, const ir::Value* v, int64_t channels, std::vector<ir::Use>& convs,
                       std::vector<ir::Use>& layout_nodes) {
  if (!v || v->is_graph_output() || v->uses().empty()) return false;
  if (v->type.is_tensor() && v->type.elem != DType::Undefined && v->type.elem != DType::Float32) return false;
  if (consumer_count(model, v) != v->uses().size()) return false;  // read inside a subgraph
  for (const ir::Use& u : v->uses()) {
    if (u.input_index == 0 && layout_transparent(*u.node)) {
      if (!blockable_readers(model, u.node->output(0), channels, convs, layout_nodes)) return false;
      continue;
    }
    if (layout_pool(*u.node, v)) {
      layout_nodes.push_back(u);
      continue;
    }
    if (channel_scale_input(*u.node, v, channels) == u.input_index) {
      if (!blockable_readers(model, u.node->output(0), channels, convs, layout_nodes)) return false;
      layout_nodes.push_back(u);
      continue;
    }
    if (!blockable_conv(*u.node)) return false;
    if (u.input_index != 0 && !(u.input_index == 3 && is_fused_conv(*u.node))) return false;
    convs.push_back(u);
  }
  return true;
}

}  // namespace

PassStats BlockConvLayout::run(ir::Model& model) {
  PassStats stats;
  if (block_ != 8 && block_ != 16) throw Error(ErrorKind::Internal, fmt::format("block_conv_layout: block {}", block_));
  // Decide every edge on the graph as written, then rewrite. An edge is named by its producer.
  std::vector<ir::Node*> producers;
  std::vector<std::vector<ir::Use>> readers;  // per producer: the convolutions its tensor reaches
  std::vector<std::vector<ir::Use>> se_nodes;  // per producer: the pools and scales on the way
  for (const auto& node : model.graph->nodes()) {
    std::vector<ir::Use> convs, layout_nodes;
    if (blockable_conv(*node) && (channels_last_ || output_channels(*node) % block_ == 0) &&
        blockable_readers(model, node->output(0), output_channels(*node), convs, layout_nodes)) {
      producers.push_back(node.get());
      readers.push_back(std::move(convs));
      se_nodes.push_back(std::move(layout_nodes));
    }
  }
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
    for (const ir::Use& u : readers[e]) meet(u.node, e);
  }
  // An edge only pools read (a network's last convolution before its global pool) takes its
  // producer's layout where its channels fit it and is left plain where not: it does not make a
  // whole chain channels-last for the sake of one pool. Alone in its group, it decides by itself.
  std::vector<char> channels_last(producers.size(), 0);
  std::vector<size_t> group_edges(producers.size(), 0);
  for (size_t e = 0; e < producers.size(); ++e) ++group_edges[find(e)];
  auto pool_only = [&](size_t e) { return readers[e].empty(); };
  for (size_t e = 0; e < producers.size(); ++e)
    if (output_channels(*producers[e]) % block_ != 0 && (!pool_only(e) || group_edges[find(e)] == 1))
      channels_last[find(e)] = 1;
  // oneDNN's int8 kernels (passes/int8_conv) take NHWC in and out only: a group with such a
  // convolution is kept channels-last, where its float convolutions run directly too.
  if (channels_last_)
    for (size_t e = 0; e < producers.size(); ++e) {
      bool int8 = producers[e]->has_attr("int8_scales");
      for (const ir::Use& u : readers[e]) int8 = int8 || u.node->has_attr("int8_scales");
      if (int8) channels_last[find(e)] = 1;
    }

  for (size_t e = 0; e < producers.size(); ++e) {
    ir::Node* p = producers[e];
    ir::Value* v = p->output(0);
    const int64_t block = channels_last[find(e)] ? rt::cpu::kChannelsLast : block_;
    if (!rt::cpu::fits_channel_block(block, output_channels(*p))) continue;  // a pool-only edge (above)
    if (!is_fused_conv(*p)) make_fused_conv(model, *p);
    p->set_attr(ir::Attribute::make_int("y_block", block));
    for (const ir::Use& u : readers[e]) {
      if (!is_fused_conv(*u.node)) make_fused_conv(model, *u.node);
      u.node->set_attr(ir::Attribute::make_int(u.input_index == 0 ? "x_block" : "z_block", block));
    }
    for (const ir::Use& u : se_nodes[e]) {
      ir::Node* n = u.node;
      if (n->op_type == "Mul") {
        if (u.input_index == 1) {  // X (the tensor in the layout) first, the scale second
          ir::Value* scale = n->input(0);
          model.graph->set_node_input(n, 0, n->input(1));
          model.graph->set_node_input(n, 1, scale);
        }
        n->op_type = "ScaleChannels";
      }
      n->domain = "mpq";
      if (model.opset("mpq") == 0) model.set_opset("mpq", 1);
      n->set_attr(ir::Attribute::make_int("x_block", block));
    }
    ++stats.changed;
    stats.notes.push_back(fmt::format("{} stays {} from {} to {} convolution(s)", v->name(),
                                      block == block_ ? fmt::format("in {}-channel blocks", block_) : std::string("channels-last (NHWC)"),
                                      p->label(), readers[e].size()));
  }
  return stats;
}

}  // namespace mpq::passes
