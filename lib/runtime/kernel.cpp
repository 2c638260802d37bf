#include "runtime/kernel.h"

#include <atomic>
#include <mutex>

namespace mpq::rt {

const char* backend_name(BackendKind b) { return b == BackendKind::CPU ? "cpu" : "cuda"; }

SubgraphRunner& KernelContext::subgraphs() {
  if (!runner_) fail_internal("{}: no subgraph runner available", node_.label());
  return *runner_;
}

const Tensor& KernelContext::input(size_t i) const {
  if (!has_input(i)) fail("input {} is required but missing", i);
  return *inputs_[i];
}

bool KernelContext::input_reusable(size_t i) const {
  if (!reusable_ || i >= reusable_->size() || !(*reusable_)[i] || !has_input(i)) return false;
  const Tensor& t = *inputs_[i];
  // use_count 1: the executor's slot is the only holder, so writing cannot be seen elsewhere.
  if (!t.is_host() || !t.buffer() || t.buffer().use_count() != 1) return false;
  // use_count is a relaxed read: order this thread's writes after another thread's reads of the
  // buffer before it dropped its copy (per-layer validation hands tensors between threads).
  std::atomic_thread_fence(std::memory_order_acquire);
  return true;
}

Tensor& KernelContext::alloc_output(size_t i, DType dtype, Shape shape) {
  if (i >= outputs_.size()) fail("output {} does not exist (node has {} outputs)", i, outputs_.size());
  for (int64_t d : shape)
    if (d < 0) fail("computed a negative output dimension in {}", shape_str(shape));
  if (preferred_ && i < preferred_->size()) {
    const Tensor& view = (*preferred_)[i];
    if (view.defined() && view.dtype() == dtype && view.shape() == shape) {
      outputs_[i] = view;
      return outputs_[i];
    }
  }
  outputs_[i] = Tensor(dtype, std::move(shape));
  return outputs_[i];
}

void KernelContext::set_output(size_t i, Tensor t) {
  if (i >= outputs_.size()) fail("output {} does not exist (node has {} outputs)", i, outputs_.size());
  outputs_[i] = std::move(t);
}

namespace {
class FnKernel final : public OpKernel {
 public:
  explicit FnKernel(KernelFn fn) : fn_(fn) {}
  void compute(KernelContext& ctx) override { fn_(ctx); }

 private:
  KernelFn fn_;
};
}  // namespace

void OpRegistry::add(KernelDef def) {
  def.domain = ir::canonical_domain(def.domain);
  if (def.since > def.until) fail_internal("kernel {}: empty opset range", def.op_type);
  for (const auto& d : defs_) {
    if (d->domain == def.domain && d->op_type == def.op_type && d->backend == def.backend &&
        d->since <= def.until && def.since <= d->until) {
      fail_internal("kernel registry: {}{} on {} registered twice (opsets {}-{} and {}-{})",
                    def.domain.empty() ? "" : def.domain + "::", def.op_type, backend_name(def.backend), d->since,
                    d->until, def.since, def.until);
    }
  }
  defs_.push_back(std::make_unique<KernelDef>(std::move(def)));
}

void OpRegistry::add_fn(const std::string& domain, const std::string& op_type, int since, int until,
                        BackendKind backend, KernelFn fn, bool native_low_precision) {
  KernelDef def;
  def.domain = domain;
  def.op_type = op_type;
  def.since = since;
  def.until = until;
  def.backend = backend;
  def.native_low_precision = native_low_precision;
  def.factory = [fn](const ir::Node&, int) { return std::make_unique<FnKernel>(fn); };
  add(std::move(def));
}

const KernelDef* OpRegistry::find(const std::string& domain, const std::string& op_type, int opset,
                                  BackendKind backend) const {
  std::string d = ir::canonical_domain(domain);
  for (const auto& def : defs_)
    if (def->backend == backend && def->op_type == op_type && def->domain == d && def->since <= opset &&
        opset <= def->until)
      return def.get();
  return nullptr;
}

std::vector<const KernelDef*> OpRegistry::all() const {
  std::vector<const KernelDef*> out;
  for (const auto& d : defs_) out.push_back(d.get());
  return out;
}

const OpRegistry& OpRegistry::global() {
  static const OpRegistry* registry = [] {
    auto* r = new OpRegistry();
    register_all(*r);
    return r;
  }();
  return *registry;
}

}  // namespace mpq::rt
