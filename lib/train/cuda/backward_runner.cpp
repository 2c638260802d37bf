#include "train/cuda/backward_runner.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "calib/quant_ref.h"
#include "core/error.h"
#include "runtime/cpu/fake_quant.h"
#include "runtime/cuda/device_tensor.h"
#include "runtime/cuda/node_plan.h"
#include "runtime/cuda/plan_shape.h"
#include "runtime/cuda/status.h"

namespace mpq::train::gpu {

namespace cuda_plan = rt::cuda_plan;
using cuda_plan::LaunchKind;
using rt::gpu::device_empty;

namespace {

const float* cfp(const Tensor& t) { return static_cast<const float*>(t.raw_data()); }
float* mfp(Tensor& t) { return static_cast<float*>(t.raw_data()); }

bool is_reshape_like(const std::string& op) {
  return op == "Identity" || op == "Flatten" || op == "Reshape" || op == "Squeeze" || op == "Unsqueeze";
}

// A broadcast input's dimensions aligned to the broadcast's rank (leading 1s).
std::vector<int64_t> aligned_dims(const cuda::Broadcast2& bc, const Shape& in) {
  std::vector<int64_t> d(static_cast<size_t>(bc.rank), 1);
  for (size_t i = 0; i < in.size(); ++i) d[static_cast<size_t>(bc.rank) - in.size() + i] = in[i];
  return d;
}

struct Backward {
  const ir::Node& node;
  int opset;
  const BackwardCall& call;
  KernelRuntime& rt;
  cuda_plan::NodeLaunch l;
  std::vector<Tensor> grads;

  cuda::LaunchCtx ctx(int64_t work) const { return rt::gpu::node_launch_ctx(rt, work); }
  void check(int code, const char* what) const { rt::gpu::check_node_launch(rt, node, code, what); }
  void check_lib(const cuda::LibStatus& st) const { rt::gpu::check_node_library(rt, node, st); }
  [[noreturn]] void unsupported(const std::string& why) const {
    fail_unsupported("{} (backward): {}", node.label(), why);
  }
  Tensor out(const Shape& s) const { return rt::gpu::node_output(rt, node, DType::Float32, s); }
  Tensor workspace(size_t bytes) const { return rt::gpu::node_workspace(rt, node, bytes); }
  static void* ws_ptr(Tensor& t) { return rt::gpu::workspace_ptr(t); }
  bool wanted(size_t i) const { return i < call.wanted.size() && call.wanted[i] && i < call.present.size() && call.present[i]; }
  const Shape& in_shape(size_t i) const { return call.input_shapes.at(i); }
  const Tensor& saved_input(size_t i) const {
    if (i >= call.inputs.size() || !call.inputs[i].defined()) unsupported(fmt::format("input {} was not kept by the forward", i));
    return call.inputs[i];
  }
  const Tensor& saved_output(size_t j) const {
    if (j >= call.outputs.size() || !call.outputs[j].defined()) unsupported(fmt::format("output {} was not kept by the forward", j));
    return call.outputs[j];
  }
  const Tensor& dy() const {
    if (call.grad_outputs.empty() || !call.grad_outputs[0].defined())
      fail_internal("{} (backward): no gradient for output 0", node.label());
    return call.grad_outputs[0];
  }

  // g summed over the dimensions `shape` was broadcast along (an input's gradient).
  Tensor sum_to(const Tensor& g, const Shape& shape) {
    Tensor r = out(shape);
    if (r.numel() == 0) return r;
    Shape joined;
    const cuda::Broadcast2 bc = cuda_plan::make_broadcast2(shape, g.shape(), &joined);
    if (joined != g.shape())
      fail_internal("{} (backward): input shape {} does not broadcast to {}", node.label(), shape_str(shape), shape_str(g.shape()));
    const std::vector<int64_t> dims = aligned_dims(bc, shape);
    check(rt.ops.sum_to_shape(bc, dims.data(), cfp(g), mfp(r), r.numel(), ctx(r.numel())), "sum-to-shape kernel launch");
    return r;
  }
  void negate(Tensor& t) {
    if (t.numel() > 0) check(rt.ops.unary(cuda::UnaryOp::Neg, 0, 0, cfp(t), mfp(t), t.numel(), ctx(t.numel())), "negate kernel launch");
  }
  // dY * other (other broadcast to dY's shape).
  Tensor times(const Tensor& g, const Tensor& other) {
    Tensor r = out(g.shape());
    if (r.numel() == 0) return r;
    Shape joined;
    const cuda::Broadcast2 bc = cuda_plan::make_broadcast2(g.shape(), other.shape(), &joined);
    if (joined != g.shape()) fail_internal("{} (backward): operand does not broadcast to dY", node.label());
    check(rt.ops.binary(cuda::BinaryOp::Mul, bc, cfp(g), cfp(other), mfp(r), r.numel(), ctx(r.numel())), "multiply kernel launch");
    return r;
  }

  void arithmetic() {
    const std::string& op = node.op_type;
    const Tensor& g = dy();
    for (size_t i : {size_t{0}, size_t{1}}) {
      if (!wanted(i)) continue;
      if (op == "Mul") {
        grads[i] = sum_to(times(g, saved_input(1 - i)), in_shape(i));
      } else {
        grads[i] = sum_to(g, in_shape(i));
        if (op == "Sub" && i == 1) negate(grads[i]);
      }
    }
  }

