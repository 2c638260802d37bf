#pragma once
// Dynamic loss scaling with the semantics of torch.cuda.amp.GradScaler: the loss (here: the
// gradient of the outputs) is multiplied by the scale before the backward pass so that small FP16
// gradients do not flush to zero; before the optimizer (and before clipping) the gradients are
// multiplied by 1/scale (a float32 reciprocal, as PyTorch computes it) and checked for inf/NaN.
// A step with any non-finite gradient is skipped and the scale halves; after `growth_interval`
// consecutive clean steps the scale doubles. Initial scale 2^16.
#include <vector>

#include "train/autograd.h"
#include "train/device_update.h"
#include "train/checkpoint.h"

namespace mpq::train {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool enabled = true;
};

class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});
  bool enabled() const { return o_.enabled; }
  // The factor to multiply the loss (its gradient) by; 1 when disabled.
  double scale() const { return o_.enabled ? scale_ : 1.0; }
  // Divides every gradient by the scale and reports whether any is inf or NaN (which then means the
  // optimizer step must be skipped). Idempotent within a step.
  bool unscale(std::vector<Parameter>& params);
  // The same on a device-mode engine's gradients (Autograd::device_update()).
  bool unscale(DeviceUpdate& device);
  // After the (possibly skipped) step: halve on overflow, double after growth_interval clean steps.
  void update();
  bool found_inf() const { return found_inf_; }
  int64_t growth_tracker() const { return tracker_; }
  int64_t skipped_steps() const { return skipped_; }

  void save(Checkpoint& c) const;
  void load(const Checkpoint& c);

 private:
  GradScalerOptions o_;
  double scale_;
  int64_t tracker_ = 0;
  int64_t skipped_ = 0;
  bool found_inf_ = false;
  bool unscaled_ = false;
};

}  // namespace mpq::train
