#include "train/grad_scaler.h"

#include <cmath>

#include "core/error.h"
#include "train/grads/grad_util.h"

namespace mpq::train {

GradScaler::GradScaler(GradScalerOptions options) : o_(options), scale_(options.init_scale) {
  if (!(o_.init_scale > 0) || !(o_.growth_factor > 1) || !(o_.backoff_factor > 0 && o_.backoff_factor < 1) ||
      o_.growth_interval < 1)
    fail_input("loss scaling: scale must be positive, growth > 1, 0 < backoff < 1 and the interval at least 1");
}

bool GradScaler::unscale(std::vector<Parameter>& params) {
  if (unscaled_) return found_inf_;
  unscaled_ = true;
  found_inf_ = false;
  const float inv = o_.enabled ? static_cast<float>(1.0 / scale_) : 1.0f;
  for (Parameter& p : params) {
    grad_util::visit_float(p.grad.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* g = p.grad.data<T>();
      bool bad = false;
      for (int64_t i = 0; i < p.grad.numel(); ++i) {
        g[i] = static_cast<T>(g[i] * static_cast<T>(inv));
        bad |= !std::isfinite(g[i]);
      }
      found_inf_ |= bad;
    });
  }
  return found_inf_;
}

bool GradScaler::unscale(DeviceUpdate& device) {
  if (unscaled_) return found_inf_;
  unscaled_ = true;
  // Disabled, the pass still runs (by 1) to find non-finite gradients, as on the CPU.
  found_inf_ = device.scale_grads(o_.enabled ? static_cast<float>(1.0 / scale_) : 1.0f);
  return found_inf_;
}

void GradScaler::update() {
  if (!unscaled_) fail_internal("GradScaler::update without unscale in this step");
  unscaled_ = false;
  if (found_inf_) ++skipped_;
  if (!o_.enabled) return;
  if (found_inf_) {
    scale_ *= o_.backoff_factor;
    tracker_ = 0;
  } else if (++tracker_ == o_.growth_interval) {
    scale_ *= o_.growth_factor;
    tracker_ = 0;
  }
}

void GradScaler::save(Checkpoint& c) const {
  c.meta()["grad_scaler"] = {{"enabled", o_.enabled}, {"scale", scale_}, {"growth_tracker", tracker_},
                             {"skipped_steps", skipped_}, {"growth_interval", o_.growth_interval}};
}

void GradScaler::load(const Checkpoint& c) {
  const auto it = c.meta().find("grad_scaler");
  if (it == c.meta().end()) fail_input("{}: checkpoint has no loss-scaler state", c.source().string());
  if (it->at("enabled").get<bool>() != o_.enabled)
    fail_input("{}: checkpoint was written with loss scaling {}, this run has it {}", c.source().string(),
               it->at("enabled").get<bool>() ? "on" : "off", o_.enabled ? "on" : "off");
  scale_ = it->at("scale").get<double>();
  tracker_ = it->at("growth_tracker").get<int64_t>();
  skipped_ = it->at("skipped_steps").get<int64_t>();
  found_inf_ = false;
  unscaled_ = false;
}

}  // namespace mpq::train