  // Div: dA = sum_to(dY / B), dB = -sum_to(dY * A / B^2) (from the saved inputs, as the CPU).
  Tensor binary_op(cuda::BinaryOp op, const Tensor& a, const Tensor& b) {
    Shape joined;
    const cuda::Broadcast2 bc = cuda_plan::make_broadcast2(a.shape(), b.shape(), &joined);
    Tensor r = out(joined);
    if (r.numel() > 0) check(rt.ops.binary(op, bc, cfp(a), cfp(b), mfp(r), r.numel(), ctx(r.numel())), "binary kernel launch");
    return r;
  }
  void divide() {
    const Tensor& g = dy();
    const Tensor& b = saved_input(1);
    const Tensor g_over_b = binary_op(cuda::BinaryOp::Div, g, b);
    if (wanted(0)) grads[0] = sum_to(g_over_b, in_shape(0));
    if (wanted(1)) {
      const Tensor t = binary_op(cuda::BinaryOp::Div, binary_op(cuda::BinaryOp::Mul, g_over_b, saved_input(0)), b);
      grads[1] = sum_to(t, in_shape(1));
      negate(grads[1]);
    }
  }

  // Pow, the base only (as the CPU: exporters write a constant exponent): dA = sum_to(dY * B *
  // A^(B-1)), the slope from the saved inputs.
  void power() {
    if (!wanted(0)) return;
    const Tensor& b = saved_input(1);
    if (b.dtype() != DType::Float32) unsupported(fmt::format("a {} exponent (the device backward is FP32)", dtype_name(b.dtype())));
    grads[0] = sum_to(times(dy(), binary_op(cuda::BinaryOp::PowSlope, saved_input(0), b)), in_shape(0));
  }

  // mpq::FakeQuant: the straight-through estimator with the clipping mask for X, and LSQ's
  // step-size gradient for the scale (per-element terms, a fixed-order per-channel sum times
  // calib::lsq_grad_scale_ref). The zero point is fixed.
  void fake_quant() {
    if (l.kind != LaunchKind::FakeQuant) unsupported(l.reason);
    const bool want_x = wanted(0), want_s = wanted(1);
    if (!want_x && !want_s) return;
    const Tensor& x = saved_input(0);
    const int64_t channels = l.axis.n;
    // The zero points as int32, on the host (LSQ's factor) and on the device (the body).
    Tensor zp_host = Tensor::zeros(DType::Int32, Shape{channels});
    if (call.present.size() > 2 && call.present[2]) {
      const Tensor h = rt::gpu::to_host(saved_input(2), rt.backend, rt.stream, node.name, node.op_type);
      if (h.numel() != channels && h.numel() != 1) fail_input("{} (backward): {} zero points for {} scales", node.label(), h.numel(), channels);
      for (int64_t c = 0; c < channels; ++c) zp_host.data<int32_t>()[c] = static_cast<int32_t>(h.get_double(h.numel() == 1 ? 0 : c));
    }
    const Tensor zp = rt::gpu::to_device(zp_host, rt.alloc, rt.backend, rt.stream, node.name, node.op_type);
    cuda::QuantLayout q;
    q.outer = l.axis.outer;
    q.channels = channels;
    q.inner = l.axis.inner;
    q.scale = cfp(saved_input(1));
    q.zero_point = static_cast<const int32_t*>(zp.raw_data());
    q.qmin = static_cast<int32_t>(node.attr_int("qmin", -128));
    q.qmax = static_cast<int32_t>(node.attr_int("qmax", 127));
    const int64_t n = x.numel();
    Tensor dx = out(in_shape(0));  // written even when only the scale's gradient is wanted
    Tensor terms = want_s ? device_empty(rt.alloc, DType::Float64, Shape{n}, rt.stream, node.name, node.op_type) : Tensor();
    if (n > 0)
      check(rt.ops.fake_quant_backward(q, cfp(x), cfp(dy()), mfp(dx), want_s ? static_cast<double*>(terms.raw_data()) : nullptr, ctx(n)),
            "fake-quant backward kernel launch");
    if (want_x) grads[0] = dx;
    if (want_s) {
      Tensor factor(DType::Float64, Shape{channels});
      for (int64_t c = 0; c < channels; ++c)
        factor.data<double>()[c] = calib::lsq_grad_scale_ref(q.outer * q.inner, zp_host.data<int32_t>()[c], q.qmax);
      const Tensor factor_dev = rt::gpu::to_device(factor, rt.alloc, rt.backend, rt.stream, node.name, node.op_type);
      grads[1] = out(in_shape(1));
      if (channels > 0)
        check(rt.ops.channel_sum(q.outer, channels, q.inner, n > 0 ? static_cast<const double*>(terms.raw_data()) : nullptr,
                                 static_cast<const double*>(factor_dev.raw_data()), mfp(grads[1]), ctx(channels)),
              "scale gradient kernel launch");
    }
  }

  // Concat: each input's gradient is its slab of dY along the axis.
  void concat() {
    const Tensor& g = dy();
    const int64_t rank = static_cast<int64_t>(g.rank());
    int64_t axis = node.attr_int("axis", 0);
    if (axis < 0) axis += rank;
    int64_t offset = 0;
    for (size_t i = 0; i < call.input_shapes.size(); ++i) {
      const int64_t part = in_shape(i).at(static_cast<size_t>(axis));
      if (wanted(i)) {
        Shape sliced;
        const cuda::StridedView v = cuda_plan::make_slice_view(g.shape(), {offset}, {offset + part}, {axis}, {1}, &sliced);
        if (sliced != in_shape(i)) fail_internal("{} (backward): slab of shape {} for input {}", node.label(), shape_str(sliced), i);
        grads[i] = out(sliced);
        if (grads[i].numel() > 0)
          check(rt.ops.strided_copy(v, cfp(g), mfp(grads[i]), grads[i].numel(), ctx(grads[i].numel())), "slab copy kernel launch");
      }
      offset += part;
    }
  }

