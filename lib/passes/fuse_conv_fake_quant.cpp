#include "passes/fuse_conv_fake_quant.h"

#include <cmath>

#include "passes/fuse_conv_activation.h"
#include "runtime/cpu/fake_quant.h"

namespace mpq::passes {

bool scalar_fake_quant(const ir::Node& fq, float& scale, float& lo, float& hi) {
  if (fq.domain != rt::cpu::kFakeQuantDomain || fq.op_type != rt::cpu::kFakeQuantOp) return false;
  if (fq.num_inputs() < 2 || fq.num_outputs() != 1 || !fq.output(0)) return false;
  const Tensor* s = constant_value(fq.input(1));
  if (!s || s->dtype() != DType::Float32 || s->numel() != 1) return false;
  scale = s->data<float>()[0];
  if (!(scale > 0) || !std::isfinite(scale)) return false;
  int64_t zp = 0;
  if (fq.num_inputs() > 2 && fq.input(2)) {
    const Tensor* z = constant_value(fq.input(2));
    if (!z || z->numel() != 1 || !dtype_is_integer(z->dtype())) return false;
    zp = z->get_int64(0);
  }
  const int64_t qmin = fq.attr_int("qmin", -128), qmax = fq.attr_int("qmax", 127);
  if (qmin >= qmax || zp < qmin || zp > qmax) return false;
  // FakeQuant computes float(qmin) - zp in float32; within 2^24 that equals float(qmin - zp).
  constexpr int64_t kExact = int64_t{1} << 24;
  if (qmin < -kExact || qmax > kExact || qmin - zp < -kExact || qmax - zp > kExact) return false;
  lo = static_cast<float>(qmin - zp);
  hi = static_cast<float>(qmax - zp);
  return true;
}

namespace {

// The float32 Conv / FusedConv whose output only this node reads.
ir::Node* fusable_producer(const ir::Model& model, const ir::Node& fq) {
  const ir::Value* x = fq.input(0);
  if (!x || !x->producer() || x->is_graph_output() || x->uses().size() != 1 || consumer_count(model, x) != 1)
    return nullptr;
  ir::Node* p = x->producer();
  const bool plain = p->domain.empty() && p->op_type == "Conv";
  if ((!plain && !is_fused_conv(*p)) || p->num_outputs() != 1 || p->num_inputs() < 2) return nullptr;
  if (p->has_attr("fake_quant")) return nullptr;
  const Tensor* w = constant_value(p->input(1));
  DType elem = x->type.is_tensor() ? x->type.elem : DType::Undefined;
  if (elem == DType::Undefined && w) elem = w->dtype();
  if (elem != DType::Float32) return nullptr;
  return p;
}

}  // namespace

bool FuseConvFakeQuant::match(const ir::Model& model, const ir::Node& node) const {
  float s = 0, lo = 0, hi = 0;
  return scalar_fake_quant(node, s, lo, hi) && fusable_producer(model, node) != nullptr;
}

void FuseConvFakeQuant::apply(ir::Model& model, ir::Node& node, PassStats& stats) {
  float s = 0, lo = 0, hi = 0;
  scalar_fake_quant(node, s, lo, hi);
  ir::Node* conv = fusable_producer(model, node);
  make_fused_conv(model, *conv);
  conv->set_attr(ir::Attribute::make_floats("fake_quant", {s, lo, hi}));
  absorb_into_conv(model, *conv, node, stats);
}

}  // namespace mpq::passes
