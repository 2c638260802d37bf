// Backward of mpq::FakeQuant (runtime/cpu/fake_quant.h): the straight-through estimator with the
// clipping mask for X, and LSQ's step-size gradient for the scale (calib/quant_ref.h defines both
// per element; this is the fast version, checked against those references). The zero point is fixed.
//
// The scale's gradient sums over every element that shares it; the sum runs over fixed blocks of
// 16384 elements whose partial sums are added in block order, so it does not depend on the number
// of threads.
#include <cmath>
#include <vector>

#include "calib/quant_ref.h"
#include "runtime/cpu/fake_quant.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

namespace {

constexpr int64_t kBlock = 16384;

void fake_quant_grad(GradContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& g = ctx.grad_output(0);
  if (x.dtype() != DType::Float32 || g.dtype() != DType::Float32)
    ctx.fail_unsupported("fake quantization trains in float32, got {}", dtype_name(x.dtype()));
  const Tensor* zp = ctx.has_input(2) ? &ctx.input(2) : nullptr;
  const rt::cpu::FakeQuantLayout l = rt::cpu::fake_quant_layout(ctx.node(), x.shape(), ctx.input(1), zp);
  const float* xp = x.data<float>();
  const float* gp = g.data<float>();
  const bool want_x = ctx.needs_grad(0), want_s = ctx.needs_grad(1);
  Tensor dx = want_x ? Tensor(DType::Float32, x.shape()) : Tensor();
  float* dxp = want_x ? dx.data<float>() : nullptr;

  const int64_t blocks_per_run = std::max<int64_t>(1, (l.inner + kBlock - 1) / kBlock);
  const int64_t runs = l.outer * l.channels;
  std::vector<double> partial(static_cast<size_t>(runs * blocks_per_run), 0.0);
  ctx.pool().parallel_for(runs * blocks_per_run, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t w = lo; w < hi; ++w) {
      const int64_t r = w / blocks_per_run, b = w % blocks_per_run;
      const size_t c = static_cast<size_t>(r % l.channels);
      const float s = l.scale[c];
      const float zpf = static_cast<float>(l.zero_point[c]);
      const float lo_q = static_cast<float>(l.qmin), hi_q = static_cast<float>(l.qmax);
      const float below = lo_q - zpf, above = hi_q - zpf;
      const int64_t i0 = r * l.inner + b * kBlock, i1 = r * l.inner + std::min(l.inner, (b + 1) * kBlock);
      double acc = 0.0;
      for (int64_t i = i0; i < i1; ++i) {
        const float v = xp[i] / s;
        const float rv = std::nearbyint(v);
        const float q = rv + zpf;
        const bool inside = q >= lo_q && q <= hi_q;  // false for NaN
        if (dxp) dxp[i] = inside ? gp[i] : 0.0f;
        if (want_s) {
          const float slope = inside ? rv - v : (q < lo_q ? below : (q > hi_q ? above : 0.0f));
          acc += static_cast<double>(gp[i]) * static_cast<double>(slope);
        }
      }
      partial[static_cast<size_t>(w)] = acc;
    }
  });
  if (want_x) ctx.set_grad(0, std::move(dx));
  if (want_s) {
    const Tensor& scale = ctx.input(1);
    Tensor ds(DType::Float32, scale.shape());
    const int64_t per_scale = l.outer * l.inner;
    for (int64_t c = 0; c < l.channels; ++c) {
      double sum = 0.0;
      for (int64_t o = 0; o < l.outer; ++o)
        for (int64_t b = 0; b < blocks_per_run; ++b) sum += partial[static_cast<size_t>((o * l.channels + c) * blocks_per_run + b)];
      const double k = calib::lsq_grad_scale_ref(per_scale, l.zero_point[static_cast<size_t>(c)], l.qmax);
      ds.data<float>()[c] = static_cast<float>(sum * k);
    }
    ctx.set_grad(1, std::move(ds));
  }
}

// The export's int32 bias rounding is below a quantization step of the output: the gradient passes.
void fake_quant_bias_grad(GradContext& ctx) { ctx.set_grad(0, ctx.grad_output(0)); }

}  // namespace

void register_fake_quant_grads(GradRegistry& r) {
  GradDef b;
  b.domain = rt::cpu::kFakeQuantDomain;
  b.op_type = rt::cpu::kFakeQuantBiasOp;
  b.fn = fake_quant_bias_grad;
  b.differentiable = bit(0);
  r.add(std::move(b));
  GradDef d;
  d.domain = rt::cpu::kFakeQuantDomain;
  d.op_type = rt::cpu::kFakeQuantOp;
  d.fn = fake_quant_grad;
  d.differentiable = bit(0) | bit(1);
  d.saved_inputs = bit(0) | bit(1) | bit(2);
  r.add(std::move(d));
}

}  // namespace mpq::train::grads