  void conv() {
    if (l.kind != LaunchKind::Conv) unsupported(l.reason);
    const Tensor& g = dy();
    // dX from W (backward-data) and dW from X (backward-filter), each with its own workspace.
    const auto direction = [&](size_t i, cuda_plan::ConvDirection d, decltype(rt.ops.conv_backward_data) call, size_t other) {
      if (!wanted(i)) return;
      grads[i] = out(in_shape(i));
      if (grads[i].numel() == 0) return;
      size_t bytes = 0;
      check_lib(rt.ops.conv_backward_workspace(l.conv, d, &bytes, ctx(g.numel())));
      Tensor ws = workspace(bytes);
      check_lib(call(l.conv, cfp(saved_input(other)), cfp(g), mfp(grads[i]), ws_ptr(ws), bytes, ctx(grads[i].numel())));
    };
    direction(0, cuda_plan::ConvDirection::BackwardData, rt.ops.conv_backward_data, 1);
    direction(1, cuda_plan::ConvDirection::BackwardFilter, rt.ops.conv_backward_filter, 0);
    if (wanted(2)) {
      const int64_t n = g.dim(0), m = g.dim(1), spatial = m * n > 0 ? g.numel() / (n * m) : 0;
      grads[2] = out(in_shape(2));
      if (m > 0) check(rt.ops.channel_grad_sum(n, m, spatial, cfp(g), mfp(grads[2]), ctx(m)), "bias gradient kernel launch");
    }
  }

  // ConvTranspose, Y = C^T X with C the convolution of the forward's plan (Y's shape to X's, the
  // same W): dX = C dY (that convolution's forward of dY), dW its backward-filter with dY as its
  // input and X as its output gradient, dB dY summed per output channel.
  void conv_transpose() {
    if (l.kind != LaunchKind::ConvTranspose) unsupported(l.reason);
    const Tensor& g = dy();
    if (wanted(0)) {
      grads[0] = out(in_shape(0));
      if (grads[0].numel() > 0) {
        size_t bytes = 0;
        check_lib(rt.ops.conv_workspace(l.conv, &bytes, ctx(grads[0].numel())));
        Tensor ws = workspace(bytes);
        check_lib(rt.ops.conv_forward(l.conv, cfp(g), cfp(saved_input(1)), mfp(grads[0]), ws_ptr(ws), bytes, ctx(grads[0].numel())));
      }
    }
    if (wanted(1)) {
      grads[1] = out(in_shape(1));
      if (grads[1].numel() > 0) {
        size_t bytes = 0;
        check_lib(rt.ops.conv_backward_workspace(l.conv, cuda_plan::ConvDirection::BackwardFilter, &bytes, ctx(g.numel())));
        Tensor ws = workspace(bytes);
        check_lib(rt.ops.conv_backward_filter(l.conv, cfp(g), cfp(saved_input(0)), mfp(grads[1]), ws_ptr(ws), bytes,
                                              ctx(grads[1].numel())));
      }
    }
    if (wanted(2)) {
      const int64_t n = g.dim(0), m = g.dim(1), spatial = m * n > 0 ? g.numel() / (n * m) : 0;
      grads[2] = out(in_shape(2));
      if (m > 0) check(rt.ops.channel_grad_sum(n, m, spatial, cfp(g), mfp(grads[2]), ctx(m)), "bias gradient kernel launch");
    }
  }

  // The forward GEMM of Gemm / MatMul as a request (packed operands), or Unsupported.
  cuda_plan::GemmRequest gemm_request() const {
    cuda_plan::GemmRequest r;
    const Shape& a = in_shape(0);
    const Shape& b = in_shape(1);
    if (node.op_type == "Gemm") {
      if (node.attr_float("alpha", 1.0f) != 1.0f || node.attr_float("beta", 1.0f) != 1.0f) unsupported("alpha or beta other than 1");
      if (a.size() != 2 || b.size() != 2) unsupported("Gemm operands must be 2-D");
      r.trans_a = node.attr_int("transA", 0) != 0;
      r.trans_b = node.attr_int("transB", 0) != 0;
      r.m = r.trans_a ? a[1] : a[0];
      r.k = r.trans_a ? a[0] : a[1];
      r.n = r.trans_b ? b[0] : b[1];
      return r;
    }
    if (a.size() < 2 || b.size() < 2) unsupported("1-D MatMul operands");
    r.k = a.back();
    r.n = b.back();
    if (b.size() == 2) {  // batch folded into M
      r.m = shape_numel(Shape(a.begin(), a.end() - 1));
      return r;
    }
    if (Shape(a.begin(), a.end() - 2) != Shape(b.begin(), b.end() - 2)) unsupported("MatMul with broadcast batch dimensions");
    r.m = a[a.size() - 2];
    r.batch = shape_numel(Shape(a.begin(), a.end() - 2));
    if (r.batch < 1) unsupported("empty MatMul batch");
    return r;
  }

  void gemm_grad(const cuda_plan::GemmGradRequest& gr, const Tensor& other, Tensor& result) {
    if (result.numel() == 0) return;
    const cuda_plan::GemmPlan p = cuda_plan::plan_gemm(gr.request);
    if (!p.use_cublaslt) unsupported(p.fallback_reason);
    const Tensor& g = dy();
    const Tensor& first = gr.grad_first ? g : other;
    const Tensor& second = gr.grad_first ? other : g;
    Tensor ws = workspace(p.workspace_bytes);
    check_lib(rt.ops.gemm(p, first.raw_data(), second.raw_data(), result.raw_data(), ws_ptr(ws), p.workspace_bytes, ctx(result.numel())));
  }

