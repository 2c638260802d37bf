#include "train/optimizer.h"

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "train/grads/grad_util.h"

namespace mpq::train {

namespace {

void check_float32(const Parameter& p) {
  if (p.value.dtype() != DType::Float32 && p.value.dtype() != DType::Float64)
    fail_internal("optimizer: parameter '{}' is {}; master weights are float32", p.name, dtype_name(p.value.dtype()));
}

Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.dtype(), t.shape()); }

// Named per-parameter state buffers (one or two per parameter), saved as "optimizer/<kind>/<param>".
// A buffer lives where the last step that used it ran: on the host, or in the device memory of
// `device` (a training engine's device mode); it moves when a step on the other side needs it.
struct SlotState {
  std::vector<Tensor> buf;
  DeviceUpdate* device = nullptr;
  static bool on_device(const Tensor& t) { return t.defined() && t.device() == Device::CUDA; }
  // Buffer i on the host (undefined stays undefined).
  Tensor& host(size_t i) {
    if (on_device(buf[i])) buf[i] = device->to_host(buf[i], "optimizer state");
    return buf[i];
  }
  // Buffer i in d's memory, zero-filled when it did not exist. Another engine's buffers come to
  // the host first, so that `device` always owns every device buffer here.
  Tensor& in_device(size_t i, DeviceUpdate& d) {
    if (device && device != &d)
      for (size_t k = 0; k < buf.size(); ++k) host(k);
    device = &d;
    if (!buf[i].defined()) buf[i] = d.zeros_like(i);
    else if (!on_device(buf[i])) buf[i] = d.to_device(buf[i], "optimizer state");
    return buf[i];
  }
  void save(Checkpoint& c, const std::string& kind, const std::vector<Parameter>& params) const {
    for (size_t i = 0; i < buf.size(); ++i)
      if (buf[i].defined())
        c.put("optimizer/" + kind + "/" + params[i].name, on_device(buf[i]) ? device->to_host(buf[i], "optimizer state") : buf[i]);
  }
  void load(const Checkpoint& c, const std::string& kind, const std::vector<Parameter>& params) {
    buf.assign(params.size(), Tensor());
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string key = "optimizer/" + kind + "/" + params[i].name;
      if (!c.has(key)) continue;
      const Tensor& t = c.get(key);
      if (t.shape() != params[i].value.shape() || t.dtype() != params[i].value.dtype())
        fail_input("{}: optimizer state '{}' is {}{}, the parameter is {}{} (checkpoint from another model?)",
                   c.source().string(), key, dtype_name(t.dtype()), shape_str(t.shape()),
                   dtype_name(params[i].value.dtype()), shape_str(params[i].value.shape()));
      buf[i] = t.clone();
    }
  }
};

