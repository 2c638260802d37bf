#include "runtime/cuda/node_plan.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "runtime/shape_rules.h"

namespace mpq::rt::cuda_plan {

const char* launch_kind_name(LaunchKind k) {
  switch (k) {
    case LaunchKind::Fallback: return "cpu-fallback";
    case LaunchKind::Unary: return "unary";
    case LaunchKind::Binary: return "binary";
    case LaunchKind::Reduce: return "reduce";
    case LaunchKind::Softmax: return "softmax";
    case LaunchKind::LayerNorm: return "layer-norm";
    case LaunchKind::Pool2d: return "pool2d";
    case LaunchKind::Resize2d: return "resize2d";
    case LaunchKind::Gather: return "gather";
    case LaunchKind::StridedCopy: return "strided-copy";
    case LaunchKind::Concat: return "concat";
    case LaunchKind::Quantize: return "quantize";
    case LaunchKind::Dequantize: return "dequantize";
    case LaunchKind::FakeQuant: return "fake-quant";
    case LaunchKind::Gemm: return "cublaslt-gemm";
    case LaunchKind::Conv: return "cudnn-conv";
    case LaunchKind::ConvTranspose: return "cudnn-conv-transpose";
    case LaunchKind::Cast: return "cast";
    case LaunchKind::FakeQuantBias: return "fake-quant-bias";
  }
  return "?";
}

namespace {

NodeLaunch fallback(std::string why) {
  NodeLaunch l;
  l.reason = std::move(why);
  return l;
}

int64_t norm_axis(int64_t axis, size_t rank) { return axis < 0 ? axis + static_cast<int64_t>(rank) : axis; }

std::vector<int64_t> ints_of(const Tensor* t) {
  std::vector<int64_t> v;
  if (t)
    for (int64_t i = 0; i < t->numel(); ++i) v.push_back(static_cast<int64_t>(t->get_double(i)));
  return v;
}

const std::map<std::string, cuda::UnaryOp>& unary_ops() {
  static const std::map<std::string, cuda::UnaryOp> m = {
      {"Relu", cuda::UnaryOp::Relu}, {"Sigmoid", cuda::UnaryOp::Sigmoid},       {"Tanh", cuda::UnaryOp::Tanh},
      {"Exp", cuda::UnaryOp::Exp},   {"Log", cuda::UnaryOp::Log},               {"Neg", cuda::UnaryOp::Neg},
      {"Abs", cuda::UnaryOp::Abs},   {"Sqrt", cuda::UnaryOp::Sqrt},             {"Erf", cuda::UnaryOp::Erf},
      {"Gelu", cuda::UnaryOp::Gelu}, {"Reciprocal", cuda::UnaryOp::Reciprocal}, {"Identity", cuda::UnaryOp::Identity},
      {"HardSigmoid", cuda::UnaryOp::HardSigmoid}, {"HardSwish", cuda::UnaryOp::HardSwish}};
  return m;
}

const std::map<std::string, cuda::BinaryOp>& binary_ops() {
  static const std::map<std::string, cuda::BinaryOp> m = {{"Add", cuda::BinaryOp::Add}, {"Sub", cuda::BinaryOp::Sub},
                                                          {"Mul", cuda::BinaryOp::Mul}, {"Div", cuda::BinaryOp::Div},
                                                          {"Max", cuda::BinaryOp::Max}, {"Min", cuda::BinaryOp::Min},
                                                          {"Pow", cuda::BinaryOp::Pow}};
  return m;
}

const std::map<std::string, cuda::ReduceOp>& reduce_ops() {
  static const std::map<std::string, cuda::ReduceOp> m = {{"ReduceSum", cuda::ReduceOp::Sum},
                                                          {"ReduceMean", cuda::ReduceOp::Mean},
                                                          {"ReduceMax", cuda::ReduceOp::Max},
                                                          {"ReduceMin", cuda::ReduceOp::Min}};
  return m;
}

NodeLaunch plan_quant(const ir::Node& node, const std::vector<Shape>& shapes, LaunchKind kind) {
  NodeLaunch l;
  l.kind = kind;
  l.out_shape = shapes[0];
  if (node.attr_int("block_size", 0) != 0) return fallback("blocked quantization (block_size)");
  const Shape& s = shapes.size() > 1 ? shapes[1] : Shape{};
  const int64_t n = shape_numel(s);
  l.quant_channels = n;
  if (n > 1) {
    if (shapes[0].empty()) return fallback("per-axis scale on a scalar");
    const int64_t ax = norm_axis(node.attr_int("axis", 1), shapes[0].size());
    if (ax < 0 || ax >= static_cast<int64_t>(shapes[0].size()) || shapes[0][ax] != n)
      fail_input("{}: scale of {} values does not match axis {} of {}", node.label(), n, ax, shape_str(shapes[0]));
    l.axis = axis_view(shapes[0], ax);
  } else {
    l.axis = AxisView{shape_numel(shapes[0]), 1, 1};
  }
  return l;
}

// Reshape / Flatten / Squeeze / Unsqueeze: sets *out and returns "", or returns why the node cannot
// be planned: it needs a value not known at planning time, or the CPU kernel would reject it (the
// CPU kernel then runs and reports the error; the rules are shared, runtime/shape_rules.h).
std::string reshaped_shape(const ir::Node& node, int opset, const Shape& in, const Tensor* second, Shape* out) {
  const std::string& op = node.op_type;
  if (op == "Flatten") return flatten_shape(in, node.attr_int("axis", 1), out);
  if (op == "Reshape") {
    if (opset >= 5 && !second) return "shape not constant";
    const bool allowzero = opset >= 14 && node.attr_int("allowzero", 0) != 0;
    return reshape_shape(in, opset < 5 ? node.attr_ints("shape") : ints_of(second), allowzero, out);
  }
  if (opset >= 13 && !second && node.num_inputs() > 1 && node.input(1)) return "axes not constant";
  const std::vector<int64_t> axes = opset >= 13 ? ints_of(second) : node.attr_ints("axes");
  return op == "Squeeze" ? squeeze_shape(in, axes, out) : unsqueeze_shape(in, axes, out);
}

}  // namespace

NodeLaunch plan_node(const ir::Node& node, int opset, const std::vector<Shape>& shapes, const std::vector<DType>& dtypes,
                     const std::vector<const Tensor*>& inputs, const PlanOptions& options) {
  const std::string& op = node.op_type;
  const bool mpq_domain = node.domain == "mpq";
  if (!node.domain.empty() && !mpq_domain) return fallback("domain '" + node.domain + "'");
  if (shapes.empty()) return fallback("no inputs");
  if (op == "Cast" && !mpq_domain) {
    auto is_float = [](DType t) { return t == DType::Float32 || t == DType::Float16 || t == DType::BFloat16; };
    const ir::Attribute* to = node.attr("to");
    if (!to || to->type != ir::AttrType::Int) return fallback("Cast without an integer 'to'");
    const DType target = static_cast<DType>(to->i);
    if (!is_float(dtypes[0]) || !is_float(target)) return fallback("Cast other than between FP32, FP16 and BF16");
    NodeLaunch c;
    c.kind = LaunchKind::Cast;
    c.cast_to = target;
    c.out_shape = shapes[0];
    return c;
  }
  // The bodies are FP32 (Q/DQ also read or write 8-bit integers).
  const bool q_in = op == "DequantizeLinear";
  if (!q_in && dtypes[0] != DType::Float32) return fallback(std::string("input type ") + dtype_name(dtypes[0]));
  for (const Shape& s : shapes)
    if (s.size() > static_cast<size_t>(cuda::kMaxRank)) return fallback("rank above 8");
  auto input = [&](size_t i) { return i < inputs.size() ? inputs[i] : nullptr; };

  NodeLaunch l;
  if (auto u = unary_ops().find(op); u != unary_ops().end() && !mpq_domain) {
    if (op == "Gelu" && node.attr_string("approximate", "none") != "none") return fallback("Gelu approximate=tanh");
    l.kind = LaunchKind::Unary;
    l.unary = u->second;
    if (op == "HardSigmoid") {
      l.alpha = node.attr_float("alpha", 0.2f);
      l.beta = node.attr_float("beta", 0.5f);
    } else if (op == "HardSwish") {
      if (opset < 14) return fallback("HardSwish before opset 14");
      l.alpha = 1.0f / 6.0f;
      l.beta = 0.5f;
    }
    l.out_shape = shapes[0];
    return l;
  }
  if (auto b = binary_ops().find(op); b != binary_ops().end() && !mpq_domain) {
    if (shapes.size() != 2) return fallback("variadic form with " + std::to_string(shapes.size()) + " inputs");
    if (dtypes[1] != DType::Float32) return fallback("mixed input types");
    l.kind = LaunchKind::Binary;
    l.binary = b->second;
    l.broadcast = make_broadcast2(shapes[0], shapes[1], &l.out_shape);
    return l;
  }
  if (auto r = reduce_ops().find(op); r != reduce_ops().end() && !mpq_domain) {
    std::vector<int64_t> axes = node.attr_ints("axes");
    if ((op == "ReduceSum" && opset >= 13) || opset >= 18) {
      if (shapes.size() > 1 && dtypes[1] != DType::Undefined) {
        if (!input(1)) return fallback("axes not constant");
        axes = ints_of(input(1));
      }
    }
    if (axes.size() != 1) return fallback(axes.empty() ? "reduction over all axes" : "reduction over several axes");
    const int64_t ax = norm_axis(axes[0], shapes[0].size());
    l.kind = LaunchKind::Reduce;
    l.reduce = r->second;
    l.axis = axis_view(shapes[0], ax);
    l.out_shape = shapes[0];
    if (node.attr_int("keepdims", 1)) l.out_shape[ax] = 1;
    else l.out_shape.erase(l.out_shape.begin() + ax);
    return l;
  }
  // Shape-only ops: the same elements in the same order under a new shape. The CPU kernels return
  // views; here one device copy (the identity body) keeps every device tensor owning its buffer,
  // and it is far cheaper than the round trip through the host a fallback costs.
  if (!mpq_domain && (op == "Flatten" || op == "Reshape" || op == "Squeeze" || op == "Unsqueeze")) {
    const std::string why = reshaped_shape(node, opset, shapes[0], input(1), &l.out_shape);
    if (!why.empty()) return fallback(op + ": " + why);
    l.kind = LaunchKind::Unary;
    l.unary = cuda::UnaryOp::Identity;
    return l;
  }
  // Global pooling: one reduction over the flattened spatial block of each (n, c) row.
  if (!mpq_domain && (op == "GlobalAveragePool" || op == "GlobalMaxPool")) {
    if (shapes[0].size() < 3) return fallback("rank below 3");
    l.kind = LaunchKind::Reduce;
    l.reduce = op == "GlobalAveragePool" ? cuda::ReduceOp::Mean : cuda::ReduceOp::Max;
    l.axis = AxisView{shapes[0][0] * shapes[0][1], shape_numel(shapes[0]) / std::max<int64_t>(1, shapes[0][0] * shapes[0][1]), 1};
    l.out_shape = shapes[0];
    std::fill(l.out_shape.begin() + 2, l.out_shape.end(), 1);
    return l;
  }
  if (op == "Softmax" || op == "LogSoftmax") {
    if (opset < 13) return fallback("opset < 13 softmax (flattened trailing block)");
    l.kind = LaunchKind::Softmax;
    l.log_softmax = op == "LogSoftmax";
    l.axis = axis_view(shapes[0], node.attr_int("axis", -1));
    l.out_shape = shapes[0];
    return l;
  }
  if (op == "LayerNormalization") {
    const int64_t ax = norm_axis(node.attr_int("axis", -1), shapes[0].size());
    if (ax != static_cast<int64_t>(shapes[0].size()) - 1) return fallback("normalization over more than the last axis");
    if (shapes.size() < 2 || shapes[1] != Shape{shapes[0].back()}) return fallback("scale not of the last axis' size");
    if (shapes.size() > 2 && dtypes[2] != DType::Undefined && shapes[2] != Shape{shapes[0].back()})
      return fallback("bias not of the last axis' size");
    if (node.attr_int("stash_type", 1) != 1) return fallback("stash_type other than float");
    l.kind = LaunchKind::LayerNorm;
    l.axis = AxisView{shape_numel(shapes[0]) / shapes[0].back(), shapes[0].back(), 1};
    l.epsilon = node.attr_float("epsilon", 1e-5f);
    l.out_shape = shapes[0];
    return l;
  }
  if (op == "MaxPool" || op == "AveragePool") {
    if (shapes[0].size() != 4) return fallback("pooling that is not 2-D");
    if (node.attr_string("auto_pad", "NOTSET") != "NOTSET") return fallback("auto_pad");
    if (node.num_outputs() > 1 && node.output(1)) return fallback("MaxPool indices output");
    if (op == "AveragePool" && node.has_attr("dilations")) return fallback("AveragePool dilations");
    l.kind = LaunchKind::Pool2d;
    l.pool_max = op == "MaxPool";
    l.count_include_pad = node.attr_int("count_include_pad", 0) != 0;
    l.pool = make_pool2d_geom(shapes[0], node.attr_ints("kernel_shape"), node.attr_ints("strides"), node.attr_ints("dilations"),
                              node.attr_ints("pads"), node.attr_int("ceil_mode", 0) != 0);
    l.out_shape = {shapes[0][0], shapes[0][1], l.pool.oh, l.pool.ow};
    return l;
  }
  if (op == "Resize") {
    if (opset < 13) return fallback("Resize before opset 13");
    if (shapes[0].size() != 4) return fallback("Resize of a tensor that is not 4-D");
    if (node.has_attr("axes") || node.attr_int("antialias", 0) != 0) return fallback("Resize axes/antialias");
    const std::string mode = node.attr_string("mode", "nearest");
    if (mode != "nearest" && mode != "linear") return fallback("Resize mode " + mode);
    static const std::map<std::string, cuda::ResizeCoord> coords = {
        {"half_pixel", cuda::ResizeCoord::HalfPixel}, {"pytorch_half_pixel", cuda::ResizeCoord::PytorchHalfPixel},
        {"align_corners", cuda::ResizeCoord::AlignCorners}, {"asymmetric", cuda::ResizeCoord::Asymmetric}};
    static const std::map<std::string, cuda::ResizeNearest> nearest = {
        {"round_prefer_floor", cuda::ResizeNearest::RoundPreferFloor}, {"round_prefer_ceil", cuda::ResizeNearest::RoundPreferCeil},
        {"floor", cuda::ResizeNearest::Floor}, {"ceil", cuda::ResizeNearest::Ceil}};
    const std::string coord = node.attr_string("coordinate_transformation_mode", "half_pixel");
    const std::string nm = node.attr_string("nearest_mode", "round_prefer_floor");
    if (!coords.count(coord)) return fallback("Resize coordinate_transformation_mode " + coord);
    if (!nearest.count(nm)) return fallback("Resize nearest_mode " + nm);
    cuda::Resize2dGeom& g = l.resize;
    g.linear = mode == "linear";
    g.coord = coords.at(coord);
    g.nearest = nearest.at(nm);
    g.planes = shapes[0][0] * shapes[0][1];
    g.ih = shapes[0][2];
    g.iw = shapes[0][3];
    const Tensor* sc = input(2);
    const Tensor* sz = input(3);
    if (sc && sc->numel() == 4) {
      if (sc->get_double(0) != 1.0 || sc->get_double(1) != 1.0) return fallback("Resize of the batch or channel axis");
      const float sh = static_cast<float>(sc->get_double(2)), sw = static_cast<float>(sc->get_double(3));
      if (!(sh > 0.0f) || !(sw > 0.0f)) fail_input("{}: Resize scales must be positive", node.label());
      // As the CPU kernel: the output length is floor(scale * length) in float.
      g.oh = static_cast<int64_t>(std::floor(sh * static_cast<float>(g.ih)));
      g.ow = static_cast<int64_t>(std::floor(sw * static_cast<float>(g.iw)));
      g.scale_h = sh;
      g.scale_w = sw;
    } else if (sz && sz->numel() == 4) {
      if (opset >= 18 && node.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch")
        return fallback("Resize keep_aspect_ratio_policy");
      if (sz->get_double(0) != static_cast<double>(shapes[0][0]) || sz->get_double(1) != static_cast<double>(shapes[0][1]))
        return fallback("Resize of the batch or channel axis");
      g.oh = static_cast<int64_t>(sz->get_double(2));
      g.ow = static_cast<int64_t>(sz->get_double(3));
      g.scale_h = static_cast<double>(g.oh) / static_cast<double>(g.ih);
      g.scale_w = static_cast<double>(g.ow) / static_cast<double>(g.iw);
    } else {
      return fallback("Resize scales/sizes not constant");
    }
    l.kind = LaunchKind::Resize2d;
    l.out_shape = {shapes[0][0], shapes[0][1], g.oh, g.ow};
    return l;
  }
  if (op == "Transpose") {
    l.kind = LaunchKind::StridedCopy;
    l.view = make_transpose_view(shapes[0], node.attr_ints("perm"), &l.out_shape);
    return l;
  }
  if (op == "Slice") {
    if (opset < 10) return fallback("opset < 10 Slice");
    for (size_t i = 1; i < shapes.size(); ++i)
      if (dtypes[i] != DType::Undefined && !input(i)) return fallback("starts/ends/axes/steps not constant");
    l.kind = LaunchKind::StridedCopy;
    l.view = make_slice_view(shapes[0], ints_of(input(1)), ints_of(input(2)), ints_of(input(3)), ints_of(input(4)),
                             &l.out_shape);
    return l;
  }
  if (op == "Gather") {
    if (dtypes[1] != DType::Int64) return fallback("indices not int64");
    const int64_t ax = norm_axis(node.attr_int("axis", 0), shapes[0].size());
    l.kind = LaunchKind::Gather;
    l.axis = axis_view(shapes[0], ax);
    if (const Tensor* idx = input(1)) {
      // An index out of range goes to the CPU kernel, which reports it in its own words.
      for (int64_t i = 0; i < idx->numel(); ++i)
        if (const int64_t v = idx->data<int64_t>()[i]; v < -l.axis.n || v >= l.axis.n) return fallback("Gather index out of range");
      l.indices_checked = true;
    }
    l.out_shape.assign(shapes[0].begin(), shapes[0].begin() + ax);
    l.out_shape.insert(l.out_shape.end(), shapes[1].begin(), shapes[1].end());
    l.out_shape.insert(l.out_shape.end(), shapes[0].begin() + ax + 1, shapes[0].end());
    return l;
  }
  if (op == "Concat") {
    const int64_t ax = norm_axis(node.attr_int("axis", 0), shapes[0].size());
    l.kind = LaunchKind::Concat;
    l.out_shape = shapes[0];
    l.out_shape[ax] = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (dtypes[i] != DType::Float32) return fallback("mixed input types");
      l.out_shape[ax] += shapes[i][ax];
    }
    l.axis = axis_view(l.out_shape, ax);
    return l;
  }
  if (op == "QuantizeLinear") {
    const DType out = shapes.size() > 2 && dtypes[2] != DType::Undefined ? dtypes[2] : DType::UInt8;
    if (out != DType::Int8 && out != DType::UInt8) return fallback(std::string("quantized type ") + dtype_name(out));
    return plan_quant(node, shapes, LaunchKind::Quantize);
  }
  if (op == "DequantizeLinear") {
    if (dtypes[0] != DType::Int8 && dtypes[0] != DType::UInt8 && dtypes[0] != DType::Int32)
      return fallback(std::string("quantized type ") + dtype_name(dtypes[0]));
    return plan_quant(node, shapes, LaunchKind::Dequantize);
  }
  if (op == "FakeQuant" && mpq_domain) return plan_quant(node, shapes, LaunchKind::FakeQuant);
  if (op == "FakeQuantBias" && mpq_domain) {
    // The CPU kernel reports malformed inputs (its message names them): only the shapes it takes.
    if (shapes.size() < 3 || dtypes[2] == DType::Undefined) return fallback("FakeQuantBias without its two scales");
    if (dtypes[1] != DType::Float32 || dtypes[2] != DType::Float32) return fallback("non-FP32 scales");
    const int64_t n = shape_numel(shapes[0]), nw = shape_numel(shapes[2]);
    if (shapes[0].size() != 1 || shape_numel(shapes[1]) != 1 || (nw != 1 && nw != n))
      return fallback("bias or scale shapes the CPU kernel rejects");
    NodeLaunch l;
    l.kind = LaunchKind::FakeQuantBias;
    l.out_shape = shapes[0];
    l.quant_channels = nw;
    return l;
  }
  if (op == "MatMul" || op == "Gemm") {
    const Shape& a = shapes[0];
    const Shape& b = shapes[1];
    if (dtypes[0] != DType::Float32 || dtypes[1] != DType::Float32) return fallback("non-FP32 inputs");
    GemmRequest r;
    if (options.allow_tf32) r.precision = GemmPrecision::TF32;
    if (op == "Gemm") {
      if (a.size() != 2 || b.size() != 2) fail_input("{}: Gemm needs 2-D operands", node.label());
      r.trans_a = node.attr_int("transA", 0) != 0;
      r.trans_b = node.attr_int("transB", 0) != 0;
      if (node.attr_float("alpha", 1.0f) != 1.0f) return fallback("Gemm alpha != 1");
      r.m = r.trans_a ? a[1] : a[0];
      r.k = r.trans_a ? a[0] : a[1];
      r.n = r.trans_b ? b[0] : b[1];
      if ((r.trans_b ? b[1] : b[0]) != r.k) fail_input("{}: Gemm inner dimensions differ ({} vs {})", node.label(), r.k,
                                                        r.trans_b ? b[1] : b[0]);
      l.out_shape = {r.m, r.n};
      if (shapes.size() > 2 && dtypes[2] != DType::Undefined) {
        if (dtypes[2] != DType::Float32) return fallback("non-FP32 Gemm C");
        if (node.attr_float("beta", 1.0f) != 1.0f) return fallback("Gemm beta != 1");
        Shape joined;
        l.bias = make_broadcast2(l.out_shape, shapes[2], &joined);
        if (joined != l.out_shape) fail_input("{}: C {} does not broadcast to {}", node.label(), shape_str(shapes[2]),
                                              shape_str(l.out_shape));
        l.has_bias = true;
      }
    } else if (a.size() >= 3 && b.size() == a.size() &&
               std::equal(a.begin(), a.end() - 2, b.begin())) {
      // Same batch dimensions on both sides (attention's Q.K^T and P.V): one strided-batched GEMM.
      r.batch = 1;
      for (size_t d = 0; d + 2 < a.size(); ++d) r.batch *= a[d];
      r.m = a[a.size() - 2];
      r.k = a.back();
      if (b[b.size() - 2] != r.k) fail_input("{}: MatMul inner dimensions {} and {} differ", node.label(), r.k, b[b.size() - 2]);
      r.n = b.back();
      if (r.batch == 0) return fallback("empty batch");
      l.out_shape = a;
      l.out_shape.back() = r.n;
    } else {
      if (a.size() < 2 || b.size() != 2) return fallback("MatMul with a 1-D operand or broadcast batch dimensions");
      r.k = a.back();
      if (b[0] != r.k) fail_input("{}: MatMul inner dimensions {} and {} differ", node.label(), r.k, b[0]);
      r.m = shape_numel(a) / r.k;  // batch dimensions of A fold into M
      r.n = b[1];
      l.out_shape = a;
      l.out_shape.back() = r.n;
    }
    l.gemm = plan_gemm(r);
    if (!l.gemm.use_cublaslt) return fallback("cuBLASLt: " + l.gemm.fallback_reason);
    l.kind = LaunchKind::Gemm;
    return l;
  }
  if (op == "Conv") {
    if (node.attr_string("auto_pad", "NOTSET") != "NOTSET") return fallback("auto_pad");
    if (dtypes[0] != DType::Float32 || dtypes[1] != DType::Float32) return fallback("non-FP32 inputs");
    ConvRequest r{shapes[0], shapes[1], node.attr_ints("strides"), node.attr_ints("dilations"), node.attr_ints("pads"),
                  node.attr_int("group", 1)};
    r.allow_tf32 = options.allow_tf32;
    l.conv = plan_conv(r);
    l.out_shape = l.conv.y_shape;
    if (!l.conv.use_cudnn) return fallback("cuDNN: " + l.conv.fallback_reason);
    if (shapes.size() > 2 && dtypes[2] != DType::Undefined) {
      if (dtypes[2] != DType::Float32) return fallback("non-FP32 Conv bias");
      if (shapes[2].size() != 1 || shapes[2][0] != l.out_shape[1])
        fail_input("{}: bias has shape {}, expected [{}]", node.label(), shape_str(shapes[2]), l.out_shape[1]);
      Shape bias_shape(l.out_shape.size() - 1, 1), joined;
      bias_shape[0] = l.out_shape[1];  // [M, 1, ..., 1]
      l.bias = make_broadcast2(l.out_shape, bias_shape, &joined);
      l.has_bias = true;
    }
    l.kind = LaunchKind::Conv;
    return l;
  }
  if (op == "ConvTranspose") {
    // Y = C^T X, where C is the convolution from Y's shape to X's with the same W ([C_in, C_out /
    // group, k...] is that convolution's [M, C / group, k...]): cuDNN's backward-data of C.
    if (node.attr_string("auto_pad", "NOTSET") != "NOTSET") return fallback("auto_pad");
    if (!node.attr_ints("output_shape").empty()) return fallback("output_shape");
    if (dtypes[0] != DType::Float32 || dtypes[1] != DType::Float32) return fallback("non-FP32 inputs");
    const Shape& x = shapes[0];
    const Shape& w = shapes[1];
    if (x.size() < 3 || w.size() != x.size()) return fallback("input and weight ranks");
    const size_t k = x.size() - 2;
    const int64_t group = node.attr_int("group", 1);
    if (group < 1 || w[0] != x[1] || x[1] % group != 0)
      fail_input("{}: X has {} channels, W has shape {} (group {})", node.label(), x[1], shape_str(w), group);
    auto ints = [&](const char* name, size_t n, int64_t dflt) {
      std::vector<int64_t> v = node.attr_ints(name);
      if (v.empty()) v.assign(n, dflt);
      if (v.size() != n) fail_input("{}: {} has {} values, expected {}", node.label(), name, v.size(), n);
      return v;
    };
    const std::vector<int64_t> strides = ints("strides", k, 1), dilations = ints("dilations", k, 1), pads = ints("pads", 2 * k, 0),
                               output_padding = ints("output_padding", k, 0);
    Shape y{x[0], w[1] * group};
    for (size_t d = 0; d < k; ++d) {
      const int64_t full = strides[d] * (x[2 + d] - 1) + output_padding[d] + (w[2 + d] - 1) * dilations[d] + 1;
      const int64_t len = full - pads[d] - pads[k + d];
      if (len <= 0) fail_input("{}: output spatial size {} along axis {}", node.label(), len, d);
      y.push_back(len);
    }
    ConvRequest r{y, w, strides, dilations, pads, group};
    r.allow_tf32 = options.allow_tf32;
    l.conv = plan_conv(r);
    if (!l.conv.use_cudnn) return fallback("cuDNN: " + l.conv.fallback_reason);
    if (Shape(l.conv.y_shape.begin(), l.conv.y_shape.end()) != x) return fallback("geometry the backward-data plan does not invert");
    l.out_shape = y;
    if (shapes.size() > 2 && dtypes[2] != DType::Undefined) {
      if (dtypes[2] != DType::Float32) return fallback("non-FP32 ConvTranspose bias");
      if (shapes[2].size() != 1 || shapes[2][0] != y[1])
        fail_input("{}: bias has shape {}, expected [{}]", node.label(), shape_str(shapes[2]), y[1]);
      Shape bias_shape(y.size() - 1, 1), joined;
      bias_shape[0] = y[1];
      l.bias = make_broadcast2(y, bias_shape, &joined);
      l.has_bias = true;
    }
    l.kind = LaunchKind::ConvTranspose;
    return l;
  }
  return fallback("no CUDA kernel");
}

}  // namespace mpq::rt::cuda_plan