  void matmul() {
    const cuda_plan::GemmRequest f = gemm_request();
    const cuda_plan::MatmulGradRequests g = cuda_plan::plan_matmul_grad(f);
    if (wanted(0)) {
      grads[0] = out(in_shape(0));
      gemm_grad(g.da, saved_input(1), grads[0]);
    }
    if (wanted(1)) {
      grads[1] = out(in_shape(1));
      gemm_grad(g.db, saved_input(0), grads[1]);
    }
    if (node.op_type == "Gemm" && wanted(2)) grads[2] = sum_to(dy(), in_shape(2));
  }

  void pool() {
    if (l.kind != LaunchKind::Pool2d) unsupported(l.reason);
    if (!wanted(0)) return;
    grads[0] = out(in_shape(0));
    if (grads[0].numel() == 0) return;
    const float* x = l.pool_max ? cfp(saved_input(0)) : nullptr;
    check(rt.ops.pool2d_grad(l.pool_max, l.count_include_pad, l.pool, x, cfp(dy()), mfp(grads[0]), ctx(grads[0].numel())),
          "pool backward kernel launch");
  }

  // ReduceSum / ReduceMean / GlobalAveragePool: dY broadcast back over `reduced`, divided.
  void broadcast_back(const std::vector<bool>& reduced, bool mean) {
    if (!wanted(0)) return;
    const Shape& xs = in_shape(0);
    Shape kept = xs;
    int64_t count = 1;
    for (size_t d = 0; d < xs.size(); ++d)
      if (reduced[d]) {
        count *= xs[d];
        kept[d] = 1;
      }
    grads[0] = out(xs);
    if (grads[0].numel() == 0) return;
    const cuda::StridedView v = cuda_plan::make_broadcast_view(kept, xs);
    check(rt.ops.broadcast_divide(v, mean ? static_cast<float>(count) : 1.0f, cfp(dy()), mfp(grads[0]), grads[0].numel(),
                                  ctx(grads[0].numel())),
          "broadcast backward kernel launch");
  }

  std::vector<bool> reduce_axes() const {
    const size_t rank = in_shape(0).size();
    std::vector<int64_t> axes;
    if (node.has_attr("axes")) {
      axes = node.attr_ints("axes");
    } else if (call.present.size() > 1 && call.present[1]) {
      if (call.host_inputs.size() < 2 || !call.host_inputs[1]) unsupported("axes computed on the device");
      const Tensor& t = *call.host_inputs[1];
      for (int64_t i = 0; i < t.numel(); ++i) axes.push_back(static_cast<int64_t>(t.get_double(i)));
    }
    std::vector<bool> reduced(rank, false);
    if (axes.empty()) {
      if (node.attr_int("noop_with_empty_axes", 0) != 0) unsupported("noop_with_empty_axes");
      reduced.assign(rank, true);
      return reduced;
    }
    for (int64_t a : axes) {
      const int64_t ax = a < 0 ? a + static_cast<int64_t>(rank) : a;
      if (ax < 0 || ax >= static_cast<int64_t>(rank)) fail_input("{} (backward): axis {} out of range", node.label(), a);
      reduced[static_cast<size_t>(ax)] = true;
    }
    return reduced;
  }

  void global_max() {
    if (!wanted(0)) return;
    const Shape& xs = in_shape(0);
    if (xs.size() < 3 || xs.size() > static_cast<size_t>(cuda::kMaxRank)) unsupported("rank outside 3..8");
    grads[0] = out(xs);
    if (grads[0].numel() == 0) return;
    int64_t dims[cuda::kMaxRank];
    bool reduced[cuda::kMaxRank];
    for (size_t d = 0; d < xs.size(); ++d) {
      dims[d] = xs[d];
      reduced[d] = d >= 2;
    }
    check(rt.ops.reduce_extreme_grad(static_cast<int>(xs.size()), dims, reduced, cfp(saved_input(0)), nullptr, cfp(dy()),
                                     mfp(grads[0]), xs[0] * xs[1], ctx(xs[0] * xs[1])),
          "global max pool backward kernel launch");
  }

  void softmax() {
    if (l.kind != LaunchKind::Softmax) unsupported(l.reason);
    if (!wanted(0)) return;
    grads[0] = out(in_shape(0));
    if (grads[0].numel() == 0) return;
    check(rt.ops.softmax_grad(l.log_softmax, cfp(saved_output(0)), cfp(dy()), mfp(grads[0]), l.axis.outer, l.axis.n, l.axis.inner,
                              ctx(l.axis.outer * l.axis.inner)),
          "softmax backward kernel launch");
  }

