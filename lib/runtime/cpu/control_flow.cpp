// Control flow: If, Loop, Scan. Subgraphs run through ctx.subgraphs().run_subgraph(); values of
// enclosing scopes are resolved by the executor. These kernels only move tensors around, so they
// are registered with native_low_precision (float16 loop-carried values stay float16).
#include <algorithm>
#include <cstring>
#include <limits>

#include "runtime/cpu/common.h"
#include "runtime/cpu/register_all.h"

namespace mpq::rt::cpu {

namespace {

size_t elem_bytes(const KernelContext& ctx, DType t) {
  const int bits = dtype_bits(t);
  if (bits < 8 || bits % 8 != 0)
    ctx.fail_unsupported("scanning or stacking {} tensors is not supported", dtype_name(t));
  return static_cast<size_t>(bits / 8);
}

// Slice i along `axis` (the axis removed from the shape).
Tensor slice_axis(const KernelContext& ctx, const Tensor& t, int axis, int64_t i) {
  const size_t eb = elem_bytes(ctx, t.dtype());
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= t.dim(d);
  for (int d = axis + 1; d < t.rank(); ++d) inner *= t.dim(d);
  const int64_t S = t.dim(axis);
  Shape shape = t.shape();
  shape.erase(shape.begin() + axis);
  Tensor out(t.dtype(), shape);
  const auto* src = static_cast<const uint8_t*>(t.raw_data());
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  const size_t run = static_cast<size_t>(inner) * eb;
  for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + static_cast<size_t>(o) * run, src + static_cast<size_t>(o * S + i) * run, run);
  return out;
}

// Stack equally shaped slices along a new axis `axis` (0 <= axis <= slice rank).
Tensor stack_axis(const KernelContext& ctx, const std::vector<Tensor>& slices, int axis, const char* what) {
  const Tensor& first = slices.front();
  for (const Tensor& s : slices)
    if (s.dtype() != first.dtype() || s.shape() != first.shape())
      ctx.fail("{}: iterations produced different types or shapes ({}{} and {}{})", what, dtype_name(first.dtype()),
               shape_str(first.shape()), dtype_name(s.dtype()), shape_str(s.shape()));
  const size_t eb = elem_bytes(ctx, first.dtype());
  const int64_t S = static_cast<int64_t>(slices.size());
  Shape shape = first.shape();
  shape.insert(shape.begin() + axis, S);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < axis; ++d) outer *= first.dim(d);
  for (int d = axis; d < first.rank(); ++d) inner *= first.dim(d);
  Tensor out(first.dtype(), shape);
  auto* dst = static_cast<uint8_t*>(out.raw_data());
  const size_t run = static_cast<size_t>(inner) * eb;
  for (int64_t i = 0; i < S; ++i) {
    const auto* src = static_cast<const uint8_t*>(slices[static_cast<size_t>(i)].raw_data());
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(dst + static_cast<size_t>(o * S + i) * run, src + static_cast<size_t>(o) * run, run);
  }
  return out;
}

// An empty stack (zero iterations): the body output's declared type gives the element type and
// the per-iteration shape where known.
Tensor empty_stack(const ir::Value* body_out, int axis) {
  DType dt = DType::Float32;
  Shape shape;
  if (body_out && body_out->type.is_tensor()) {
    if (body_out->type.elem != DType::Undefined) dt = body_out->type.elem;
    if (auto s = body_out->type.static_shape()) shape = *s;
  }
  axis = std::clamp(axis, 0, static_cast<int>(shape.size()));
  shape.insert(shape.begin() + axis, 0);
  return Tensor(dt, shape);
}

bool scalar_bool(const KernelContext& ctx, const Tensor& t, const char* what) {
  if (t.dtype() != DType::Bool) ctx.fail("{} must be bool, got {}", what, dtype_name(t.dtype()));
  if (t.numel() != 1) ctx.fail("{} must hold exactly one value, got shape {}", what, shape_str(t.shape()));
  return t.data<bool>()[0];
}

