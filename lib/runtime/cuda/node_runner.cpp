#include "runtime/cuda/node_runner.h"

#include "core/error.h"
#include "runtime/cuda/device_convert.h"
#include "runtime/cuda/device_tensor.h"
#include "runtime/cuda/status.h"

namespace mpq::rt::gpu {

using cuda_plan::LaunchKind;

cuda::LaunchCtx node_launch_ctx(const KernelRuntime& rt, int64_t work) {
  return cuda::LaunchCtx{cuda::launch_shape_for(work, 256), rt.stream};
}

void check_node_launch(const KernelRuntime& rt, const ir::Node& node, int code, const char* what) {
  cuda_plan::check_cuda_status(cuda_plan::CudaLibrary::Runtime, code, what, rt.backend.error_text(code), node.name, node.op_type);
}

void check_node_library(const KernelRuntime& rt, const ir::Node& node, const cuda::LibStatus& st) {
  if (st.ok()) return;
  const auto lib = static_cast<cuda_plan::CudaLibrary>(st.library);
  cuda_plan::fail_cuda_status(lib, st.code, st.call, lib == cuda_plan::CudaLibrary::Runtime ? rt.backend.error_text(st.code) : "",
                              node.name, node.op_type);
}

Tensor node_output(KernelRuntime& rt, const ir::Node& node, DType dtype, const Shape& shape) {
  return device_empty(rt.alloc, dtype, shape, rt.stream, node.name, node.op_type);
}

Tensor node_workspace(KernelRuntime& rt, const ir::Node& node, size_t bytes) {
  return bytes ? node_output(rt, node, DType::UInt8, Shape{static_cast<int64_t>(bytes)}) : Tensor();
}

namespace {

const float* fp(const Tensor& t) { return static_cast<const float*>(t.raw_data()); }
float* fp(Tensor& t) { return static_cast<float*>(t.raw_data()); }

struct Runner {
  const cuda_plan::NodeLaunch& l;
  const ir::Node& node;
  const std::vector<Tensor>& in;
  KernelRuntime& rt;

  cuda::LaunchCtx ctx(int64_t work) const { return node_launch_ctx(rt, work); }
  void check(int code, const char* what) const { check_node_launch(rt, node, code, what); }
  Tensor out(DType t, const Shape& s) const { return node_output(rt, node, t, s); }
  const Tensor& input(size_t i) const {
    if (i >= in.size() || !in[i].defined()) fail_input("{}: input {} is missing", node.label(), i);
    return in[i];
  }
  // Q/DQ zero points are int8/uint8 (or int32 for FakeQuant): the bodies take int32, so small
  // zero-point tensors are widened through the host.
  Tensor zero_points_int32(size_t i) const {
    if (i >= in.size() || !in[i].defined()) return Tensor();
    if (in[i].dtype() == DType::Int32) return in[i];
    const Tensor h = to_host(in[i], rt.backend, rt.stream, node.name, node.op_type);
    Tensor w(DType::Int32, h.shape());
    for (int64_t k = 0; k < h.numel(); ++k) w.data<int32_t>()[k] = static_cast<int32_t>(h.get_double(k));
    return to_device(w, rt.alloc, rt.backend, rt.stream, node.name, node.op_type);
  }
  cuda::QuantLayout layout(const Tensor& zp, int32_t qmin, int32_t qmax) const {
    cuda::QuantLayout q;
    q.outer = l.axis.outer;
    q.channels = l.axis.n;
    q.inner = l.axis.inner;
    q.scale = fp(input(1));
    q.zero_point = zp.defined() ? static_cast<const int32_t*>(zp.raw_data()) : nullptr;
    q.qmin = qmin;
    q.qmax = qmax;
    return q;
  }

  void check_lib(const cuda::LibStatus& st) const { check_node_library(rt, node, st); }
  Tensor workspace(size_t bytes) const { return node_workspace(rt, node, bytes); }
  static void* ws_ptr(Tensor& t) { return workspace_ptr(t); }
  // Gemm's C or Conv's B (input `i`), added in place: the Add body reads y[k] before writing it.
  void add_bias(Tensor& y, size_t i) const {
    if (!l.has_bias) return;
    check(rt.ops.binary(cuda::BinaryOp::Add, l.bias, fp(y), fp(input(i)), fp(y), y.numel(), ctx(y.numel())),
          "bias add kernel launch");
  }

