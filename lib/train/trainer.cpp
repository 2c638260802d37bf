#include "train/trainer.h"

#include "train/grads/grad_util.h"

namespace mpq::train {

Trainer::Trainer(Autograd& engine, Optimizer& optimizer, GradScaler& scaler, LrSchedule schedule, double max_grad_norm)
    : engine_(engine), optimizer_(optimizer), scaler_(scaler), schedule_(schedule), max_grad_norm_(max_grad_norm) {}

StepResult Trainer::step(const rt::Feeds& feeds, const LossFn& loss, const Hook& before_update) {
  StepResult r;
  r.lr = schedule_.at(step_);
  r.loss_scale = scaler_.scale();
  std::vector<Tensor> outputs = engine_.forward(feeds);
  std::vector<Tensor> widened;
  for (const Tensor& t : outputs) widened.push_back(grad_util::convert(t, t.dtype() == DType::Float64 ? DType::Float64 : DType::Float32));
  LossOutput l = loss(widened);
  r.loss = l.value;
  if (r.loss_scale != 1.0) {
    for (Tensor& g : l.output_grads) {
      if (!g.defined()) continue;
      Tensor s = g.clone();  // the loss function may hand out a buffer it keeps
      grad_util::visit_float(s.dtype(), [&](auto tag) {
        using T = typename decltype(tag)::type;
        T* p = s.data<T>();
        for (int64_t i = 0; i < s.numel(); ++i) p[i] = static_cast<T>(p[i] * static_cast<T>(r.loss_scale));
      });
      g = std::move(s);
    }
  }
  engine_.backward(l.output_grads);
  // On the parameters where they live: the host's, or a device-mode engine's device memory (a hook
  // then sees host copies, which go back up).
  auto update = [&](auto& params) {
    r.skipped = scaler_.unscale(params);
    if (r.skipped) return;
    if (before_update) before_update(engine_.parameters());
    r.grad_norm = max_grad_norm_ > 0 ? clip_grad_norm(params, max_grad_norm_) : grad_norm(params);
    optimizer_.step(params, r.lr);
  };
  if (DeviceUpdate* device = engine_.device_update()) update(*device);
  else update(engine_.parameters());
  scaler_.update();
  engine_.zero_grad();
  ++step_;
  return r;
}

}  // namespace mpq::train