const ir::Graph& graph_attr(const KernelContext& ctx, const char* name) {
  const ir::Graph* g = ctx.node().attr_graph(name);
  if (!g) ctx.fail("missing graph attribute '{}'", name);
  return *g;
}

// ---------------------------------------------------------------------------------------------

void if_kernel(KernelContext& ctx) {
  const bool cond = scalar_bool(ctx, ctx.input(0), "condition");
  const ir::Graph& branch = graph_attr(ctx, cond ? "then_branch" : "else_branch");
  if (branch.outputs().size() != ctx.num_outputs())
    ctx.fail("{} has {} outputs, the node has {}", cond ? "then_branch" : "else_branch", branch.outputs().size(),
             ctx.num_outputs());
  std::vector<Tensor> outs = ctx.subgraphs().run_subgraph(branch, {});
  for (size_t i = 0; i < outs.size(); ++i)
    if (ctx.output_wanted(i)) ctx.set_output(i, std::move(outs[i]));
}

// Loop(M?, cond?, v_initial...) -> (v_final..., scan_outputs...)
void loop_kernel(KernelContext& ctx) {
  const ir::Graph& body = graph_attr(ctx, "body");
  const size_t n_carried = ctx.num_inputs() >= 2 ? ctx.num_inputs() - 2 : 0;
  if (body.inputs().size() != 2 + n_carried)
    ctx.fail("body takes {} inputs, expected 2 + {} loop-carried values", body.inputs().size(), n_carried);
  if (body.outputs().size() < 1 + n_carried)
    ctx.fail("body has {} outputs, expected 1 + {} loop-carried values + scan outputs", body.outputs().size(), n_carried);
  const size_t n_scan = body.outputs().size() - 1 - n_carried;
  if (ctx.num_outputs() > n_carried + n_scan)
    ctx.fail("node has {} outputs, the body provides {}", ctx.num_outputs(), n_carried + n_scan);

  int64_t max_trip = std::numeric_limits<int64_t>::max();
  if (const Tensor* m = ctx.input_or_null(0)) {
    if (!dtype_is_integer(m->dtype()) || m->numel() != 1)
      ctx.fail("trip count M must be one integer, got {}{}", dtype_name(m->dtype()), shape_str(m->shape()));
    max_trip = m->get_int64(0);
  }
  bool cond = true;
  if (const Tensor* c = ctx.input_or_null(1)) cond = scalar_bool(ctx, *c, "cond");

  std::vector<Tensor> carried(n_carried);
  for (size_t i = 0; i < n_carried; ++i) {
    if (!ctx.has_input(2 + i)) ctx.fail("loop-carried initial value {} is missing", i);
    carried[i] = ctx.input(2 + i);
  }
  std::vector<std::vector<Tensor>> scans(n_scan);
  std::vector<Tensor> inputs(2 + n_carried);
  for (int64_t it = 0; it < max_trip && cond; ++it) {
    inputs[0] = Tensor::scalar<int64_t>(it);
    inputs[1] = Tensor::scalar<bool>(cond);
    for (size_t i = 0; i < n_carried; ++i) inputs[2 + i] = carried[i];
    std::vector<Tensor> outs = ctx.subgraphs().run_subgraph(body, inputs);
    cond = scalar_bool(ctx, outs[0], "body condition output");
    for (size_t i = 0; i < n_carried; ++i) carried[i] = std::move(outs[1 + i]);
    for (size_t k = 0; k < n_scan; ++k) scans[k].push_back(std::move(outs[1 + n_carried + k]));
  }
  for (size_t i = 0; i < n_carried; ++i)
    if (ctx.output_wanted(i)) ctx.set_output(i, std::move(carried[i]));
  for (size_t k = 0; k < n_scan && n_carried + k < ctx.num_outputs(); ++k) {
    if (!ctx.output_wanted(n_carried + k)) continue;
    if (scans[k].empty())
      ctx.set_output(n_carried + k, empty_stack(body.outputs()[1 + n_carried + k], 0));
    else
      ctx.set_output(n_carried + k, stack_axis(ctx, scans[k], 0, "Loop scan output"));
  }
}

