#include "train/grad_registry.h"

#include <mutex>

namespace mpq::train {

const Tensor& GradContext::input(size_t i) const {
  if (!has_input(i)) fail("input {} is omitted", i);
  if (i >= inputs_.size() || !inputs_[i].defined())
    fail_internal("{} (backward): input {} was not saved for the backward pass (GradDef.saved_inputs)", node_.label(), i);
  return inputs_[i];
}

const Shape& GradContext::input_shape(size_t i) const {
  if (!has_input(i)) fail("input {} is omitted", i);
  return in_shapes_.at(i);
}

DType GradContext::input_dtype(size_t i) const {
  if (!has_input(i)) fail("input {} is omitted", i);
  return in_dtypes_.at(i);
}

const Tensor& GradContext::output(size_t i) const {
  if (i >= outputs_.size() || !outputs_[i].defined())
    fail_internal("{} (backward): output {} was not saved for the backward pass (GradDef.saved_outputs)", node_.label(), i);
  return outputs_[i];
}

const Shape& GradContext::output_shape(size_t i) const { return out_shapes_.at(i); }

const Tensor& GradContext::grad_output(size_t i) const {
  if (!has_grad_output(i)) fail_internal("{} (backward): output {} has no gradient", node_.label(), i);
  return grad_out_[i];
}

void GradContext::set_grad(size_t i, Tensor g) {
  if (!needs_grad(i)) return;
  if (g.shape() != in_shapes_.at(i))
    fail_internal("{} (backward): gradient of input {} has shape {}, the input has {}", node_.label(), i,
                  shape_str(g.shape()), shape_str(in_shapes_.at(i)));
  if (grads_.size() < in_shapes_.size()) grads_.resize(in_shapes_.size());
  grads_[i] = std::move(g);
}

void GradRegistry::add(GradDef def) {
  def.domain = ir::canonical_domain(def.domain);
  if (!def.fn) fail_internal("backward {}: no function", def.op_type);
  if (def.since > def.until) fail_internal("backward {}: empty opset range", def.op_type);
  for (const auto& d : defs_) {
    if (d->domain == def.domain && d->op_type == def.op_type && d->backend == def.backend && d->since <= def.until &&
        def.since <= d->until) {
      fail_internal("backward registry: {}{} on {} registered twice (opsets {}-{} and {}-{})",
                    def.domain.empty() ? "" : def.domain + "::", def.op_type, rt::backend_name(def.backend), d->since,
                    d->until, def.since, def.until);
    }
  }
  defs_.push_back(std::make_unique<GradDef>(std::move(def)));
}

const GradDef* GradRegistry::find(const std::string& domain, const std::string& op_type, int opset,
                                  rt::BackendKind backend) const {
  const std::string d = ir::canonical_domain(domain);
  for (const auto& def : defs_)
    if (def->backend == backend && def->op_type == op_type && def->domain == d && def->since <= opset &&
        opset <= def->until)
      return def.get();
  return nullptr;
}

std::vector<const GradDef*> GradRegistry::all() const {
  std::vector<const GradDef*> out;
  for (const auto& d : defs_) out.push_back(d.get());
  return out;
}

const GradRegistry& GradRegistry::global() {
  static GradRegistry* registry = [] {
    auto* r = new GradRegistry();
    register_all_grads(*r);
    return r;
  }();
  return *registry;
}

}  // namespace mpq::train