template <typename F>
void for_each_float(Tensor& t, F f) {
  grad_util::visit_float(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    f(t.data<T>(), TypeTag<T>{});
  });
}

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<ParamGroup> groups, SgdOptions o) : Optimizer(std::move(groups)), o_(o) {}
  const char* name() const override { return "sgd"; }

  void step(std::vector<Parameter>& params, double lr) override {
    if (momentum_.buf.size() != params.size()) momentum_.buf.resize(params.size());
    for (const ParamGroup& g : groups_) {
      const double glr = lr * g.lr_scale;
      for (size_t idx : g.params) {
        Parameter& p = params.at(idx);
        check_float32(p);
        const bool first = !momentum_.buf[idx].defined();
        if (o_.momentum != 0 && first) momentum_.buf[idx] = zeros_like(p.value);
        for_each_float(p.value, [&](auto* w, auto tag) {
          using T = typename decltype(tag)::type;
          const T* gr = p.grad.data<T>();
          T* b = o_.momentum != 0 ? momentum_.host(idx).data<T>() : nullptr;
          const T wd = static_cast<T>(g.weight_decay), mu = static_cast<T>(o_.momentum);
          const T damp = static_cast<T>(1.0 - o_.dampening), rate = static_cast<T>(glr);
          for (int64_t i = 0; i < p.value.numel(); ++i) {
            T d = g.log_space ? gr[i] * w[i] : gr[i];
            if (wd != T(0) && !g.log_space) d += wd * w[i];
            if (b) {
              b[i] = first ? d : mu * b[i] + damp * d;
              d = o_.nesterov ? d + mu * b[i] : b[i];
            }
            if (g.log_space) w[i] *= std::exp(-rate * d);
            else w[i] -= rate * d;
          }
        });
      }
    }
    ++steps_;
  }

  void step(DeviceUpdate& d, double lr) override {
    if (momentum_.buf.size() != d.size()) momentum_.buf.resize(d.size());
    for (const ParamGroup& g : groups_) {
      const double glr = lr * g.lr_scale;
      for (size_t idx : g.params) {
        if (idx >= d.size()) fail_internal("optimizer: parameter {} of group '{}' does not exist", idx, g.name);
        cuda::SgdStep s;
        s.first = !momentum_.buf[idx].defined();
        s.rate = static_cast<float>(glr);
        s.weight_decay = static_cast<float>(g.weight_decay);
        s.momentum = static_cast<float>(o_.momentum);
        s.damp = static_cast<float>(1.0 - o_.dampening);
        s.nesterov = o_.nesterov;
        s.log_space = g.log_space;
        d.sgd(idx, s, o_.momentum != 0 ? &momentum_.in_device(idx, d) : nullptr);
      }
    }
    ++steps_;
  }

  void save(Checkpoint& c, const std::vector<Parameter>& params) const override {
    momentum_.save(c, "momentum", params);
    c.meta()["optimizer"] = {{"name", name()}, {"steps", steps_}};
  }
  void load(const Checkpoint& c, const std::vector<Parameter>& params) override {
    check_kind(c);
    momentum_.load(c, "momentum", params);
    steps_ = c.meta().at("optimizer").at("steps").get<int64_t>();
  }

 private:
  void check_kind(const Checkpoint& c) const {
    const std::string saved = c.meta().value("optimizer", nlohmann::json::object()).value("name", "");
    if (saved != name())
      fail_input("{}: checkpoint holds {} optimizer state, this run uses {}", c.source().string(),
                 saved.empty() ? "no" : saved, name());
  }
  SgdOptions o_;
  SlotState momentum_;
};

class AdamW final : public Optimizer {
 public:
  AdamW(std::vector<ParamGroup> groups, AdamWOptions o) : Optimizer(std::move(groups)), o_(o) {}
  const char* name() const override { return "adamw"; }

  void step(std::vector<Parameter>& params, double lr) override {
    each_parameter(params.size(), lr, [&](const ParamGroup& g, size_t idx, const Constants& k) {
      Parameter& p = params.at(idx);
      check_float32(p);
      if (!m_.buf[idx].defined()) {
        m_.buf[idx] = zeros_like(p.value);
        v_.buf[idx] = zeros_like(p.value);
      }
      for_each_float(p.value, [&](auto* w, auto tag) {
        using T = typename decltype(tag)::type;
        const T* gr = p.grad.data<T>();
        T* m = m_.host(idx).data<T>();
        T* v = v_.host(idx).data<T>();
        const T decay = static_cast<T>(k.decay), one_minus_b1 = static_cast<T>(k.one_minus_b1);
        const T one_minus_b2 = static_cast<T>(k.one_minus_b2), b2 = static_cast<T>(k.b2);
        const T step_size = static_cast<T>(k.step_size), bc2_sqrt = static_cast<T>(k.bc2_sqrt), eps = static_cast<T>(k.eps);
        for (int64_t i = 0; i < p.value.numel(); ++i) {
          const T gi = g.log_space ? gr[i] * w[i] : gr[i];
          w[i] *= decay;
          m[i] += one_minus_b1 * (gi - m[i]);
          v[i] = b2 * v[i] + one_minus_b2 * gi * gi;
          const T denom = std::sqrt(v[i]) / bc2_sqrt + eps;
          if (g.log_space) w[i] *= std::exp(-step_size * m[i] / denom);
          else w[i] -= step_size * m[i] / denom;
        }
      });
    });
  }