  // LayerNormalization over the last axis (the forward planner's case): the row statistics are
  // recomputed by the forward body (the engine keeps X and Scale, as the CPU's), then dX per row
  // and dScale / dBias per column.
  void layer_norm() {
    if (l.kind != LaunchKind::LayerNorm) unsupported(l.reason);
    const bool need_x = wanted(0), need_s = wanted(1), need_b = wanted(2);
    if (!need_x && !need_s && !need_b) return;
    if (call.grad_outputs.empty() || !call.grad_outputs[0].defined()) unsupported("no gradient reached Y");
    const int64_t rows = l.axis.outer, n = l.axis.n;
    const Tensor& x = saved_input(0);
    const Tensor& scale = saved_input(1);
    Tensor y = out(in_shape(0)), mean = out({rows}), inv = out({rows});
    if (rows > 0 && n > 0)
      check(rt.ops.layer_norm(cfp(x), cfp(scale), nullptr, mfp(y), mfp(mean), mfp(inv), rows, n, l.epsilon, ctx(rows)),
            "layer norm statistics kernel launch");
    if (need_x) {
      grads[0] = out(in_shape(0));
      if (grads[0].numel() > 0)
        check(rt.ops.layer_norm_grad_x(cfp(x), cfp(mean), cfp(inv), cfp(scale), cfp(dy()), mfp(grads[0]), rows, n, ctx(rows)),
              "layer norm backward kernel launch");
    }
    if (!need_s && !need_b) return;
    if (need_s) grads[1] = out(in_shape(1));
    if (need_b) grads[2] = out(in_shape(2));
    if (n > 0)
      check(rt.ops.layer_norm_grad_params(cfp(x), cfp(mean), cfp(inv), cfp(dy()), need_s ? mfp(grads[1]) : nullptr,
                                          need_b ? mfp(grads[2]) : nullptr, rows, n, ctx(n)),
            "layer norm parameter backward kernel launch");
  }

  // Gather: every dX element sums the dY rows whose index names it, in index order (no atomics),
  // through an inverse index built on the host from the indices (a counting sort: row offsets and
  // the positions grouped by row), so the work is linear in the indices and the table, as the CPU's
  // scatter (an embedding table's backward).
  void gather() {
    if (l.kind != LaunchKind::Gather) unsupported(l.reason);
    if (!wanted(0)) return;
    const int64_t rows = l.axis.n;
    std::vector<int64_t> idx = host_ints(1);
    const int64_t count = static_cast<int64_t>(idx.size());
    Tensor offsets(DType::Int64, {rows + 1}), positions(DType::Int64, {std::max<int64_t>(count, 1)});
    int64_t* off = offsets.data<int64_t>();
    std::fill(off, off + rows + 1, 0);
    for (int64_t& v : idx) {
      if (v < 0) v += rows;
      if (v >= 0 && v < rows) ++off[v + 1];  // out of range: the forward reported it
    }
    for (int64_t a = 0; a < rows; ++a) off[a + 1] += off[a];
    std::vector<int64_t> next(off, off + rows);
    for (int64_t k = 0; k < count; ++k)
      if (idx[static_cast<size_t>(k)] >= 0 && idx[static_cast<size_t>(k)] < rows)
        positions.data<int64_t>()[next[static_cast<size_t>(idx[static_cast<size_t>(k)])]++] = k;
    const Tensor d_off = rt::gpu::to_device(offsets, rt.alloc, rt.backend, rt.stream, node.name, node.op_type);
    const Tensor d_pos = rt::gpu::to_device(positions, rt.alloc, rt.backend, rt.stream, node.name, node.op_type);
    // The host index arrays die on return: the copies must have read them (before the launch, so
    // the host does not wait for the kernel too).
    check(rt.backend.synchronize(rt.stream), "gather backward index upload");
    grads[0] = out(in_shape(0));
    if (grads[0].numel() > 0)
      check(rt.ops.gather_grad_indexed(static_cast<const int64_t*>(d_off.raw_data()), static_cast<const int64_t*>(d_pos.raw_data()),
                                       cfp(dy()), mfp(grads[0]), l.axis.outer, rows, l.axis.inner, count, ctx(grads[0].numel())),
            "gather backward kernel launch");
  }

  bool present(size_t i) const { return i < call.present.size() && call.present[i]; }

  // Integer input i (starts, pads, ...) on the host: the constant the engine knows, else the kept
  // device value downloaded (a few numbers).
  std::vector<int64_t> host_ints(size_t i) const {
    const Tensor* h = i < call.host_inputs.size() ? call.host_inputs[i] : nullptr;
    Tensor down;
    if (!h) {
      down = rt::gpu::to_host(saved_input(i), rt.backend, rt.stream, node.name, node.op_type);
      h = &down;
    }
    if (h->dtype() != DType::Int64 && h->dtype() != DType::Int32)
      fail_input("{} (backward): input {} must be int64 or int32, got {}", node.label(), i, dtype_name(h->dtype()));
    std::vector<int64_t> v(static_cast<size_t>(h->numel()));
    for (int64_t k = 0; k < h->numel(); ++k) v[static_cast<size_t>(k)] = static_cast<int64_t>(h->get_double(k));
    return v;
  }

  // Slice: dY back into the positions the slice read, zeros elsewhere.
  void slice() {
    if (!wanted(0)) return;
    std::vector<int64_t> starts, ends, axes, steps;
    if (opset < 10) {
      starts = node.attr_ints("starts");
      ends = node.attr_ints("ends");
      axes = node.attr_ints("axes");
    } else {
      starts = host_ints(1);
      ends = host_ints(2);
      if (present(3)) axes = host_ints(3);
      if (present(4)) steps = host_ints(4);
    }
    const cuda::SliceGeom g = cuda_plan::make_slice_grad_geom(in_shape(0), starts, ends, axes, steps);
    grads[0] = out(in_shape(0));
    if (grads[0].numel() > 0)
      check(rt.ops.slice_grad(g, cfp(dy()), mfp(grads[0]), grads[0].numel(), ctx(grads[0].numel())), "slice backward kernel launch");
  }