  std::vector<Tensor> run() {
    const cuda::OpsTable& ops = rt.ops;
    switch (l.kind) {
      case LaunchKind::Unary: {
        Tensor y = out(DType::Float32, l.out_shape);
        check(ops.unary(l.unary, l.alpha, l.beta, fp(input(0)), fp(y), y.numel(), ctx(y.numel())), "unary kernel launch");
        return {y};
      }
      case LaunchKind::Binary: {
        Tensor y = out(DType::Float32, l.out_shape);
        check(ops.binary(l.binary, l.broadcast, fp(input(0)), fp(input(1)), fp(y), y.numel(), ctx(y.numel())),
              "binary kernel launch");
        return {y};
      }
      case LaunchKind::Reduce: {
        Tensor y = out(DType::Float32, l.out_shape);
        check(ops.reduce(l.reduce, fp(input(0)), fp(y), l.axis.outer, l.axis.n, l.axis.inner, ctx(y.numel())),
              "reduce kernel launch");
        return {y};
      }
      case LaunchKind::Softmax: {
        Tensor y = out(DType::Float32, l.out_shape);
        check(ops.softmax(l.log_softmax, fp(input(0)), fp(y), l.axis.outer, l.axis.n, l.axis.inner,
                          ctx(l.axis.outer * l.axis.inner)),
              "softmax kernel launch");
        return {y};
      }
      case LaunchKind::LayerNorm: {
        Tensor y = out(DType::Float32, l.out_shape);
        Shape stat = l.out_shape;
        stat.back() = 1;
        Tensor mean = out(DType::Float32, stat), inv = out(DType::Float32, stat);
        const float* beta = in.size() > 2 && in[2].defined() ? fp(in[2]) : nullptr;
        check(ops.layer_norm(fp(input(0)), fp(input(1)), beta, fp(y), fp(mean), fp(inv), l.axis.outer, l.axis.n, l.epsilon,
                             ctx(l.axis.outer)),
              "layer norm kernel launch");
        return {y, mean, inv};
      }
      case LaunchKind::Pool2d: {
        Tensor y = out(DType::Float32, l.out_shape);
        check(ops.pool2d(l.pool_max, l.count_include_pad, l.pool, fp(input(0)), fp(y), ctx(y.numel())), "pool kernel launch");
        return {y};
      }
      case LaunchKind::Resize2d: {
        Tensor y = out(DType::Float32, l.out_shape);
        check(ops.resize2d(l.resize, fp(input(0)), fp(y), ctx(y.numel())), "resize kernel launch");
        return {y};
      }
      case LaunchKind::StridedCopy: {
        Tensor y = out(DType::Float32, l.out_shape);
        if (y.numel() > 0) check(ops.strided_copy(l.view, fp(input(0)), fp(y), y.numel(), ctx(y.numel())), "copy kernel launch");
        return {y};
      }
      case LaunchKind::Gather: {
        Tensor y = out(DType::Float32, l.out_shape);
        Tensor bad = to_device(Tensor::scalar<int32_t>(0), rt.alloc, rt.backend, rt.stream, node.name, node.op_type);
        const Tensor& idx = input(1);
        check(ops.gather(fp(input(0)), static_cast<const int64_t*>(idx.raw_data()), fp(y), l.axis.outer, l.axis.n,
                         l.axis.inner, idx.numel(), static_cast<int*>(bad.raw_data()), ctx(y.numel())),
              "gather kernel launch");
        // The flag costs a synchronization: skipped when the planner checked the indices on the host
        // (constants, or small values computed on the CPU).
        if (!l.indices_checked && to_host(bad, rt.backend, rt.stream, node.name, node.op_type).data<int32_t>()[0] != 0)
          fail_input("{}: an index is outside [-{}, {})", node.label(), l.axis.n, l.axis.n);
        return {y};
      }
      case LaunchKind::Concat: {
        Tensor y = out(DType::Float32, l.out_shape);
        int64_t offset = 0;
        for (size_t i = 0; i < in.size(); ++i) {
          const int64_t part = input(i).numel() / (l.axis.outer * l.axis.inner);
          check(ops.concat_part(fp(in[i]), fp(y), l.axis.outer, part, l.axis.inner, l.axis.n, offset, ctx(in[i].numel())),
                "concat kernel launch");
          offset += part;
        }
        return {y};
      }
      case LaunchKind::Quantize: {
        const DType t = in.size() > 2 && in[2].defined() ? in[2].dtype() : DType::UInt8;
        const Tensor zp = zero_points_int32(2);
        Tensor y = out(t, l.out_shape);
        if (t == DType::Int8)
          check(ops.quantize_i8(layout(zp, -128, 127), fp(input(0)), static_cast<int8_t*>(y.raw_data()), ctx(y.numel())),
                "quantize kernel launch");
        else
          check(ops.quantize_u8(layout(zp, 0, 255), fp(input(0)), static_cast<uint8_t*>(y.raw_data()), ctx(y.numel())),
                "quantize kernel launch");
        return {y};
      }
      case LaunchKind::Dequantize: {
        const Tensor zp = zero_points_int32(2);
        Tensor y = out(DType::Float32, l.out_shape);
        const cuda::QuantLayout q = layout(zp, 0, 0);
        const Tensor& x = input(0);
        int code = 0;
        if (x.dtype() == DType::Int8) code = ops.dequantize_i8(q, static_cast<const int8_t*>(x.raw_data()), fp(y), ctx(y.numel()));
        else if (x.dtype() == DType::UInt8) code = ops.dequantize_u8(q, static_cast<const uint8_t*>(x.raw_data()), fp(y), ctx(y.numel()));
        else code = ops.dequantize_i32(q, static_cast<const int32_t*>(x.raw_data()), fp(y), ctx(y.numel()));
        check(code, "dequantize kernel launch");
        return {y};
      }
      case LaunchKind::FakeQuant: {
        const Tensor zp = zero_points_int32(2);
        Tensor y = out(DType::Float32, l.out_shape);
        const int32_t qmin = static_cast<int32_t>(node.attr_int("qmin", -128)), qmax = static_cast<int32_t>(node.attr_int("qmax", 127));
        check(ops.fake_quant(layout(zp, qmin, qmax), fp(input(0)), fp(y), ctx(y.numel())), "fake-quant kernel launch");
        return {y};
      }
      case LaunchKind::Gemm: {
        Tensor y = out(DType::Float32, l.out_shape);
        if (y.numel() > 0) {
          Tensor ws = workspace(l.gemm.workspace_bytes);
          check_lib(ops.gemm(l.gemm, input(0).raw_data(), input(1).raw_data(), y.raw_data(), ws_ptr(ws), l.gemm.workspace_bytes,
                             ctx(y.numel())));
          add_bias(y, 2);
        }
        return {y};
      }
      case LaunchKind::Conv: {
        Tensor y = out(DType::Float32, l.out_shape);
        if (y.numel() > 0) {
          size_t bytes = 0;
          check_lib(ops.conv_workspace(l.conv, &bytes, ctx(y.numel())));
          Tensor ws = workspace(bytes);
          check_lib(ops.conv_forward(l.conv, fp(input(0)), fp(input(1)), fp(y), ws_ptr(ws), bytes, ctx(y.numel())));
          add_bias(y, 2);
        }
        return {y};
      }
      case LaunchKind::ConvTranspose: {
        Tensor y = out(DType::Float32, l.out_shape);
        if (y.numel() > 0) {
          size_t bytes = 0;
          check_lib(ops.conv_backward_workspace(l.conv, cuda_plan::ConvDirection::BackwardData, &bytes, ctx(y.numel())));
          Tensor ws = workspace(bytes);
          // X plays the convolution's output gradient, Y its input gradient (overwritten).
          check_lib(ops.conv_backward_data(l.conv, fp(input(1)), fp(input(0)), fp(y), ws_ptr(ws), bytes, ctx(y.numel())));
          add_bias(y, 2);
        }
        return {y};
      }
      case LaunchKind::FakeQuantBias: {
        Tensor y = out(DType::Float32, l.out_shape);
        check(ops.fake_quant_bias(fp(input(0)), fp(input(1)), fp(input(2)), y.numel(), l.quant_channels, fp(y), ctx(y.numel())),
              "fake-quant-bias kernel launch");
        return {y};
      }
      case LaunchKind::Cast: {
        // A Cast to its own type still writes a new tensor (FP32: the Identity body; FP16/BF16:
        // through FP32, exact both ways).
        const Tensor& x = input(0);
        if (x.dtype() == DType::Float32 && l.cast_to == DType::Float32) {
          Tensor y = out(DType::Float32, l.out_shape);
          check(ops.unary(cuda::UnaryOp::Identity, 0, 0, fp(x), fp(y), y.numel(), ctx(y.numel())), "cast copy kernel launch");
          return {y};
        }
        const Tensor wide = x.dtype() == l.cast_to ? convert_on_device(rt, x, DType::Float32, node.name, "Cast") : x;
        return {convert_on_device(rt, wide, l.cast_to, node.name, "Cast")};
      }
      case LaunchKind::Fallback: break;
    }
    fail_unsupported("{}: the CUDA runner does not execute {} launches ({})", node.label(), cuda_plan::launch_kind_name(l.kind),
                     l.reason);
  }
};

}  // namespace

std::vector<Tensor> run_planned_node(const cuda_plan::NodeLaunch& l, const ir::Node& node, const std::vector<Tensor>& inputs,
                                     KernelRuntime& rt) {
  for (const Tensor& t : inputs)
    if (t.defined() && t.device() != Device::CUDA)
      fail_internal("{}: CUDA runner given a {} input; copies must be explicit", node.label(), device_name(t.device()));
  return Runner{l, node, inputs, rt}.run();
}

}  // namespace mpq::rt::gpu
