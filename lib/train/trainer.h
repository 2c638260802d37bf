#pragma once
// One training step, in the order PyTorch AMP prescribes:
//   forward -> loss -> backward of (loss x scale) -> unscale -> (inf/NaN: skip) -> clip -> optimizer
//   -> scaler update -> zero_grad.
// The loss function sees the graph outputs (widened to float32) and returns the loss and the
// gradient of each output; the trainer multiplies those by the loss scale before the backward pass.
#include <functional>
#include <vector>

#include "train/autograd.h"
#include "train/grad_scaler.h"
#include "train/loss.h"
#include "train/optimizer.h"

namespace mpq::train {

struct LossOutput {
  double value = 0.0;
  std::vector<Tensor> output_grads;  // one per graph output (undefined: none)
};
using LossFn = std::function<LossOutput(const std::vector<Tensor>& outputs)>;

struct StepResult {
  double loss = 0.0;
  double lr = 0.0;
  double loss_scale = 1.0;  // the scale used in this step
  double grad_norm = 0.0;   // before clipping (0 when the step was skipped)
  bool skipped = false;     // a gradient was inf/NaN: no update
};

class Trainer {
 public:
  // max_grad_norm <= 0: no clipping.
  Trainer(Autograd& engine, Optimizer& optimizer, GradScaler& scaler, LrSchedule schedule, double max_grad_norm = 0.0);
  // Called after unscaling and before clipping and the update (e.g. to freeze some parameters).
  using Hook = std::function<void(std::vector<Parameter>& params)>;
  StepResult step(const rt::Feeds& feeds, const LossFn& loss, const Hook& before_update = Hook());
  int64_t steps_done() const { return step_; }
  void set_steps_done(int64_t s) { step_ = s; }

 private:
  Autograd& engine_;
  Optimizer& optimizer_;
  GradScaler& scaler_;
  LrSchedule schedule_;
  double max_grad_norm_;
  int64_t step_ = 0;
};

}  // namespace mpq::train