  // Pad in constant mode: dX is the window of dY that X occupies.
  void pad() {
    if (!wanted(0)) return;
    if (opset < 2) unsupported("Pad-1's paddings attribute");
    const std::string mode = node.attr_string("mode", "constant");
    if (mode != "constant") unsupported("Pad mode '" + mode + "'");
    if (present(3)) unsupported("Pad with axes");
    const std::vector<int64_t> pads = opset < 11 ? node.attr_ints("pads") : host_ints(1);
    for (int64_t p : pads)
      if (p < 0) unsupported("negative pads (cropping)");
    const cuda::StridedView v = cuda_plan::make_pad_grad_view(in_shape(0), pads);
    grads[0] = out(in_shape(0));
    if (grads[0].numel() > 0)
      check(rt.ops.strided_copy(v, cfp(dy()), mfp(grads[0]), grads[0].numel(), ctx(grads[0].numel())), "pad backward kernel launch");
  }

  // PRelu: dX per element, and the slope's per-element term summed to the slope's shape.
  void prelu() {
    const bool need_x = wanted(0), need_s = wanted(1);
    if (!need_x && !need_s) return;
    Shape joined;
    const cuda::Broadcast2 bc = cuda_plan::make_broadcast2(in_shape(0), in_shape(1), &joined);
    if (joined != in_shape(0)) unsupported("slope that does not broadcast to X's shape");
    const int64_t n = shape_numel(in_shape(0));
    Tensor term = need_s ? out(in_shape(0)) : Tensor();
    if (need_x) grads[0] = out(in_shape(0));
    if (n > 0)
      check(rt.ops.prelu_grad(bc, cfp(saved_input(0)), cfp(saved_input(1)), cfp(dy()), need_x ? mfp(grads[0]) : nullptr,
                              need_s ? mfp(term) : nullptr, n, ctx(n)),
            "PRelu backward kernel launch");
    if (need_s) grads[1] = sum_to(term, in_shape(1));
  }

  // Where: dY where the condition picks the branch, summed to the branch's shape.
  void where() {
    if (!wanted(1) && !wanted(2)) return;
    const Tensor& cond = saved_input(0);
    if (cond.dtype() != DType::Bool) unsupported("a condition that is not bool");
    const Shape& ys = dy().shape();
    Shape joined;
    const cuda::Broadcast2 bc = cuda_plan::make_broadcast2(in_shape(0), ys, &joined);
    if (joined != ys) fail_internal("{} (backward): the condition does not broadcast to Y", node.label());
    const int64_t n = shape_numel(ys);
    for (size_t i : {size_t{1}, size_t{2}}) {
      if (!wanted(i)) continue;
      Tensor masked = out(ys);
      if (n > 0)
        check(rt.ops.where_grad(bc, static_cast<const bool*>(cond.raw_data()), cfp(dy()), mfp(masked), n, i == 1, ctx(n)),
              "Where backward kernel launch");
      grads[i] = sum_to(masked, in_shape(i));
    }
  }

  // Resize (2-D nearest / linear as the forward planner takes it): every dX element sums the dY
  // taps that read it (Resize2dGradBody; no atomics).
  void resize() {
    if (l.kind != LaunchKind::Resize2d) unsupported(l.reason);
    if (!wanted(0)) return;
    grads[0] = out(in_shape(0));
    if (grads[0].numel() > 0)
      check(rt.ops.resize2d_grad(l.resize, cfp(dy()), mfp(grads[0]), ctx(grads[0].numel())), "resize backward kernel launch");
  }

  // BatchNormalization from the training forward's device stash (mean, inverse std): per-channel
  // sums of dY and dY (x - mean), then dX (batch statistics in training, a frozen affine map in eval).
  void batch_norm() {
    const bool need_x = wanted(0), need_s = wanted(1), need_b = wanted(2);
    if (!need_x && !need_s && !need_b) return;
    if (call.stash.size() != 2) unsupported("the forward kept no device statistics");
    if (call.grad_outputs.empty() || !call.grad_outputs[0].defined()) unsupported("no gradient reached Y");
    const Shape& xs = in_shape(0);
    if (xs.size() < 2) unsupported("an input of rank < 2");
    const int64_t N = xs[0], F = xs[1], S = N * F > 0 ? shape_numel(xs) / (N * F) : 0;
    for (size_t i = 1; i <= 2; ++i)
      if (shape_numel(in_shape(i)) != F) unsupported("parameters that are not one per channel");
    const Tensor& x = saved_input(0);
    const Tensor& mean = call.stash[0];
    const Tensor& inv = call.stash[1];
    Tensor sums = device_empty(rt.alloc, DType::Float64, {std::max<int64_t>(2 * F, 1)}, rt.stream, node.name, node.op_type);
    if (need_s) grads[1] = out(in_shape(1));
    if (need_b) grads[2] = out(in_shape(2));
    if ((need_s || need_b || (need_x && call.training)) && F > 0)
      check(rt.ops.batch_norm_grad_sums(cfp(x), cfp(mean), cfp(inv), cfp(dy()), static_cast<double*>(sums.raw_data()),
                                        need_s ? mfp(grads[1]) : nullptr, need_b ? mfp(grads[2]) : nullptr, N, F, S, ctx(F)),
            "batch norm backward sums kernel launch");
    if (!need_x) return;
    grads[0] = out(xs);
    if (grads[0].numel() > 0)
      check(rt.ops.batch_norm_grad_x(call.training, cfp(x), cfp(mean), cfp(inv), cfp(saved_input(1)), cfp(dy()),
                                     static_cast<const double*>(sums.raw_data()), mfp(grads[0]), N, F, S, ctx(grads[0].numel())),
            "batch norm backward kernel launch");
  }

