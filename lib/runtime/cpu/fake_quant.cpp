#include "runtime/cpu/fake_quant.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>

#include "runtime/cpu/common.h"
#include "runtime/cpu/quant_internal.h"
#include "runtime/cpu/register_all.h"

namespace mpq::rt::cpu {

FakeQuantLayout fake_quant_layout(const ir::Node& node, const Shape& x, const Tensor& scale, const Tensor* zero_point) {
  FakeQuantLayout l;
  const int64_t qmin = node.attr_int("qmin", -128), qmax = node.attr_int("qmax", 127);
  if (qmin >= qmax || qmin < INT32_MIN || qmax > INT32_MAX)
    fail_input("{}: quantized range [{}, {}] is empty or outside int32", node.label(), qmin, qmax);
  l.qmin = static_cast<int32_t>(qmin);
  l.qmax = static_cast<int32_t>(qmax);
  if (scale.dtype() != DType::Float32) fail_input("{}: scale must be float32, got {}", node.label(), dtype_name(scale.dtype()));
  const int64_t n = scale.numel();
  const int rank = static_cast<int>(x.size());
  if (n == 1) {
    l.inner = shape_numel(x);
  } else {
    int64_t axis = node.attr_int("axis", 1);
    if (axis < 0) axis += rank;
    if (axis < 0 || axis >= rank) fail_input("{}: axis {} is out of range for an input of rank {}", node.label(), node.attr_int("axis", 1), rank);
    if (x[static_cast<size_t>(axis)] != n)
      fail_input("{}: {} scales for axis {} of size {}", node.label(), n, axis, x[static_cast<size_t>(axis)]);
    l.channels = n;
    for (int d = 0; d < axis; ++d) l.outer *= x[static_cast<size_t>(d)];
    for (int d = static_cast<int>(axis) + 1; d < rank; ++d) l.inner *= x[static_cast<size_t>(d)];
  }
  l.scale.assign(scale.data<float>(), scale.data<float>() + n);
  for (float s : l.scale)
    if (!(s > 0) || !std::isfinite(s)) fail_input("{}: scale {} is not a positive finite number", node.label(), s);
  l.zero_point.assign(static_cast<size_t>(n), 0);
  if (zero_point && zero_point->defined()) {
    if (zero_point->numel() != n && zero_point->numel() != 1)
      fail_input("{}: {} zero points for {} scales", node.label(), zero_point->numel(), n);
    for (int64_t c = 0; c < n; ++c) {
      const int64_t z = zero_point->get_int64(zero_point->numel() == 1 ? 0 : c);
      if (z < l.qmin || z > l.qmax) fail_input("{}: zero point {} is outside [{}, {}]", node.label(), z, l.qmin, l.qmax);
      l.zero_point[static_cast<size_t>(c)] = static_cast<int32_t>(z);
    }
  }
  return l;
}

namespace {

template <bool kWide>
void fake_quantize_loop(const float* __restrict x, int64_t n, float s, float lo, float hi, float* __restrict y) {
  for (int64_t i = 0; i < n; ++i) y[i] = quant::fake_quantize_value<kWide>(x[i], s, lo, hi);
}

// The same loop built for AVX-512: 16 values per instruction. Division, comparisons, the
// magic-number rounding and the product are exact IEEE operations at any vector width: the bits of
// the SSE2 build. The file is built with -ffp-contract=off (lib/CMakeLists.txt) as a guard: no
// loop here multiplies then adds today, and a fused multiply-add would round once where the SSE2
// build rounds twice. U-Net's standalone FakeQuants (after Resize, MaxPool, ConvTranspose)
// took 9-10% of an INT8 run; one of 32 x 64 x 64 values, 49-52 -> 31-34 us (mpq run --profile).
// Not inlined, so that its 512-bit registers never reach baseline code (GCC ends it with vzeroupper).
__attribute__((target("avx512f"), noinline)) void fake_quantize_avx512(const float* __restrict x, int64_t n, float s,
                                                                       float lo, float hi, float* __restrict y) {
  for (int64_t i = 0; i < n; ++i) y[i] = quant::fake_quantize_value<false>(x[i], s, lo, hi);
}

std::atomic<bool> g_baseline_only{false};

bool use_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has && !g_baseline_only.load(std::memory_order_relaxed);
}

// Without the libm call (kWide false) the loop vectorizes.
void fake_quantize_run(const float* x, int64_t n, float s, float lo, float hi, float* y) {
  if (quant::fake_quant_wide(lo, hi)) return fake_quantize_loop<true>(x, n, s, lo, hi, y);
  if (use_avx512()) return fake_quantize_avx512(x, n, s, lo, hi, y);
  fake_quantize_loop<false>(x, n, s, lo, hi, y);
}

}  // namespace