// ---------------------------------------------------------------------------------------------
// Scan

struct ScanSpec {
  size_t n_state = 0, n_scan_in = 0, n_scan_out = 0;
  std::vector<int64_t> in_axes, in_dirs, out_axes, out_dirs;
};

// Runs the body over one sequence: states (updated in place) and scan inputs with their axes.
// Returns per scan output the stacked tensor (or an empty stack for S == 0).
std::vector<Tensor> run_scan(KernelContext& ctx, const ir::Graph& body, const ScanSpec& spec, std::vector<Tensor>& states,
                             const std::vector<Tensor>& scan_in, const std::vector<int>& in_axes, int64_t S) {
  std::vector<std::vector<Tensor>> outs_k(spec.n_scan_out);
  std::vector<Tensor> inputs(spec.n_state + spec.n_scan_in);
  for (int64_t t = 0; t < S; ++t) {
    for (size_t i = 0; i < spec.n_state; ++i) inputs[i] = states[i];
    for (size_t j = 0; j < spec.n_scan_in; ++j) {
      const int64_t idx = spec.in_dirs[j] == 0 ? t : S - 1 - t;
      inputs[spec.n_state + j] = slice_axis(ctx, scan_in[j], in_axes[j], idx);
    }
    std::vector<Tensor> outs = ctx.subgraphs().run_subgraph(body, inputs);
    for (size_t i = 0; i < spec.n_state; ++i) states[i] = std::move(outs[i]);
    for (size_t k = 0; k < spec.n_scan_out; ++k) outs_k[k].push_back(std::move(outs[spec.n_state + k]));
  }
  std::vector<Tensor> result(spec.n_scan_out);
  for (size_t k = 0; k < spec.n_scan_out; ++k) {
    const ir::Value* decl = body.outputs()[spec.n_state + k];
    if (outs_k[k].empty()) {
      int64_t a = spec.out_axes[k];
      int rank = decl->type.is_tensor() && decl->type.has_shape ? static_cast<int>(decl->type.dims.size()) : 0;
      if (a < 0) a += rank + 1;
      result[k] = empty_stack(decl, static_cast<int>(a));
      continue;
    }
    if (spec.out_dirs[k] != 0) std::reverse(outs_k[k].begin(), outs_k[k].end());
    const int rank = outs_k[k].front().rank();
    int64_t a = spec.out_axes[k];
    if (a < -(rank + 1) || a > rank) ctx.fail("scan_output_axes value {} is out of range for rank {}", a, rank + 1);
    if (a < 0) a += rank + 1;
    result[k] = stack_axis(ctx, outs_k[k], static_cast<int>(a), "Scan output");
  }
  return result;
}

std::vector<int64_t> attr_list(const KernelContext& ctx, const char* name, size_t count) {
  std::vector<int64_t> v = ctx.node().attr_ints(name, std::vector<int64_t>(count, 0));
  if (v.size() != count) ctx.fail("{} must have {} values, got {}", name, count, v.size());
  return v;
}

ScanSpec scan_spec(KernelContext& ctx, const ir::Graph& body, size_t first_state) {
  ScanSpec spec;
  const int64_t nsi = ctx.node().attr_int("num_scan_inputs", -1);
  if (nsi <= 0) ctx.fail("num_scan_inputs must be positive, got {}", nsi);
  spec.n_scan_in = static_cast<size_t>(nsi);
  if (ctx.num_inputs() < first_state + spec.n_scan_in)
    ctx.fail("{} inputs cannot hold {} scan inputs", ctx.num_inputs(), spec.n_scan_in);
  spec.n_state = ctx.num_inputs() - first_state - spec.n_scan_in;
  if (body.inputs().size() != spec.n_state + spec.n_scan_in)
    ctx.fail("body takes {} inputs, expected {} states + {} scan inputs", body.inputs().size(), spec.n_state,
             spec.n_scan_in);
  if (body.outputs().size() < spec.n_state)
    ctx.fail("body has {} outputs, fewer than the {} states", body.outputs().size(), spec.n_state);
  spec.n_scan_out = body.outputs().size() - spec.n_state;
  if (ctx.num_outputs() > spec.n_state + spec.n_scan_out)
    ctx.fail("node has {} outputs, the body provides {}", ctx.num_outputs(), spec.n_state + spec.n_scan_out);
  return spec;
}