  void clip() {
    if (!wanted(0)) return;
    float lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
    if (opset < 11) {
      lo = node.attr_float("min", lo);
      hi = node.attr_float("max", hi);
    } else {
      for (size_t i : {size_t{1}, size_t{2}}) {
        if (i >= call.present.size() || !call.present[i]) continue;
        if (i >= call.host_inputs.size() || !call.host_inputs[i]) unsupported("Clip bounds computed on the device");
        const Tensor& b = *call.host_inputs[i];
        if (b.numel() != 1) fail_input("{} (backward): {} must be a scalar", node.label(), i == 1 ? "min" : "max");
        (i == 1 ? lo : hi) = static_cast<float>(b.get_double(0));
      }
    }
    grads[0] = out(in_shape(0));
    if (grads[0].numel() == 0) return;
    check(rt.ops.clip_grad(cfp(saved_input(0)), cfp(dy()), mfp(grads[0]), grads[0].numel(), lo, hi, ctx(grads[0].numel())),
          "clip backward kernel launch");
  }

  void transpose() {
    if (!wanted(0)) return;
    const std::vector<int64_t> inverse = cuda_plan::inverse_permutation(node.attr_ints("perm"), in_shape(0).size());
    Shape back;
    const cuda::StridedView v = cuda_plan::make_transpose_view(dy().shape(), inverse, &back);
    if (back != in_shape(0)) fail_internal("{} (backward): transposed gradient has shape {}", node.label(), shape_str(back));
    grads[0] = out(back);
    if (grads[0].numel() > 0)
      check(rt.ops.strided_copy(v, cfp(dy()), mfp(grads[0]), grads[0].numel(), ctx(grads[0].numel())), "transpose kernel launch");
  }

  void reshape_like() {
    if (!wanted(0)) return;
    grads[0] = out(in_shape(0));
    if (grads[0].numel() != dy().numel()) fail_internal("{} (backward): gradient size differs from the input's", node.label());
    if (grads[0].numel() > 0)
      check(rt.ops.unary(cuda::UnaryOp::Identity, 0, 0, cfp(dy()), mfp(grads[0]), grads[0].numel(), ctx(grads[0].numel())),
            "copy kernel launch");
  }

  void unary() {
    if (!wanted(0)) return;
    if (l.unary == cuda::UnaryOp::Neg) {  // dX = -dY: the engine keeps neither X nor Y for it
      grads[0] = out(in_shape(0));
      if (grads[0].numel() > 0)
        check(rt.ops.unary(cuda::UnaryOp::Neg, 0, 0, cfp(dy()), mfp(grads[0]), grads[0].numel(), ctx(grads[0].numel())),
              "negation kernel launch");
      return;
    }
    // The body reads X and Y; each derivative uses the one the CPU engine keeps for the op, so the
    // other pointer may stand in for a value that was not kept.
    const bool have_x = !call.inputs.empty() && call.inputs[0].defined();
    const bool have_y = !call.outputs.empty() && call.outputs[0].defined();
    if (!have_x && !have_y) unsupported("neither X nor Y was kept by the forward");
    const float* x = cfp(have_x ? call.inputs[0] : call.outputs[0]);
    const float* y = cfp(have_y ? call.outputs[0] : call.inputs[0]);
    grads[0] = out(in_shape(0));
    if (grads[0].numel() > 0)
      check(rt.ops.unary_grad(l.unary, l.alpha, x, y, cfp(dy()), mfp(grads[0]), grads[0].numel(), ctx(grads[0].numel())),
            "unary backward kernel launch");
  }