ScopedFakeQuantBaseline::ScopedFakeQuantBaseline() : previous_(g_baseline_only.exchange(true)) {}
ScopedFakeQuantBaseline::~ScopedFakeQuantBaseline() { g_baseline_only.store(previous_); }
bool fake_quant_avx512() { return use_avx512(); }

void fake_quantize(ThreadPool& pool, const FakeQuantLayout& l, const float* x, float* y) {
  constexpr int64_t kGrain = 16384;  // elements per chunk: below it a second thread costs more than it saves
  auto bounds = [&](size_t c) {
    const float zp = static_cast<float>(l.zero_point[c]);
    return std::pair<float, float>{static_cast<float>(l.qmin) - zp, static_cast<float>(l.qmax) - zp};
  };
  if (l.channels == 1) {
    const auto [lo, hi] = bounds(0);
    const float s = l.scale[0];
    const int64_t n = l.outer * l.inner;
    pool.parallel_for(n, kGrain, [&](int64_t b, int64_t e) { fake_quantize_run(x + b, e - b, s, lo, hi, y + b); });
    return;
  }
  const int64_t runs = l.outer * l.channels;
  pool.parallel_for(runs, std::max<int64_t>(1, kGrain / std::max<int64_t>(l.inner, 1)), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const size_t c = static_cast<size_t>(r % l.channels);
      const auto [lo, hi] = bounds(c);
      fake_quantize_run(x + r * l.inner, l.inner, l.scale[c], lo, hi, y + r * l.inner);
    }
  });
}

bool fake_quantize_bias(const float* bias, int64_t channels, float input_scale, const float* weight_scales,
                        int64_t n_weight_scales, float* out) {
  for (int64_t c = 0; c < channels; ++c) {
    const float s = input_scale * weight_scales[n_weight_scales == 1 ? 0 : c];
    const double r = std::nearbyint(static_cast<double>(bias[c]) / static_cast<double>(s));
    if (!(std::fabs(r) <= static_cast<double>(INT32_MAX))) return false;
    // The float quotient below cannot round to 2^31 once the double one passed: 2^31 s is a float,
    // so a float bias just below it gives a quotient at most 2^31 - 128, which rounds below 2^31.
    out[c] = static_cast<float>(static_cast<int32_t>(std::nearbyint(bias[c] / s))) * s;
  }
  return true;
}

namespace {

void fake_quant_bias_kernel(KernelContext& ctx) {
  const Tensor& b = ctx.input(0);
  const Tensor& sx = ctx.input(1);
  const Tensor& sw = ctx.input(2);
  if (b.dtype() != DType::Float32 || sx.dtype() != DType::Float32 || sw.dtype() != DType::Float32)
    ctx.fail("bias and scales must be float32");
  if (b.rank() != 1 || sx.numel() != 1 || (sw.numel() != 1 && sw.numel() != b.numel()))
    ctx.fail("bias {} needs one input scale and one or {} weight scales, got {} and {}", shape_str(b.shape()), b.numel(),
             sx.numel(), sw.numel());
  Tensor& y = ctx.alloc_output(0, DType::Float32, b.shape());
  if (!fake_quantize_bias(b.data<float>(), b.numel(), sx.data<float>()[0], sw.data<float>(), sw.numel(), y.data<float>()))
    std::copy(b.data<float>(), b.data<float>() + b.numel(), y.data<float>());
}

void fake_quant_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.dtype() != DType::Float32) ctx.fail("X must be float32, got {}", dtype_name(x.dtype()));
  const FakeQuantLayout l = fake_quant_layout(ctx.node(), x.shape(), ctx.input(1), ctx.input_or_null(2));
  Tensor& y = ctx.alloc_output(0, DType::Float32, x.shape());
  fake_quantize(ctx.pool(), l, x.data<float>(), y.data<float>());
}

}  // namespace

void register_fake_quant(OpRegistry& r) {
  r.add_fn(kFakeQuantDomain, kFakeQuantOp, 1, kMaxOpset, BackendKind::CPU, fake_quant_kernel);
  r.add_fn(kFakeQuantDomain, kFakeQuantBiasOp, 1, kMaxOpset, BackendKind::CPU, fake_quant_bias_kernel);
}

}  // namespace mpq::rt::cpu
