#include "runtime/batch_rows.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <unordered_set>

#include "core/error.h"

namespace mpq::rt {

namespace {

using ValueSet = std::unordered_set<const ir::Value*>;

// Ranks of the values with rows, as each accepted node gives them to its outputs (models as
// written often declare no types for intermediate values); -1 when unknown.
using Ranks = std::unordered_map<const ir::Value*, int>;

// Rank from the propagated ranks, a constant's shape or the declared type; -1 when unknown.
int rank_of(const Ranks& ranks, const ir::Value* v) {
  if (!v) return -1;
  if (auto it = ranks.find(v); it != ranks.end() && it->second >= 0) return it->second;
  if (const Tensor* c = ir::constant_value(v)) return c->rank();
  if (v->type.is_tensor() && v->type.has_shape) return static_cast<int>(v->type.dims.size());
  return -1;
}

// Leading dimension when known (constant or declared fixed), else -1.
int64_t dim0_of(const ir::Value* v) {
  if (const Tensor* c = ir::constant_value(v)) return c->rank() > 0 ? c->shape()[0] : -1;
  if (v && v->type.is_tensor() && v->type.has_shape && !v->type.dims.empty() && v->type.dims[0].known())
    return v->type.dims[0].value;
  return -1;
}

// Axis attribute normalised against `rank`; -1 when it cannot be (negative with an unknown rank).
int64_t axis_attr(const ir::Node& n, const char* name, int64_t fallback, int rank) {
  int64_t axis = n.attr_int(name, fallback);
  if (axis < 0) axis = rank < 0 ? -1 : axis + rank;
  return axis;
}

// Ops that compute each row from the same row of input 0 (and, where listed, other inputs with
// rows), all other inputs being the same for every row: element-wise, per-sample normalisation,
// convolution and pooling over the trailing axes, quantization with a scale per tensor or per
// channel.
const std::unordered_set<std::string>& per_row_ops() {
  static const std::unordered_set<std::string> ops = {
      "Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu", "Selu", "Softplus", "Abs",
      "Neg", "Exp", "Log", "Sqrt", "Erf", "Gelu", "mpq::Gelu", "Clip", "Identity", "Cast", "Conv", "ConvTranspose",
      "mpq::FusedConv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization",
      "InstanceNormalization", "LRN", "QuantizeLinear", "DequantizeLinear", "mpq::FakeQuant",
      "mpq::GlobalAveragePool"};
  return ops;
}

// Why node n does not keep rows apart, given which of its inputs hold rows; empty when it does, and
// then `out_rank` is the rank of its outputs (-1 when unknown).
std::string row_problem(const ir::Model& model, const ir::Node& n, const ValueSet& rows, const Ranks& ranks,
                        int& out_rank) {
  const std::string op = n.domain.empty() ? n.op_type : n.domain + "::" + n.op_type;
  auto rank_of = [&](const ir::Value* v) { return ::mpq::rt::rank_of(ranks, v); };
  out_rank = rank_of(n.input(0));  // most ops keep the rank of their first input
  auto has_rows = [&](size_t i) { return n.input(i) && rows.count(n.input(i)) > 0; };
  auto only_rows_in = [&](std::initializer_list<size_t> allowed) {
    for (size_t i = 0; i < n.num_inputs(); ++i)
      if (has_rows(i) && std::find(allowed.begin(), allowed.end(), i) == allowed.end()) return false;
    return true;
  };
  if (per_row_ops().count(op)) {
    // The rows must come in as input 0 (FusedConv's residual Z has the output's shape, so it may
    // hold rows too, but only beside X).
    if (!has_rows(0) || !only_rows_in({0, op == "mpq::FusedConv" ? size_t{3} : size_t{0}})) return "reads rows as a parameter";
    // MaxPool's indices count from the start of the whole tensor, batch included.
    if (op == "MaxPool" && n.num_outputs() > 1 && n.output(1)) return "returns indices into the whole batch";
    // Training mode, or (before opset 14) asking for the mean and variance, uses batch statistics.
    if (op == "BatchNormalization") {
      bool statistics = n.attr_int("training_mode", 0) != 0;
      for (size_t i = 1; i < n.num_outputs(); ++i) statistics = statistics || n.output(i) != nullptr;
      if (statistics) return "uses batch statistics";
    }
    if (op == "QuantizeLinear" || op == "DequantizeLinear" || op == "mpq::FakeQuant") {
      const Tensor* scale = ir::constant_value(n.input(1));
      if (!scale) return "has a scale that is not a constant";
      if (n.attr_int("block_size", 0) != 0) return "has scales per block, batch included";
      if (scale->numel() > 1 && axis_attr(n, "axis", 1, rank_of(n.input(0))) < 1) return "has a scale per row";
    }
    return {};
  }
  // mpq::ScaleChannels is a Mul by a [1 or N, C, 1, 1] scale, in a convolution layout that keeps
  // each image's values together.
  if (op == "mpq::ScaleChannels" && !has_rows(0)) return "reads rows as its scale";  // S: 1 or X's batch
  if (op == "Add" || op == "Sub" || op == "Mul" || op == "Div" || op == "Pow" || op == "PRelu" ||
      op == "mpq::ScaleChannels") {
    // Broadcasting aligns trailing axes: an input with rows must span all of the output's axes, and
    // one without must not reach axis 0 (a lower rank, or a leading dimension of 1).
    out_rank = 0;
    for (ir::Value* v : n.inputs()) {
      const int r = rank_of(v);
      if (r < 0) return "has an input of unknown rank";
      out_rank = std::max(out_rank, r);
    }
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      const int r = rank_of(n.input(i));
      if (has_rows(i) ? r != out_rank : (r == out_rank && dim0_of(n.input(i)) != 1)) return "broadcasts over rows";
    }
    return {};
  }
  if (op == "Flatten") {
    if (!only_rows_in({0})) return "reads rows as a parameter";
    out_rank = 2;
    return axis_attr(n, "axis", 1, rank_of(n.input(0))) >= 1 ? std::string() : "flattens the rows together";
  }
  if (op == "Gemm") {
    if (!only_rows_in({0}) || n.attr_int("transA", 0) != 0) return "reads rows as B, C or transposed";
    if (const ir::Value* c = n.input(2)) {
      const int r = rank_of(c);
      if (r < 0 || (r == 2 && dim0_of(c) != 1)) return "adds a C with a row per batch row";
    }
    out_rank = 2;
    return {};
  }
  if (op == "MatMul" || op == "mpq::MatMulBias") {
    const int ra = rank_of(n.input(0)), rb = rank_of(n.input(1));
    // Both with rows (attention's Q.K^T and P.V): the leading axes pair up, batch with batch.
    if (op == "MatMul" && has_rows(0) && has_rows(1)) {
      if (ra < 3 || ra != rb) return "multiplies batched matrices of different ranks";
      return {};
    }
    if (!only_rows_in({0})) return "reads rows as B";
    for (size_t i = 2; i < n.num_inputs(); ++i) {
      const int rc = rank_of(n.input(i));
      if (n.input(i) && (rc < 0 || rc > 1)) return "adds a bias that may have rows";
    }
    if (ra < 2 || rb < 1 || rb > 2) return "multiplies batched matrices";
    out_rank = rb == 1 ? ra - 1 : ra;
    return {};
  }
  // A feed-forward block (runtime/cpu/mlp.cpp): two products with 2-D weights and biases of rank <= 1
  // around a Gelu, each row of Y from the same row of X.
  if (op == "mpq::GeluMlp") {
    if (!only_rows_in({0})) return "reads rows as a weight or bias";
    for (const size_t i : {size_t{1}, size_t{3}})
      if (rank_of(n.input(i)) != 2) return "multiplies by weights that are not matrices";
    for (const size_t i : {size_t{2}, size_t{4}}) {
      const int rc = rank_of(n.input(i));
      if (rc < 0 || rc > 1) return "adds a bias that may have rows";
    }
    if (rank_of(n.input(0)) < 2) return "multiplies a vector";
    return {};
  }
  if (op == "Concat") {
    for (size_t i = 0; i < n.num_inputs(); ++i)
      if (n.input(i) && !has_rows(i)) return "joins rows with a tensor that has none";
    return axis_attr(n, "axis", 1, rank_of(n.input(0))) >= 1 ? std::string() : "joins along the batch axis";
  }
  if (op == "Resize") {
    const bool old = model.opset("") < 11;  // Resize-10: (X, scales)
    if (!only_rows_in({0})) return "reads rows as a parameter";
    if (n.attr_string("coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize") return "crops by a ROI";
    if (n.has_attr("axes")) return "scales the axes it lists, maybe the batch";  // opset 18
    const ir::Value* sizes = old ? nullptr : n.input(3);
    if (sizes && !(ir::constant_value(sizes) && ir::constant_value(sizes)->numel() == 0)) return "resizes to fixed sizes";
    const Tensor* scales = ir::constant_value(n.input(old ? 1 : 2));
    if (!scales || scales->numel() == 0 || scales->dtype() != DType::Float32 || scales->data<float>()[0] != 1.0f)
      return "may scale the batch axis";
    return {};
  }
  if (op == "Softmax" || op == "LogSoftmax") {
    if (!only_rows_in({0})) return "reads rows as a parameter";
    const int64_t fallback = model.opset("") < 13 ? 1 : -1;
    return axis_attr(n, "axis", fallback, rank_of(n.input(0))) >= 1 ? std::string() : "normalises across rows";
  }
  if (op == "LayerNormalization" || op == "mpq::LayerNormalization") {
    if (!only_rows_in({0})) return "reads rows as a parameter";
    return axis_attr(n, "axis", -1, rank_of(n.input(0))) >= 1 ? std::string() : "normalises across rows";
  }
  if (op == "ReduceMean" || op == "ReduceSum" || op == "ReduceMax" || op == "ReduceMin" || op == "ReduceProd" ||
      op == "ReduceL2" || op == "ReduceSumSquare") {
    if (!only_rows_in({0})) return "reads rows as its axes";
    const int r = rank_of(n.input(0));
    // Axes from a second input (ReduceSum 13+, all 18+), which the kernel prefers whenever it is
    // there, else from the attribute.
    std::vector<int64_t> axes = n.attr_ints("axes");
    if (n.input(1)) {
      const Tensor* t = ir::constant_value(n.input(1));
      if (!t || (t->dtype() != DType::Int64 && t->dtype() != DType::Int32)) return "reduces over axes computed at run time";
      axes.clear();
      for (int64_t i = 0; i < t->numel(); ++i)
        axes.push_back(t->dtype() == DType::Int64 ? t->data<int64_t>()[i] : t->data<int32_t>()[i]);
    }
    if (axes.empty() || r < 0) return "may reduce over the batch axis";
    for (int64_t a : axes)
      if ((a < 0 ? a + r : a) == 0) return "reduces over the batch axis";
    if (n.attr_int("keepdims", 1) == 0) out_rank = r - static_cast<int>(axes.size());
    return {};
  }
  if (op == "Reshape") {
    // A constant shape keeps the batch only by copying it (0, without allowzero); one computed from
    // the batch size is handled with the sizes (rows_independent).
    const Tensor* shape = ir::constant_value(n.input(1));
    if (!only_rows_in({0}) || !shape || shape->dtype() != DType::Int64 || shape->numel() == 0) return "may reshape the rows";
    if (shape->data<int64_t>()[0] != 0 || n.attr_int("allowzero", 0) != 0) return "may reshape the rows";
    out_rank = static_cast<int>(shape->numel());
    return {};
  }
  if (op == "Gather" && !has_rows(0) && n.attr_int("axis", 0) == 0) {
    // An embedding lookup: rows of indices pick rows of a table (Gather reading rows as its data
    // is handled with the moved axes, in rows_independent).
    const int rd = rank_of(n.input(0)), ri = rank_of(n.input(1));
    if (rd < 1 || ri < 1) return "gathers with indices of unknown rank";
    out_rank = rd - 1 + ri;
    return {};
  }
  return fmt::format("{} is not known to keep rows apart", op);
}

}  // namespace

namespace {

// Constant int64 elements of v (a 0-D or 1-D initializer or Constant), or false.
bool constant_ints(const ir::Value* v, std::vector<int64_t>& out) {
  const Tensor* t = ir::constant_value(v);
  if (!t || t->dtype() != DType::Int64 || t->rank() > 1) return false;
  out.assign(t->data<int64_t>(), t->data<int64_t>() + t->numel());
  return true;
}

// Sizes computed from shapes (Shape and what follows it: Gather, Slice, Unsqueeze, Concat): a
// 1-D int64 vector, or a scalar, and which of its elements is the batch size. In a part's run that
// element is the part's batch; every other one is the same as in the whole run.
struct Sizes {
  std::vector<char> batch;
  bool scalar = false;
};

// What node n computes from sizes (and constants); false, with `problem`, if it is anything else.
bool sizes_of_node(const ir::Node& n, const std::unordered_map<const ir::Value*, Sizes>& sizes, Sizes& out,
                   std::string& problem) {
  auto sized = [&](size_t i) -> const Sizes* {
    auto it = n.input(i) ? sizes.find(n.input(i)) : sizes.end();
    return it == sizes.end() ? nullptr : &it->second;
  };
  const std::string& op = n.op_type;
  const Sizes* in = sized(0);
  if (!n.domain.empty()) {
    problem = "reads sizes computed from the batch";
    return false;
  }
  if ((op == "Cast" || op == "Identity") && in) {
    out = *in;
    return true;
  }
  if (op == "Gather" && in && !in->scalar && n.attr_int("axis", 0) == 0) {
    std::vector<int64_t> idx;
    const Tensor* t = ir::constant_value(n.input(1));
    if (constant_ints(n.input(1), idx)) {
      const auto len = static_cast<int64_t>(in->batch.size());
      for (int64_t i : idx) {
        if (i < -len || i >= len) break;
        out.batch.push_back(in->batch[static_cast<size_t>(i < 0 ? i + len : i)]);
      }
      out.scalar = t->rank() == 0;
      if (out.batch.size() == idx.size()) return true;
    }
  }
  if (op == "Slice" && in && !in->scalar) {
    std::vector<int64_t> starts, ends, axes{0}, steps{1};
    if (constant_ints(n.input(1), starts) && constant_ints(n.input(2), ends) && starts.size() == 1 &&
        ends.size() == 1 && (!n.input(3) || constant_ints(n.input(3), axes)) &&
        (!n.input(4) || constant_ints(n.input(4), steps)) && axes == std::vector<int64_t>{0} && steps == std::vector<int64_t>{1}) {
      const auto len = static_cast<int64_t>(in->batch.size());
      auto clampi = [&](int64_t v) { return std::clamp(v < 0 ? v + len : v, int64_t{0}, len); };
      for (int64_t i = clampi(starts[0]); i < clampi(ends[0]); ++i) out.batch.push_back(in->batch[static_cast<size_t>(i)]);
      return true;
    }
  }
  if (op == "Unsqueeze" && in && in->scalar) {
    std::vector<int64_t> axes = n.attr_ints("axes");
    if (n.input(1)) constant_ints(n.input(1), axes);
    if (axes == std::vector<int64_t>{0} || axes == std::vector<int64_t>{-1}) {
      out.batch = in->batch;
      return true;
    }
  }
  if (op == "Concat" && (n.attr_int("axis", 0) == 0 || n.attr_int("axis", 0) == -1)) {
    for (size_t i = 0; i < n.num_inputs(); ++i) {
      std::vector<int64_t> c;
      if (const Sizes* part = sized(i); part && !part->scalar) {
        out.batch.insert(out.batch.end(), part->batch.begin(), part->batch.end());
      } else if (constant_ints(n.input(i), c) && ir::constant_value(n.input(i))->rank() == 1) {
        out.batch.insert(out.batch.end(), c.size(), 0);
      } else {
        problem = "joins sizes with a value of unknown length";
        return false;
      }
    }
    return true;
  }
  problem = "computes with the batch size";
  return false;
}

}  // namespace

bool rows_independent(const ir::Model& model, std::string* why) {
  auto fail = [&](std::string reason) {
    if (why) *why = std::move(reason);
    return false;
  };
  const ir::Graph& g = *model.graph;
  ValueSet rows;
  Ranks ranks;
  // The axis that holds the rows, for values whose rows are not on axis 0 (Transpose moves them;
  // Gather on another axis can bring them back). Every rule in row_problem wants axis 0.
  std::unordered_map<const ir::Value*, int> moved;
  std::unordered_map<const ir::Value*, Sizes> sizes;
  for (ir::Value* v : g.inputs()) {
    if (v->has_initializer()) return fail(fmt::format("input '{}' has a default value", v->name()));
    // A part must be a valid feed: a batch fixed in the model cannot be fed in parts.
    if (dim0_of(v) >= 0) return fail(fmt::format("input '{}' has a fixed first dimension", v->name()));
    rows.insert(v);
  }
  auto axis_of = [&](const ir::Value* v) {
    auto it = moved.find(v);
    return it == moved.end() ? 0 : it->second;
  };
  auto add_rows = [&](const ir::Node& n, int rank, int axis) {
    for (const ir::Value* v : n.outputs())
      if (v) {
        rows.insert(v);
        ranks[v] = rank;
        if (axis != 0) moved[v] = axis;
      }
  };
  // Nodes are stored in topological order (the executor checks it when it plans).
  for (const auto& node : g.nodes()) {
    const ir::Node& n = *node;
    // A subgraph may read rows from this graph without listing them as the node's inputs.
    if (!n.subgraphs().empty()) return fail(fmt::format("{}: runs a subgraph", n.label()));
    bool reads_rows = false, reads_sizes = false;
    for (const ir::Value* v : n.inputs()) {
      reads_rows = reads_rows || (v && rows.count(v));
      reads_sizes = reads_sizes || (v && sizes.count(v));
    }
    if (!reads_rows && !reads_sizes) continue;  // computes the same for every part
    const bool plain = n.domain.empty();
    const ir::Value* x = n.input(0);
    const int rank = rank_of(ranks, x);
    if (reads_sizes) {
      // Reshape(rows, sizes): rows stay on axis 0 when the new shape starts with the batch size
      // and holds it nowhere else (row-major order then keeps each row's values together).
      if (plain && n.op_type == "Reshape" && rows.count(x) && sizes.count(n.input(1)) && axis_of(x) == 0) {
        const Sizes& shape = sizes.at(n.input(1));
        if (shape.scalar || shape.batch.empty() || !shape.batch[0] ||
            std::count(shape.batch.begin(), shape.batch.end(), 1) != 1)
          return fail(fmt::format("{}: reshapes the batch axis", n.label()));
        add_rows(n, static_cast<int>(shape.batch.size()), 0);
        continue;
      }
      if (reads_rows) return fail(fmt::format("{}: mixes rows with sizes computed from them", n.label()));
      Sizes out;
      std::string problem;
      if (!sizes_of_node(n, sizes, out, problem)) return fail(fmt::format("{}: {}", n.label(), problem));
      for (const ir::Value* v : n.outputs())
        if (v) sizes[v] = out;
      continue;
    }
    if (plain && n.op_type == "Shape") {
      // Opset 15's start/end would select dimensions: not needed by the models here.
      if (rank < 0 || n.has_attr("start") || n.has_attr("end")) return fail(fmt::format("{}: reads an unknown shape", n.label()));
      Sizes out;
      out.batch.assign(static_cast<size_t>(rank), 0);
      out.batch[static_cast<size_t>(axis_of(x))] = 1;
      sizes[n.output(0)] = out;
      continue;
    }
    if (plain && n.op_type == "Transpose" && rows.count(x)) {
      const std::vector<int64_t> perm = n.attr_ints("perm");
      if (perm.empty() || (rank >= 0 && static_cast<int>(perm.size()) != rank))
        return fail(fmt::format("{}: transposes with an unknown permutation", n.label()));
      const auto at = std::find(perm.begin(), perm.end(), axis_of(x));
      if (at == perm.end()) return fail(fmt::format("{}: drops the batch axis", n.label()));
      add_rows(n, static_cast<int>(perm.size()), static_cast<int>(at - perm.begin()));
      continue;
    }
    if (plain && n.op_type == "Gather" && rows.count(x) && !rows.count(n.input(1))) {
      // Picking along another axis with constant indices: the rows stay, one axis earlier or
      // later as the indices' rank replaces the gathered axis.
      const Tensor* idx = ir::constant_value(n.input(1));
      const int64_t a = axis_attr(n, "axis", 0, rank);
      const int b = axis_of(x);
      if (!idx || rank < 0 || a < 0 || a == b) return fail(fmt::format("{}: gathers along the batch axis", n.label()));
      add_rows(n, rank - 1 + idx->rank(), a < b ? b - 1 + idx->rank() : b);
      continue;
    }
    for (const ir::Value* v : n.inputs())
      if (v && rows.count(v) && axis_of(v) != 0)
        return fail(fmt::format("{}: reads rows moved off axis 0", n.label()));
    int out_rank = -1;
    std::string problem = row_problem(model, n, rows, ranks, out_rank);
    if (!problem.empty()) return fail(fmt::format("{}: {}", n.label(), problem));
    add_rows(n, out_rank, 0);
  }
  for (ir::Value* v : g.outputs())
    if (!rows.count(v) || axis_of(v) != 0)
      return fail(fmt::format("output '{}' does not come from the inputs' rows", v->name()));
  return true;
}

namespace {
std::atomic<int64_t> g_row_splits{0};
}  // namespace

int64_t row_split_count() { return g_row_splits.load(std::memory_order_relaxed); }
void note_row_split() { g_row_splits.fetch_add(1, std::memory_order_relaxed); }

bool batch_split_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("MPQ_BATCH_SPLIT");
    return v == nullptr || std::string(v) != "0";
  }();
  return enabled;
}