// Scan-9+: no batch axis.
void scan_kernel(KernelContext& ctx) {
  const ir::Graph& body = graph_attr(ctx, "body");
  ScanSpec spec = scan_spec(ctx, body, 0);
  spec.in_axes = attr_list(ctx, "scan_input_axes", spec.n_scan_in);
  spec.in_dirs = attr_list(ctx, "scan_input_directions", spec.n_scan_in);
  spec.out_axes = attr_list(ctx, "scan_output_axes", spec.n_scan_out);
  spec.out_dirs = attr_list(ctx, "scan_output_directions", spec.n_scan_out);

  std::vector<Tensor> states(spec.n_state), scan_in(spec.n_scan_in);
  for (size_t i = 0; i < spec.n_state; ++i) states[i] = ctx.input(i);
  std::vector<int> axes(spec.n_scan_in);
  int64_t S = -1;
  for (size_t j = 0; j < spec.n_scan_in; ++j) {
    scan_in[j] = ctx.input(spec.n_state + j);
    if (scan_in[j].rank() == 0) ctx.fail("scan input {} is a scalar", j);
    axes[j] = normalize_axis(ctx, spec.in_axes[j], scan_in[j].rank());
    const int64_t len = scan_in[j].dim(axes[j]);
    if (S >= 0 && len != S) ctx.fail("scan inputs have different sequence lengths ({} and {})", S, len);
    S = len;
  }
  std::vector<Tensor> scan_out = run_scan(ctx, body, spec, states, scan_in, axes, S);
  for (size_t i = 0; i < spec.n_state; ++i)
    if (ctx.output_wanted(i)) ctx.set_output(i, std::move(states[i]));
  for (size_t k = 0; k < spec.n_scan_out && spec.n_state + k < ctx.num_outputs(); ++k)
    if (ctx.output_wanted(spec.n_state + k)) ctx.set_output(spec.n_state + k, std::move(scan_out[k]));
}

