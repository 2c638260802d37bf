#include "runtime/cuda/device_convert.h"

#include "core/error.h"
#include "runtime/cuda/status.h"

namespace mpq::rt::gpu {

namespace {

bool is_low(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

Tensor convert_step(KernelRuntime& rt, const Tensor& t, DType to, cuda::FloatConvert kind, const std::string& name,
                    const char* what) {
  Tensor out = device_empty(rt.alloc, to, t.shape(), rt.stream, name, what);
  const int64_t n = t.numel();
  if (n == 0) return out;
  const int code = rt.ops.convert_float(kind, t.raw_data(), out.raw_data(), n,
                                        cuda::LaunchCtx{cuda::launch_shape_for(n, 256), rt.stream});
  cuda_plan::check_cuda_status(cuda_plan::CudaLibrary::Runtime, code, what, rt.backend.error_text(code), name, what);
  return out;
}

}  // namespace

Tensor convert_on_device(KernelRuntime& rt, const Tensor& t, DType to, const std::string& name, const char* what) {
  if (!t.defined() || t.dtype() == to) return t;
  const DType from = t.dtype();
  if (from != DType::Float32 && !is_low(from)) return t;
  if (to != DType::Float32 && !is_low(to)) return t;
  if (t.device() != Device::CUDA) fail_internal("{}: {} of a host tensor on the device path", name, what);
  if (is_low(from) && is_low(to)) return convert_on_device(rt, convert_on_device(rt, t, DType::Float32, name, what), to, name, what);
  if (from == DType::Float32)
    return convert_step(rt, t, to, to == DType::Float16 ? cuda::FloatConvert::F32ToF16 : cuda::FloatConvert::F32ToBF16, name, what);
  return convert_step(rt, t, DType::Float32,
                      from == DType::Float16 ? cuda::FloatConvert::F16ToF32 : cuda::FloatConvert::BF16ToF32, name, what);
}

Tensor widen_on_device(KernelRuntime& rt, const Tensor& t, const std::string& name, const char* what) {
  return t.defined() && is_low(t.dtype()) ? convert_on_device(rt, t, DType::Float32, name, what) : t;
}

DType first_low_type(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts)
    if (t.defined() && is_low(t.dtype())) return t.dtype();
  return DType::Undefined;
}

DType node_low_type(const ir::Node& node, const std::vector<Tensor>& inputs) {
  if (node.domain.empty() && node.op_type == "Cast") return DType::Undefined;
  return first_low_type(inputs);
}

void narrow_outputs_on_device(KernelRuntime& rt, std::vector<Tensor>& ts, DType low, const std::string& name) {
  if (low == DType::Undefined) return;
  for (Tensor& t : ts)
    if (t.defined() && t.dtype() == DType::Float32) t = convert_on_device(rt, t, low, name, "mixed precision");
}

}  // namespace mpq::rt::gpu