  void step(DeviceUpdate& d, double lr) override {
    each_parameter(d.size(), lr, [&](const ParamGroup& g, size_t idx, const Constants& k) {
      cuda::AdamWStep s;
      s.decay = static_cast<float>(k.decay);
      s.one_minus_b1 = static_cast<float>(k.one_minus_b1);
      s.one_minus_b2 = static_cast<float>(k.one_minus_b2);
      s.b2 = static_cast<float>(k.b2);
      s.step_size = static_cast<float>(k.step_size);
      s.bc2_sqrt = static_cast<float>(k.bc2_sqrt);
      s.eps = static_cast<float>(k.eps);
      s.log_space = g.log_space;
      d.adamw(idx, s, m_.in_device(idx, d), v_.in_device(idx, d));
    });
  }

  void save(Checkpoint& c, const std::vector<Parameter>& params) const override {
    m_.save(c, "exp_avg", params);
    v_.save(c, "exp_avg_sq", params);
    c.meta()["optimizer"] = {{"name", name()}, {"steps", steps_}};
  }
  void load(const Checkpoint& c, const std::vector<Parameter>& params) override {
    const std::string saved = c.meta().value("optimizer", nlohmann::json::object()).value("name", "");
    if (saved != name())
      fail_input("{}: checkpoint holds {} optimizer state, this run uses {}", c.source().string(),
                 saved.empty() ? "no" : saved, name());
    m_.load(c, "exp_avg", params);
    v_.load(c, "exp_avg_sq", params);
    steps_ = c.meta().at("optimizer").at("steps").get<int64_t>();
  }

 private:
  // One step's constants in double, rounded once to the parameter type by each path (1 - beta
  // too, as PyTorch passes these as Python floats).
  struct Constants {
    double decay, one_minus_b1, one_minus_b2, b2, step_size, bc2_sqrt, eps;
  };
  Constants constants(const ParamGroup& g, double glr, double bc1, double bc2) const {
    return Constants{g.log_space ? 1.0 : 1.0 - glr * g.weight_decay, 1.0 - o_.beta1, 1.0 - o_.beta2, o_.beta2, glr / bc1,
                     std::sqrt(bc2), o_.eps};
  }
  // One step's bookkeeping (state slots for n parameters, the step count, bias corrections), then
  // fn(group, parameter index, constants) for every grouped parameter: the CPU and device updates.
  template <typename Fn>
  void each_parameter(size_t n, double lr, Fn fn) {
    if (m_.buf.size() != n) {
      m_.buf.resize(n);
      v_.buf.resize(n);
    }
    ++steps_;
    const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(steps_));
    const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(steps_));
    for (const ParamGroup& g : groups_) {
      const double glr = lr * g.lr_scale;
      for (size_t idx : g.params) {
        if (idx >= n) fail_internal("optimizer: parameter {} of group '{}' does not exist", idx, g.name);
        fn(g, idx, constants(g, glr, bc1, bc2));
      }
    }
  }
  AdamWOptions o_;
  SlotState m_, v_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(std::vector<ParamGroup> groups, SgdOptions options) {
  return std::make_unique<Sgd>(std::move(groups), options);
}
std::unique_ptr<Optimizer> make_adamw(std::vector<ParamGroup> groups, AdamWOptions options) {
  return std::make_unique<AdamW>(std::move(groups), options);
}

double LrSchedule::at(int64_t step) const {
  if (step < warmup) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  const int64_t span = std::max<int64_t>(total - warmup, 1);
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(span));
  return min_lr + (base_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

double grad_norm(const std::vector<Parameter>& params) {
  double sum = 0.0;
  for (const Parameter& p : params) {
    grad_util::visit_float(p.grad.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* g = p.grad.data<T>();
      for (int64_t i = 0; i < p.grad.numel(); ++i) sum += static_cast<double>(g[i]) * static_cast<double>(g[i]);
    });
  }
  return std::sqrt(sum);
}

double grad_norm(DeviceUpdate& device) { return device.grad_norm(); }

double clip_grad_norm(DeviceUpdate& device, double max_norm) {
  const double norm = device.grad_norm();
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) device.scale_grads(static_cast<float>(coef));
  return norm;
}

double clip_grad_norm(std::vector<Parameter>& params, double max_norm) {
  const double norm = grad_norm(params);
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    for (Parameter& p : params)
      for_each_float(p.grad, [&](auto* g, auto tag) {
        using T = typename decltype(tag)::type;
        for (int64_t i = 0; i < p.grad.numel(); ++i) g[i] *= static_cast<T>(coef);
      });
  }
  return norm;
}

}  // namespace mpq::train