// Scan-8: (sequence_lens?, states..., scan inputs...) with a leading batch axis everywhere.
void scan8_kernel(KernelContext& ctx) {
  const ir::Graph& body = graph_attr(ctx, "body");
  ScanSpec spec = scan_spec(ctx, body, 1);
  spec.in_dirs = attr_list(ctx, "directions", spec.n_scan_in);
  spec.in_axes.assign(spec.n_scan_in, 0);
  spec.out_axes.assign(spec.n_scan_out, 0);
  spec.out_dirs.assign(spec.n_scan_out, 0);
  if (spec.n_state + spec.n_scan_in == 0) ctx.fail("Scan needs inputs");
  const Tensor& first = ctx.input(1);
  if (first.rank() == 0) ctx.fail("inputs need a batch axis");
  const int64_t B = first.dim(0);
  if (B == 0) ctx.fail_unsupported("a batch of size 0 is not supported");
  int64_t S = -1;
  for (size_t j = 0; j < spec.n_scan_in; ++j) {
    const Tensor& t = ctx.input(1 + spec.n_state + j);
    if (t.rank() < 2 || t.dim(0) != B) ctx.fail("scan input {} must be [batch, sequence, ...] with batch {}", j, B);
    if (S >= 0 && t.dim(1) != S) ctx.fail("scan inputs have different sequence lengths ({} and {})", S, t.dim(1));
    S = t.dim(1);
  }
  for (size_t i = 0; i < spec.n_state; ++i)
    if (ctx.input(1 + i).rank() == 0 || ctx.input(1 + i).dim(0) != B) ctx.fail("state {} must have batch {}", i, B);
  std::vector<int64_t> lens(static_cast<size_t>(B), S);
  if (const Tensor* sl = ctx.input_or_null(0)) {
    std::vector<int64_t> v = sl->to_int64_vector();
    if (static_cast<int64_t>(v.size()) != B) ctx.fail("sequence_lens must hold {} values", B);
    for (int64_t b = 0; b < B; ++b) {
      if (v[static_cast<size_t>(b)] < 0 || v[static_cast<size_t>(b)] > S) ctx.fail("sequence_lens[{}] = {} is out of range", b, v[static_cast<size_t>(b)]);
      lens[static_cast<size_t>(b)] = v[static_cast<size_t>(b)];
    }
  }
  std::vector<std::vector<Tensor>> state_b(spec.n_state), scan_b(spec.n_scan_out);
  std::vector<int> axes(spec.n_scan_in, 0);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<Tensor> states(spec.n_state), scan_in(spec.n_scan_in);
    for (size_t i = 0; i < spec.n_state; ++i) states[i] = slice_axis(ctx, ctx.input(1 + i), 0, b);
    const int64_t L = lens[static_cast<size_t>(b)];
    for (size_t j = 0; j < spec.n_scan_in; ++j) {
      Tensor full = slice_axis(ctx, ctx.input(1 + spec.n_state + j), 0, b);  // [S, ...]
      if (L != S) {
        // Keep the first L steps (a reverse scan starts at step L - 1).
        std::vector<Tensor> steps;
        for (int64_t t = 0; t < L; ++t) steps.push_back(slice_axis(ctx, full, 0, t));
        Shape shape = full.shape();
        shape[0] = L;
        full = steps.empty() ? Tensor(full.dtype(), shape) : stack_axis(ctx, steps, 0, "Scan input");
      }
      scan_in[j] = full;
    }
    std::vector<Tensor> outs = run_scan(ctx, body, spec, states, scan_in, axes, L);
    for (size_t i = 0; i < spec.n_state; ++i) state_b[i].push_back(std::move(states[i]));
    for (size_t k = 0; k < spec.n_scan_out; ++k) {
      Tensor o = outs[k];
      if (o.dim(0) != S) {
        // Pad to the full sequence length with zeros.
        Shape shape = o.shape();
        shape[0] = S;
        Tensor padded = Tensor::zeros(o.dtype(), shape);
        std::memcpy(padded.raw_data(), o.raw_data(), o.nbytes());
        o = padded;
      }
      scan_b[k].push_back(std::move(o));
    }
  }
  for (size_t i = 0; i < spec.n_state; ++i)
    if (ctx.output_wanted(i)) ctx.set_output(i, stack_axis(ctx, state_b[i], 0, "Scan state"));
  for (size_t k = 0; k < spec.n_scan_out && spec.n_state + k < ctx.num_outputs(); ++k)
    if (ctx.output_wanted(spec.n_state + k)) ctx.set_output(spec.n_state + k, stack_axis(ctx, scan_b[k], 0, "Scan output"));
}

}  // namespace

void register_control_flow(OpRegistry& r) {
  r.add_fn("", "If", 1, kMaxOpset, BackendKind::CPU, if_kernel, /*native_low_precision=*/true);
  r.add_fn("", "Loop", 1, kMaxOpset, BackendKind::CPU, loop_kernel, /*native_low_precision=*/true);
  r.add_fn("", "Scan", 8, 8, BackendKind::CPU, scan8_kernel, /*native_low_precision=*/true);
  r.add_fn("", "Scan", 9, kMaxOpset, BackendKind::CPU, scan_kernel, /*native_low_precision=*/true);
}

}  // namespace mpq::rt::cpu
