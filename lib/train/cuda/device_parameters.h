#pragma once
// The training engine's parameters in device memory (AutogradOptions::device = CUDA): the forward
// reads their device values, the backward adds into their device gradients, and the optimizer,
// GradScaler's unscale and gradient clipping update them in place through the kernel table
// (DeviceUpdate, train/device_update.h). Nothing crosses to the host in a training step except
// the few numbers the host decides with (found-inf flag, the gradient norm, divergence flags).
//
// The host Parameter list stays a mirror, kept coherent on demand: whichever side changed last is
// copied to the other before it is read. sync_host() brings the host up to date (one download of
// every value and gradient); with `will_modify` the host becomes the newer side, so the next
// device use uploads it (a resumed checkpoint, a test editing a weight). A gradient no backward
// reached since zero_grad() is held as "zero" without device memory.
//
// Tested with the host kernel table and host memory (tests/cuda/autograd_cuda_test.cpp): a device
// training run takes the same steps as the CPU engine's. Not yet run on a GPU (docs/gpu.md).
#include <vector>

#include "runtime/cuda/node_runner.h"
#include "train/autograd.h"
#include "train/device_update.h"

namespace mpq::train::gpu {

// out = a + b for FP32 device tensors of one shape (out may be a) through the kernel table; errors
// name `name` and `what`.
void add_same_shape(rt::gpu::KernelRuntime& rt, const Tensor& a, const Tensor& b, Tensor& out, const std::string& name,
                    const char* what);

class DeviceParameters final : public DeviceUpdate {
 public:
  // `host` must outlive this object and keep its size; every parameter must be FP32.
  DeviceParameters(std::vector<Parameter>& host, rt::gpu::KernelRuntime& rt);
  ~DeviceParameters() override;

  // The device value of parameter i (uploading host changes first).
  const Tensor& value(size_t i);
  // Adds g (a device tensor of the parameter's shape) into parameter i's gradient.
  void accumulate_grad(size_t i, Tensor g);
  void zero_grad();
  void sync_host(bool will_modify);

  // DeviceUpdate
  size_t size() const override { return host_.size(); }
  Tensor zeros_like(size_t i) override;
  Tensor to_device(const Tensor& host, const std::string& what) override;
  Tensor to_host(const Tensor& device, const std::string& what) override;
  void sgd(size_t i, const cuda::SgdStep& step, Tensor* momentum) override;
  void adamw(size_t i, const cuda::AdamWStep& step, Tensor& m, Tensor& v) override;
  bool scale_grads(float factor) override;
  double grad_norm() override;
  int64_t first_bad_parameter(const std::vector<char>& positive) override;

 private:
  enum class Newer { Neither, Host, Device };
  void sync_device();
  float* grad_ptr(size_t i);  // allocates a zero gradient where none is held
  cuda::LaunchCtx launch(int64_t n) const;
  void check(int code, size_t i, const char* what) const;
  Tensor zero_flags();  // one zeroed int per parameter (at least one), on the device

  std::vector<Parameter>& host_;
  rt::gpu::KernelRuntime& rt_;
  std::vector<Tensor> values_, grads_;  // grads_[i] undefined: zero
  Tensor zero_flags_;                    // host zeros the flag buffers are copied from
  Newer newer_ = Newer::Host;
};

}  // namespace mpq::train::gpu