std::vector<int64_t> row_parts(int64_t rows, int threads) {
  if (threads < 2 || rows < threads || (rows % threads != 0 && rows < 4 * threads)) return {};
  std::vector<int64_t> parts(static_cast<size_t>(threads), rows / threads);
  for (int64_t i = 0; i < rows % threads; ++i) ++parts[static_cast<size_t>(i)];
  return parts;
}

Tensor slice_rows(const Tensor& t, int64_t begin, int64_t count) {
  if (t.rank() == 0 || begin < 0 || count < 0 || begin + count > t.shape()[0] || t.dtype() == DType::String)
    fail_internal("slice_rows: rows [{}, {}) of {}", begin, begin + count, shape_str(t.shape()));
  Shape shape = t.shape();
  shape[0] = count;
  Tensor out(t.dtype(), shape);
  const size_t row_bytes = t.shape()[0] > 0 ? t.nbytes() / static_cast<size_t>(t.shape()[0]) : 0;
  if (out.nbytes() > 0)
    std::memcpy(out.raw_data(), static_cast<const uint8_t*>(t.raw_data()) + static_cast<size_t>(begin) * row_bytes, out.nbytes());
  return out;
}

Tensor concat_rows(const std::vector<Tensor>& parts, const std::string& what) {
  if (parts.empty()) fail_internal("concat_rows: no parts for {}", what);
  const Tensor& first = parts[0];
  Shape shape = first.shape();
  if (shape.empty()) fail_input("{}: a part is a scalar, it has no rows to join", what);
  shape[0] = 0;
  for (const Tensor& p : parts) {
    const bool same = p.dtype() == first.dtype() && p.rank() == first.rank() &&
                      std::equal(p.shape().begin() + 1, p.shape().end(), first.shape().begin() + 1);
    if (!same || p.dtype() == DType::String)
      fail_input("{}: parts of the batch came back as {} and {}, which do not join along axis 0", what,
                 shape_str(first.shape()), shape_str(p.shape()));
    shape[0] += p.shape()[0];
  }
  Tensor out(first.dtype(), shape);
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  for (const Tensor& p : parts) {
    if (p.nbytes() == 0) continue;
    std::memcpy(dst, p.raw_data(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

}  // namespace mpq::rt
