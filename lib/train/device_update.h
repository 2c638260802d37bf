#pragma once
// Where a device-mode training engine keeps its parameters (Autograd::device_update(); the CUDA
// implementation is train/cuda/device_parameters.h): the optimizers, the gradient scaler and
// gradient clipping compute their per-step constants on the host, with the same code as on the
// CPU, and hand the element loops (the shared bodies of kernels/bodies/train.cuh) to this
// interface, so parameters, gradients and optimizer state stay in device memory between steps.
// Only FP32 parameters live on a device.
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/params.h"

namespace mpq::train {

class DeviceUpdate {
 public:
  virtual ~DeviceUpdate() = default;
  virtual size_t size() const = 0;  // number of parameters
  // Optimizer state: a zero-filled device tensor shaped as parameter i; copies both ways (for
  // checkpoints), `what` naming the buffer in errors.
  virtual Tensor zeros_like(size_t i) = 0;
  virtual Tensor to_device(const Tensor& host, const std::string& what) = 0;
  virtual Tensor to_host(const Tensor& device, const std::string& what) = 0;
  // One update of parameter i from its gradient (momentum: null without momentum).
  virtual void sgd(size_t i, const cuda::SgdStep& step, Tensor* momentum) = 0;
  virtual void adamw(size_t i, const cuda::AdamWStep& step, Tensor& m, Tensor& v) = 0;
  // Every gradient *= factor; returns whether any result is inf or NaN.
  virtual bool scale_grads(float factor) = 0;
  // Global L2 norm of the gradients (double accumulation).
  virtual double grad_norm() = 0;
  // The first parameter holding a non-finite value, or (where positive[i]) a value not above 0;
  // -1 when none. One small download, for the training loop's divergence check.
  virtual int64_t first_bad_parameter(const std::vector<char>& positive) = 0;
};

}  // namespace mpq::train
