#include "train/cuda/device_parameters.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "runtime/cuda/plan_shape.h"
#include "runtime/cuda/status.h"

namespace mpq::train::gpu {

namespace {

// The norm's partial sums: one double per thread of this fixed launch, whatever the gradient's
// size, so every gradient adds into the same slots.
constexpr cuda::LaunchShape kNormLaunch{32, 256};

}  // namespace

void add_same_shape(rt::gpu::KernelRuntime& rt, const Tensor& a, const Tensor& b, Tensor& out, const std::string& name,
                    const char* what) {
  const int64_t n = out.numel();
  if (a.shape() != out.shape() || b.shape() != out.shape())
    fail_internal("{}: {} of shapes {} and {} into {}", name, what, shape_str(a.shape()), shape_str(b.shape()), shape_str(out.shape()));
  if (n == 0) return;
  Shape joined;
  const cuda::Broadcast2 same = rt::cuda_plan::make_broadcast2(out.shape(), out.shape(), &joined);
  const int code = rt.ops.binary(cuda::BinaryOp::Add, same, static_cast<const float*>(a.raw_data()),
                                 static_cast<const float*>(b.raw_data()), static_cast<float*>(out.raw_data()), n,
                                 cuda::LaunchCtx{cuda::launch_shape_for(n, 256), rt.stream});
  rt::cuda_plan::check_cuda_status(rt::cuda_plan::CudaLibrary::Runtime, code, what, rt.backend.error_text(code), name, what);
}

DeviceParameters::DeviceParameters(std::vector<Parameter>& host, rt::gpu::KernelRuntime& rt)
    : host_(host),
      rt_(rt),
      values_(host.size()),
      grads_(host.size()),
      zero_flags_(Tensor::zeros(DType::Int32, {std::max<int64_t>(1, static_cast<int64_t>(host.size()))})) {
  for (const Parameter& p : host_)
    if (p.value.dtype() != DType::Float32)
      fail_unsupported("parameter '{}' is {}: parameters on the GPU are FP32", p.name, dtype_name(p.value.dtype()));
}

DeviceParameters::~DeviceParameters() = default;

cuda::LaunchCtx DeviceParameters::launch(int64_t n) const { return cuda::LaunchCtx{cuda::launch_shape_for(n, 256), rt_.stream}; }

void DeviceParameters::check(int code, size_t i, const char* what) const {
  rt::cuda_plan::check_cuda_status(rt::cuda_plan::CudaLibrary::Runtime, code, what, rt_.backend.error_text(code),
                                   i < host_.size() ? host_[i].name : std::string("parameters"), "parameter update");
}

Tensor DeviceParameters::to_device(const Tensor& host, const std::string& what) {
  Tensor d = rt::gpu::to_device(host, rt_.alloc, rt_.backend, rt_.stream, what, "parameter update");
  // The copy may still read `host`, which the caller is free to drop on return.
  check(rt_.backend.synchronize(rt_.stream), host_.size(), "upload");
  return d;
}

Tensor DeviceParameters::to_host(const Tensor& device, const std::string& what) {
  return rt::gpu::to_host(device, rt_.backend, rt_.stream, what, "parameter update");
}

Tensor DeviceParameters::zeros_like(size_t i) {
  const Tensor& v = host_.at(i).value;
  return to_device(Tensor::zeros(v.dtype(), v.shape()), host_[i].name);
}

void DeviceParameters::sync_device() {
  if (newer_ != Newer::Host) return;
  for (size_t i = 0; i < host_.size(); ++i) {
    values_[i] = rt::gpu::to_device(host_[i].value, rt_.alloc, rt_.backend, rt_.stream, host_[i].name, "parameter upload");
    const Tensor& g = host_[i].grad;
    const float* gp = g.data<float>();
    bool zero = true;
    for (int64_t k = 0; k < g.numel() && zero; ++k) zero = gp[k] == 0.0f;
    grads_[i] = zero ? Tensor()
                     : rt::gpu::to_device(g, rt_.alloc, rt_.backend, rt_.stream, host_[i].name, "parameter gradient upload");
  }
  newer_ = Newer::Neither;
}

void DeviceParameters::sync_host(bool will_modify) {
  if (newer_ == Newer::Device) {
    for (size_t i = 0; i < host_.size(); ++i) {
      Parameter& p = host_[i];
      const Tensor v = to_host(values_[i], p.name);
      std::memcpy(p.value.raw_data(), v.raw_data(), p.value.nbytes());
      if (grads_[i].defined()) {
        const Tensor g = to_host(grads_[i], p.name);
        std::memcpy(p.grad.raw_data(), g.raw_data(), p.grad.nbytes());
      } else {
        std::memset(p.grad.raw_data(), 0, p.grad.nbytes());
      }
    }
    newer_ = Newer::Neither;
  }
  if (will_modify) newer_ = Newer::Host;
}

const Tensor& DeviceParameters::value(size_t i) {
  sync_device();
  return values_.at(i);
}

void DeviceParameters::accumulate_grad(size_t i, Tensor g) {
  sync_device();
  const Parameter& p = host_.at(i);
  if (g.device() != Device::CUDA || g.shape() != p.value.shape() || g.dtype() != DType::Float32)
    fail_internal("gradient of parameter '{}': expected a device FP32 tensor of shape {}", p.name, shape_str(p.value.shape()));
  Tensor& acc = grads_[i];
  newer_ = Newer::Device;
  if (!acc.defined()) {
    // Held by nobody else: keep it. Otherwise copy, since the updates below write in place.
    if (g.buffer().use_count() == 1) {
      acc = std::move(g);
    } else {
      acc = rt::gpu::device_empty(rt_.alloc, DType::Float32, g.shape(), rt_.stream, p.name, "parameter gradient");
      if (g.nbytes() > 0)
        check(rt_.backend.copy(acc.raw_data(), g.raw_data(), g.nbytes(), rt::gpu::CopyKind::DeviceToDevice, rt_.stream), i,
              "gradient copy");
    }
    return;
  }
  add_same_shape(rt_, acc, g, acc, p.name, "gradient accumulation");
}

void DeviceParameters::zero_grad() {
  for (Tensor& g : grads_) g = Tensor();
  if (newer_ == Newer::Host) {
    for (Parameter& p : host_) std::memset(p.grad.raw_data(), 0, p.grad.nbytes());
  } else {
    newer_ = Newer::Device;  // the host copies are refreshed (zero gradients included) when read
  }
}

float* DeviceParameters::grad_ptr(size_t i) {
  if (!grads_[i].defined()) grads_[i] = zeros_like(i);
  return static_cast<float*>(grads_[i].raw_data());
}

void DeviceParameters::sgd(size_t i, const cuda::SgdStep& step, Tensor* momentum) {
  sync_device();
  const int64_t n = values_.at(i).numel();
  if (momentum && (!momentum->defined() || momentum->device() != Device::CUDA || momentum->numel() != n))
    fail_internal("SGD state of '{}' is not a device tensor of its size", host_[i].name);
  newer_ = Newer::Device;
  if (n == 0) return;
  check(rt_.ops.sgd_step(step, static_cast<float*>(values_[i].raw_data()), grad_ptr(i),
                         momentum ? static_cast<float*>(momentum->raw_data()) : nullptr, n, launch(n)),
        i, "SGD step");
}

void DeviceParameters::adamw(size_t i, const cuda::AdamWStep& step, Tensor& m, Tensor& v) {
  sync_device();
  const int64_t n = values_.at(i).numel();
  for (const Tensor* s : {&m, &v})
    if (!s->defined() || s->device() != Device::CUDA || s->numel() != n)
      fail_internal("AdamW state of '{}' is not a device tensor of its size", host_[i].name);
  newer_ = Newer::Device;
  if (n == 0) return;
  check(rt_.ops.adamw_step(step, static_cast<float*>(values_[i].raw_data()), grad_ptr(i), static_cast<float*>(m.raw_data()),
                           static_cast<float*>(v.raw_data()), n, launch(n)),
        i, "AdamW step");
}

Tensor DeviceParameters::zero_flags() {
  // From a host buffer that lives as long as this object, so the copy needs no synchronisation.
  return rt::gpu::to_device(zero_flags_, rt_.alloc, rt_.backend, rt_.stream, "flags", "parameter update");
}

bool DeviceParameters::scale_grads(float factor) {
  sync_device();
  Tensor flag = zero_flags();
  for (size_t i = 0; i < grads_.size(); ++i) {
    if (!grads_[i].defined() || grads_[i].numel() == 0) continue;  // zero: finite, stays zero
    newer_ = Newer::Device;
    const int64_t n = grads_[i].numel();
    check(rt_.ops.unscale(factor, static_cast<float*>(grads_[i].raw_data()), n, static_cast<int*>(flag.raw_data()), launch(n)), i,
          "gradient scaling");
  }
  return to_host(flag, "found_inf").data<int32_t>()[0] != 0;
}

double DeviceParameters::grad_norm() {
  sync_device();
  const int64_t slots = kNormLaunch.blocks * kNormLaunch.threads;
  Tensor partials = rt::gpu::device_empty(rt_.alloc, DType::Float64, {slots}, rt_.stream, "gradient norm", "parameter update");
  bool any = false;
  for (size_t i = 0; i < grads_.size(); ++i) {
    if (!grads_[i].defined() || grads_[i].numel() == 0) continue;
    check(rt_.ops.sum_squares(static_cast<const float*>(grads_[i].raw_data()), grads_[i].numel(),
                              static_cast<double*>(partials.raw_data()), any, cuda::LaunchCtx{kNormLaunch, rt_.stream}),
          i, "gradient norm");
    any = true;
  }
  if (!any) return 0.0;
  Tensor total = rt::gpu::device_empty(rt_.alloc, DType::Float64, {1}, rt_.stream, "gradient norm", "parameter update");
  check(rt_.ops.sum_partials(static_cast<const double*>(partials.raw_data()), slots, static_cast<double*>(total.raw_data()),
                             cuda::LaunchCtx{cuda::LaunchShape{1, 1}, rt_.stream}),
        host_.size(), "gradient norm total");
  return std::sqrt(to_host(total, "gradient norm").data<double>()[0]);
}

int64_t DeviceParameters::first_bad_parameter(const std::vector<char>& positive) {
  sync_device();
  if (host_.empty()) return -1;
  Tensor flags = zero_flags();
  int* f = static_cast<int*>(flags.raw_data());
  for (size_t i = 0; i < host_.size(); ++i) {
    const int64_t n = values_[i].numel();
    if (n == 0) continue;
    check(rt_.ops.check_values(static_cast<const float*>(values_[i].raw_data()), n, i < positive.size() && positive[i], f + i,
                               launch(n)),
          i, "divergence check");
  }
  const Tensor h = to_host(flags, "divergence flags");
  for (size_t i = 0; i < host_.size(); ++i)
    if (h.data<int32_t>()[i]) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace mpq::train::gpu