  std::vector<Tensor> run() {
    const std::string& op = node.op_type;
    grads.assign(call.input_shapes.size(), Tensor());
    // The bodies are FP32: anything else (float64 gradient checks, FP16 values) is the CPU's.
    for (const auto* list : {&call.inputs, &call.outputs, &call.grad_outputs})
      for (const Tensor& t : *list)
        if (t.defined() && (t.dtype() == DType::Float64 || t.dtype() == DType::Float16 || t.dtype() == DType::BFloat16))
          unsupported(fmt::format("{} values (the device backward is FP32)", dtype_name(t.dtype())));
    if (node.domain == rt::cpu::kFakeQuantDomain && op == rt::cpu::kFakeQuantOp) fake_quant();
    else if (node.domain == rt::cpu::kFakeQuantDomain && op == rt::cpu::kFakeQuantBiasOp) reshape_like();  // passes dY
    else if (!node.domain.empty()) unsupported("no device backward for " + node.domain + "::" + op + " yet");
    else if (is_reshape_like(op)) reshape_like();
    else if (op == "Div") divide();
    else if (op == "Pow") power();
    else if (op == "Concat") concat();
    else if (op == "Add" || op == "Sub" || op == "Mul") arithmetic();
    else if (op == "Conv") conv();
    else if (op == "ConvTranspose") conv_transpose();
    else if (op == "Gemm" || op == "MatMul") matmul();
    else if (op == "MaxPool" || op == "AveragePool") pool();
    else if (op == "GlobalAveragePool") broadcast_back(spatial_dims(), true);
    else if (op == "GlobalMaxPool") global_max();
    else if (op == "ReduceSum" || op == "ReduceMean") broadcast_back(reduce_axes(), op == "ReduceMean");
    else if (op == "Softmax" || op == "LogSoftmax") softmax();
    else if (op == "Clip") clip();
    else if (op == "LayerNormalization") layer_norm();
    else if (op == "Gather") gather();
    else if (op == "Slice") slice();
    else if (op == "Pad") pad();
    else if (op == "Expand") {
      if (wanted(0)) grads[0] = sum_to(dy(), in_shape(0));
    } else if (op == "PRelu") prelu();
    else if (op == "Where") where();
    else if (op == "Resize") resize();
    else if (op == "BatchNormalization") batch_norm();
    else if (op == "Transpose") transpose();
    else if (l.kind == LaunchKind::Unary) unary();
    else unsupported("no device backward for " + op + " yet");
    return grads;
  }
  std::vector<bool> spatial_dims() const {
    std::vector<bool> r(in_shape(0).size(), false);
    for (size_t d = 2; d < r.size(); ++d) r[d] = true;
    return r;
  }
};

}  // namespace

BatchNormForward run_batchnorm_forward(const ir::Node& node, bool training, const std::vector<Tensor>& ins,
                                       bool statistics_wanted, KernelRuntime& rt) {
  // (Before opset 9 a per-element layout is allowed: its parameter counts differ from C below.)
  auto unsupported = [&](const std::string& why) { fail_unsupported("{}: {}", node.label(), why); };
  if (statistics_wanted) unsupported("its statistics outputs are read");
  if (ins.size() < 5) unsupported("fewer than five inputs");
  for (const Tensor& t : ins)
    if (!t.defined() || t.device() != Device::CUDA || t.dtype() != DType::Float32) unsupported("an input that is not FP32 on the device");
  const Shape& xs = ins[0].shape();
  if (xs.size() < 2) unsupported("an input of rank < 2");
  const int64_t N = xs[0], F = xs[1], S = N * F > 0 ? shape_numel(xs) / (N * F) : 0;
  for (size_t i = 1; i <= 4; ++i)
    if (ins[i].numel() != F) unsupported("parameters that are not one per channel");
  const float eps = node.attr_float("epsilon", 1e-5f), momentum = node.attr_float("momentum", 0.9f);
  auto check = [&](int code, const char* what) { rt::gpu::check_node_launch(rt, node, code, what); };
  auto f32 = [](const Tensor& t) { return static_cast<const float*>(t.raw_data()); };
  auto mf32 = [](Tensor& t) { return static_cast<float*>(t.raw_data()); };
  BatchNormForward r;
  Tensor mean = rt::gpu::node_output(rt, node, DType::Float32, {F}), inv = rt::gpu::node_output(rt, node, DType::Float32, {F});
  if (training) {
    if (N * S <= 1)
      fail_input("{}: training-mode BatchNormalization needs more than one value per channel, got input shape {}", node.label(),
                 shape_str(xs));
    r.new_mean = rt::gpu::node_output(rt, node, DType::Float32, ins[3].shape());
    r.new_var = rt::gpu::node_output(rt, node, DType::Float32, ins[4].shape());
    for (const auto& [dst, src] : {std::pair<Tensor*, const Tensor*>{&r.new_mean, &ins[3]}, {&r.new_var, &ins[4]}})
      if (F > 0) check(rt.backend.copy(dst->raw_data(), src->raw_data(), src->nbytes(), rt::gpu::CopyKind::DeviceToDevice, rt.stream),
                       "running statistics copy");
    if (F > 0)
      check(rt.ops.batch_norm_stats(f32(ins[0]), nullptr, nullptr, mf32(mean), mf32(inv), N, F, S, eps, mf32(r.new_mean),
                                    mf32(r.new_var), momentum, rt::gpu::node_launch_ctx(rt, F)),
            "batch norm statistics kernel launch");
  } else if (F > 0) {
    check(rt.ops.batch_norm_stats(f32(ins[0]), f32(ins[3]), f32(ins[4]), mf32(mean), mf32(inv), N, F, S, eps, nullptr, nullptr,
                                  momentum, rt::gpu::node_launch_ctx(rt, F)),
          "batch norm statistics kernel launch");
  }
  r.y = rt::gpu::node_output(rt, node, DType::Float32, xs);
  if (r.y.numel() > 0)
    check(rt.ops.batch_norm_apply(f32(ins[0]), f32(ins[1]), f32(ins[2]), f32(mean), f32(inv), mf32(r.y), N, F, S,
                                  rt::gpu::node_launch_ctx(rt, r.y.numel())),
          "batch norm kernel launch");
  r.stash = {std::move(mean), std::move(inv)};
  return r;
}

std::vector<Tensor> run_backward_node(const ir::Node& node, int opset, const BackwardCall& call, KernelRuntime& rt) {
  auto device_only = [&](const std::vector<Tensor>& ts, const char* what) {
    for (const Tensor& t : ts)
      if (t.defined() && t.device() != Device::CUDA)
        fail_internal("{} (backward): {} given on the {}; copies must be explicit", node.label(), what, device_name(t.device()));
  };
  device_only(call.inputs, "an input");
  device_only(call.outputs, "an output");
  device_only(call.grad_outputs, "an output gradient");
  device_only(call.stash, "a stashed value");
  if (call.present.size() != call.input_shapes.size())
    fail_internal("{} (backward): {} presence flags for {} input shapes", node.label(), call.present.size(), call.input_shapes.size());
  // The forward's plan gives the geometry (pooling windows, softmax axis, the cuDNN plan, the
  // unary op code) exactly as the forward ran it.
  std::vector<DType> dtypes(call.input_shapes.size(), DType::Undefined);
  std::vector<const Tensor*> known(call.input_shapes.size(), nullptr);
  for (size_t i = 0; i < dtypes.size(); ++i) {
    if (!call.present[i]) continue;
    known[i] = i < call.host_inputs.size() ? call.host_inputs[i] : nullptr;
    dtypes[i] = known[i] ? known[i]->dtype() : (i < call.inputs.size() && call.inputs[i].defined() ? call.inputs[i].dtype() : DType::Float32);
  }
  Backward b{node, opset, call, rt, cuda_plan::plan_node(node, opset, call.input_shapes, dtypes, known), {}};
  return b.run();
}

}  // namespace mpq::train::gpu
