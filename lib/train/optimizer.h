#pragma once
// Optimizers, learning-rate schedule and gradient clipping, following PyTorch's definitions:
//  - SGD (torch.optim.SGD): coupled weight decay g += wd * p; momentum buffer b = g on the first
//    step, then b = mu * b + (1 - dampening) * g; Nesterov uses g + mu * b; p -= lr * update.
//  - AdamW (torch.optim.AdamW): decoupled decay p *= 1 - lr * wd; m = b1 m + (1 - b1) g;
//    v = b2 v + (1 - b2) g^2; p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
//  - Parameter groups: each group scales the learning rate and sets its own weight decay (LSQ step
//    sizes and biases typically get none).
//  - Cosine decay with linear warm-up, and clipping by the global L2 norm of every gradient
//    (torch.nn.utils.clip_grad_norm_: factor max_norm / (norm + 1e-6) when below 1).
// State (momentum buffers, moments, step count) round-trips through a Checkpoint.
#include <memory>
#include <string>
#include <vector>

#include "runtime/thread_pool.h"
#include "train/autograd.h"
#include "train/checkpoint.h"
#include "train/device_update.h"

namespace mpq::train {

struct ParamGroup {
  std::string name;
  std::vector<size_t> params;  // indices into the parameter list
  double lr_scale = 1.0;
  double weight_decay = 0.0;
  // Positive values (quantization step sizes) updated in log space: the optimizer steps u = log(v)
  // with the gradient v * dL/dv and writes back exp(u), so a step size stays positive and moves by
  // relative amounts whatever its magnitude (Adam's steps are about lr in size, which would swamp
  // a 1e-4 weight scale). No weight decay applies to such a group.
  bool log_space = false;
};

struct SgdOptions {
  double momentum = 0.9;
  double dampening = 0.0;
  bool nesterov = false;
};

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
};

class Optimizer {
 public:
  explicit Optimizer(std::vector<ParamGroup> groups) : groups_(std::move(groups)) {}
  virtual ~Optimizer() = default;
  virtual const char* name() const = 0;
  // One update of every grouped parameter from its gradient, with learning rate lr * lr_scale.
  virtual void step(std::vector<Parameter>& params, double lr) = 0;
  // The same update where a device-mode engine keeps the parameters (Autograd::device_update()):
  // the state moves to that device at its first use there and stays; save() downloads it. The
  // engine must then outlive the optimizer (its memory holds the state).
  virtual void step(DeviceUpdate& device, double lr) = 0;
  // State under "optimizer/..." names; load() checks it matches the parameters.
  virtual void save(Checkpoint& c, const std::vector<Parameter>& params) const = 0;
  virtual void load(const Checkpoint& c, const std::vector<Parameter>& params) = 0;
  const std::vector<ParamGroup>& groups() const { return groups_; }
  // Changes a group's learning-rate factor (0 freezes it: no update, momentum included).
  void set_lr_scale(const std::string& group, double scale) {
    for (ParamGroup& g : groups_)
      if (g.name == group) g.lr_scale = scale;
  }
  int64_t steps() const { return steps_; }

 protected:
  std::vector<ParamGroup> groups_;
  int64_t steps_ = 0;
};

std::unique_ptr<Optimizer> make_sgd(std::vector<ParamGroup> groups, SgdOptions options = {});
std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> groups, AdamWOptions options = {});

// Learning rate at optimizer step `step` (0-based): linear warm-up base * (step + 1) / warmup over
// the first `warmup` steps, then cosine decay from base to min_lr at `total` steps
// (torch.optim.lr_scheduler.CosineAnnealingLR's curve with T_max = total - warmup).
struct LrSchedule {
  double base_lr = 1e-3;
  int64_t warmup = 0;
  int64_t total = 1;
  double min_lr = 0.0;
  double at(int64_t step) const;
};

// Scales every gradient so that their global L2 norm is at most max_norm; returns the norm before.
double clip_grad_norm(std::vector<Parameter>& params, double max_norm);
// Global L2 norm of the gradients (double accumulation in parameter order).
double grad_norm(const std::vector<Parameter>& params);
// The same two on a device-mode engine's parameters.
double clip_grad_norm(DeviceUpdate& device, double max_norm);
double grad_norm(DeviceUpdate& device);

}  // namespace mpq::train
