#include "runtime/cpu/conv_onednn.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "runtime/cpu/channel_blocks.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/quantize_nhwc.h"
#include "runtime/batch_rows.h"
#include "runtime/thread_pool.h"

#if MPQ_HAVE_ONEDNN
#include <omp.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <list>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>
#endif

namespace mpq::rt::cpu {

namespace {
// -1: as the environment says (MPQ_ONEDNN=0 switches oneDNN off); otherwise ScopedOnednn's
// OnednnUse.
std::atomic<int> g_override{-1};
std::atomic<uint64_t> g_conv_count{0};
std::atomic<uint64_t> g_split_count{0};
std::atomic<uint64_t> g_int8_count{0};
// -1: as the environment says (MPQ_CONV_TUNING=0 switches the measured choice off); otherwise
// ScopedConvTuning's setting.
std::atomic<int> g_tuning{-1};
std::atomic<uint64_t> g_tuned_count{0};
}  // namespace

uint64_t onednn_conv_count() { return g_conv_count.load(std::memory_order_relaxed); }
uint64_t onednn_batch_split_count() { return g_split_count.load(std::memory_order_relaxed); }
uint64_t onednn_int8_conv_count() { return g_int8_count.load(std::memory_order_relaxed); }
uint64_t onednn_tuned_count() { return g_tuned_count.load(std::memory_order_relaxed); }

bool conv_tuning_enabled() {
  const int o = g_tuning.load(std::memory_order_relaxed);
  if (o >= 0) return o != 0;
  static const bool from_env = [] {
    const char* v = std::getenv("MPQ_CONV_TUNING");
    return !(v && v[0] == '0');
  }();
  return from_env;
}

ScopedConvTuning::ScopedConvTuning(bool on) : previous_(g_tuning.exchange(on ? 1 : 0)) {}
ScopedConvTuning::~ScopedConvTuning() { g_tuning.store(previous_); }

bool onednn_available() {
#if MPQ_HAVE_ONEDNN
  return true;
#else
  return false;
#endif
}

bool onednn_enabled() {
  if (!onednn_available()) return false;
  const int o = g_override.load(std::memory_order_relaxed);
  if (o >= 0) return o != static_cast<int>(OnednnUse::Off);
  static const bool from_env = [] {
    const char* v = std::getenv("MPQ_ONEDNN");
    return !(v && v[0] == '0');
  }();
  return from_env;
}

#if MPQ_HAVE_ONEDNN
// Inside a DeterministicBlas scope (training) oneDNN's convolutions run where the scope allows them
// (the engine's FP32 CPU steps), with MPQ_ONEDNN=all, or with OnednnUse::Always. Training with
// mixed precision keeps mpq's kernels: it is the CPU reference for the CUDA path, whose
// host-compiled kernel bodies sum as mpq's do, and oneDNN's other rounding, amplified by
// FakeQuant, would move its losses apart (check_qat.py's 6-step comparison: 0.000 with mpq's
// kernels, a relative gap of 0.121 with oneDNN's).
bool onednn_allowed_here() {
  if (g_override.load(std::memory_order_relaxed) == static_cast<int>(OnednnUse::Always)) return true;
  if (!deterministic_blas() || deterministic_onednn_convolutions()) return true;
  static const bool train = [] {
    const char* v = std::getenv("MPQ_ONEDNN");
    return v && std::string(v) == "all";
  }();
  return train;
}
#endif

ScopedOnednn::ScopedOnednn(OnednnUse use) : previous_(g_override.exchange(static_cast<int>(use))) {}
ScopedOnednn::~ScopedOnednn() { g_override.store(previous_); }

#if !MPQ_HAVE_ONEDNN

struct OnednnConvState::Impl {};
OnednnConvState::OnednnConvState() = default;
OnednnConvState::~OnednnConvState() = default;

bool onednn_conv_forward(ThreadPool&, const DnnlConvShape&, const float*, const float*, const float*, const float*,
                         float*, OnednnConvState*) {
  return false;
}
bool onednn_conv_backward_data(ThreadPool&, const DnnlConvShape&, const float*, const float*, float*) { return false; }
bool onednn_conv_backward_weights(ThreadPool&, const DnnlConvShape&, const float*, const float*, float*) { return false; }
int64_t onednn_channel_block() { return 0; }
bool onednn_int8_convolutions() { return false; }
int onednn_team_size(double, int) { return 1; }
bool onednn_allowed_here() { return false; }
bool onednn_channels_last_direct() { return false; }
bool onednn_bf16_cores() { return false; }

#else

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// Everything DnnlConvShape holds, the OpenMP team size and the direction, as a hashable key.
using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, float,
                       float, int, int, int64_t, int64_t, int64_t, bool, float, float, float, bool>;
// What a plan computes: the forward, dX (backward data) or dW (backward weights).
enum class Direction { Forward, Data, Weights };
Key key_of(const DnnlConvShape& s, int threads, Direction direction) {
  return {s.n,  s.c,  s.m,  s.group, s.ih, s.iw, s.kh, s.kw, s.sh, s.sw, s.dh, s.dw, s.pt, s.pl, s.pb, s.pr,
          s.oh, s.ow, s.bias, s.residual, static_cast<int>(s.act), s.p0, s.p1, threads, static_cast<int>(direction), s.x_block,
          s.z_block, s.y_block, s.fake_quant, s.fq_scale, s.fq_lo, s.fq_hi, s.int8 != nullptr};
}
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = 0;
    std::apply([&](const auto&... v) { ((h = h * 1000003u ^ std::hash<std::decay_t<decltype(v)>>{}(v)), ...); }, k);
    return h;
  }
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// oneDNN's implementation names for a JIT direct convolution (see Plan::direct).
bool is_direct_impl(const std::string& impl) {
  return impl.rfind("jit", 0) == 0 || impl.rfind("brgconv", 0) == 0 || impl.rfind("brdgmm", 0) == 0;
}

// One convolution's primitives: the convolution on oneDNN's preferred layouts and the reorders
// from and to the plain NCHW / OIHW tensors mpq holds. Primitives are immutable once created and
// may be executed by several threads at once; the blocked buffers and the convolution's scratch
// memory are per thread.
struct Plan {
  memory::desc user_src, user_wei, user_dst, user_bias;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward conv;
  memory::desc user_z;  // the residual's layout (forward)
  dnnl::reorder src_in, wei_in, dst_out, z_in;
  bool reorder_src = false, reorder_wei = false, reorder_dst = false, reorder_z = false;
  // A JIT direct kernel, not oneDNN's im2col + GEMM or reference fallback: "jit:..." or, where
  // oneDNN prefers its batch-reduce kernels (AVX-512 cores with BF16 / AMX, e.g. Sapphire Rapids,
  // for the forward), "brgconv:..." / "brgconv_1x1:..." and, for depthwise, "brdgmm_dw:..."
  // (which takes no channel-blocked input: those run mpq's blocked depthwise kernel).
  bool direct = false;
  // The forward's buffer sizes, queried once: each query is a call into oneDNN and a descriptor
  // copy, twice per convolution and run otherwise.
  size_t src_bytes = 0, wei_bytes = 0, dst_bytes = 0, pad_bytes = 0;
  // The fused fake quantization's divisor: one float the binary post-op reads (see post_ops_of).
  std::unique_ptr<float> fq_scale;
  memory fq_scale_mem;
  int fq_scale_arg = 0;  // DNNL_ARG_ATTR_MULTIPLE_POST_OP(index) | DNNL_ARG_SRC_1
  // In integers (DnnlConvShape::int8): src_in and wei_in scale by a per-call factor (1 / x_scale,
  // 1 / w_scale per output channel), and the first post-op multiplies by the per-channel `out`.
  bool int8 = false;
  memory::desc x_scale_desc, w_scale_desc, out_scale_desc;
  // Their scratch memory, given per call (user mode): with library-managed scratch, oneDNN keeps
  // one buffer per primitive, and a scaling reorder run by two threads at once (the batch split
  // over single-thread executors) gave wrong results.
  size_t src_in_pad_bytes = 0, wei_in_pad_bytes = 0;
  // The int8 source is dense NHWC and X plain NCHW or NHWC: mpq's quantize_to_nhwc_s8 writes it
  // (the same values as src_in; oneDNN's NCHW -> NHWC quantizing reorder is slow).
  bool quantize_src_here = false;
  // The result is dense NHWC float and Y plain NCHW: channels_last_to_plain writes Y (the same
  // values as dst_out).
  bool dst_channels_last_to_plain = false;
  // Backward data (training): dX from dY and W; src_in reorders dY, dst_out dX.
  dnnl::convolution_backward_data::primitive_desc bwd_pd;
  dnnl::convolution_backward_data bwd;
  // Backward weights (training): dW from X and dY; src_in reorders X, z_in dY, dst_out dW.
  dnnl::convolution_backward_weights::primitive_desc bww_pd;
  dnnl::convolution_backward_weights bww;
};

// Whether an int8 convolution's fused fake quantization multiplies by 1 / fq_scale (see
// post_ops_of) rather than divides: not where that factor overflows (a scale below 1 / FLT_MAX,
// about 2.9e-39, a subnormal), where the product would be inf, or NaN for a zero sum, instead of
// the quotient's bound or zero.
bool requantize_by_factor(const DnnlConvShape& s) {
  return s.int8 != nullptr && std::isfinite(1.0f / s.fq_scale);
}

dnnl::post_ops post_ops_of(const DnnlConvShape& s) {
  dnnl::post_ops po;
  using A = dnnl::algorithm;
  // In integers: the int32 sums (plus the divided bias) back to float first, per output channel.
  if (s.int8) po.append_binary(A::binary_mul, memory::desc({1, s.m, 1, 1}, dt::f32, tag::nchw));
  // Y = act(conv + bias + Z): the sum post-op adds what the destination holds before the
  // convolution writes it, so Z is copied (reordered) into the destination first.
  if (s.residual) po.append_sum(1.0f);
  switch (s.act) {
    case DnnlAct::None: break;
    case DnnlAct::Relu: po.append_eltwise(1.0f, A::eltwise_relu, 0.0f, 0.0f); break;
    case DnnlAct::LeakyRelu: po.append_eltwise(1.0f, A::eltwise_relu, s.p0, 0.0f); break;
    case DnnlAct::Clip: po.append_eltwise(1.0f, A::eltwise_clip_v2, s.p0, s.p1); break;
    case DnnlAct::Sigmoid: po.append_eltwise(1.0f, A::eltwise_logistic, 0.0f, 0.0f); break;
    case DnnlAct::Tanh: po.append_eltwise(1.0f, A::eltwise_tanh, 0.0f, 0.0f); break;
    case DnnlAct::HardSwish: po.append_eltwise(1.0f, A::eltwise_hardswish, 0.0f, 0.0f); break;
    case DnnlAct::HardSigmoid:
      // oneDNN 2.6 has no hardsigmoid: max(0, min(1, a*v + b)) as linear then clip.
      po.append_eltwise(1.0f, A::eltwise_linear, s.p0, s.p1);
      po.append_eltwise(1.0f, A::eltwise_clip_v2, 0.0f, 1.0f);
      break;
  }
  if (s.fake_quant) {
    // fake_quantize_value: a division (a multiply by 1/s would round differently), the clamp to
    // the integer bounds, rounding half to even, and the product with s (linear with beta 0: one
    // rounding, as v * s). A NaN is not mapped to 0 as FakeQuant does: oneDNN's clip (max, then
    // min) turns it into the lower bound, so it comes out as fq_lo * s. mpq::FusedConv is for
    // `mpq run`, where a NaN activation is already wrong.
    //
    // An int8 convolution requantizes as integer engines do (ONNX Runtime's QLinearConv, oneDNN's
    // output scales): a multiply by 1/s. Its sums are exact where the float path's round, so it
    // is not the float path's bits anyway; the product differs from the quotient by an ulp at most,
    // which moves a value by one step only where it lies within an ulp of a rounding tie. The
    // division cost 2-7% of an INT8 ResNet or U-Net run on one thread (median of the fastest runs
    // of 9 processes each, batch 1 and 8). The factor is a binary post-op like the divisor: an
    // eltwise_linear in its place gave wrong results in oneDNN 2.6's int8 kernel (int8_conv_test
    // failed, values off by up to 23).
    po.append_binary(requantize_by_factor(s) ? A::binary_mul : A::binary_div,
                     memory::desc({1, 1, 1, 1}, dt::f32, tag::nchw));
    po.append_eltwise(1.0f, A::eltwise_clip, s.fq_lo, s.fq_hi);
    po.append_eltwise(1.0f, A::eltwise_round, 0.0f, 0.0f);
    po.append_eltwise(1.0f, A::eltwise_linear, s.fq_scale, 0.0f);
  }
  return po;
}

// What both backward plans share: the tensor dimensions, oneDNN's free ("any") layouts, the window,
// the forward_training primitive descriptor oneDNN takes as the hint for a backward one, and an
// attribute with caller-owned scratch memory (as in make_plan).
struct BackwardDescs {
  memory::dims src, dst, wei, strides, dil, pl, pr;
  memory::desc any_src, any_wei, any_dst, user_wei;
  dnnl::convolution_forward::primitive_desc hint;
  dnnl::primitive_attr attr;
};

BackwardDescs backward_descs(const DnnlConvShape& s) {
  BackwardDescs d;
  d.src = {s.n, s.c, s.ih, s.iw};
  d.dst = {s.n, s.m, s.oh, s.ow};
  d.wei = s.group > 1 ? memory::dims{s.group, s.m / s.group, s.c / s.group, s.kh, s.kw} : memory::dims{s.m, s.c, s.kh, s.kw};
  d.strides = {s.sh, s.sw};
  d.dil = {s.dh - 1, s.dw - 1};
  d.pl = {s.pt, s.pl};
  d.pr = {s.pb, s.pr};
  d.any_src = memory::desc(d.src, dt::f32, tag::any);
  d.any_wei = memory::desc(d.wei, dt::f32, tag::any);
  d.any_dst = memory::desc(d.dst, dt::f32, tag::any);
  d.user_wei = memory::desc(d.wei, dt::f32, s.group > 1 ? tag::goihw : tag::oihw);
  d.hint = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct, d.any_src,
                                      d.any_wei, memory::desc(), d.any_dst, d.strides, d.dil, d.pl, d.pr),
      engine());
  d.attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return d;
}

std::shared_ptr<Plan> make_backward_data_plan(const DnnlConvShape& s) {
  auto p = std::make_shared<Plan>();
  const BackwardDescs d = backward_descs(s);
  p->user_src = memory::desc(d.dst, dt::f32, tag::nchw);  // dY
  p->user_dst = memory::desc(d.src, dt::f32, tag::nchw);  // dX
  p->user_wei = d.user_wei;
  p->bwd_pd = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(dnnl::algorithm::convolution_direct, d.any_src, d.any_wei, d.any_dst,
                                            d.strides, d.dil, d.pl, d.pr),
      d.attr, engine(), d.hint);
  const std::string impl = p->bwd_pd.impl_info_str();
  p->direct = is_direct_impl(impl);
  if (!p->direct) return p;
  p->bwd = dnnl::convolution_backward_data(p->bwd_pd);
  p->reorder_src = p->bwd_pd.diff_dst_desc() != p->user_src;
  p->reorder_wei = p->bwd_pd.weights_desc() != p->user_wei;
  p->reorder_dst = p->bwd_pd.diff_src_desc() != p->user_dst;
  if (p->reorder_src)
    p->src_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p->user_src, engine(), p->bwd_pd.diff_dst_desc()));
  if (p->reorder_wei)
    p->wei_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p->user_wei, engine(), p->bwd_pd.weights_desc()));
  if (p->reorder_dst)
    p->dst_out = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p->bwd_pd.diff_src_desc(), engine(), p->user_dst));
  return p;
}

// dW of one block of images on the calling thread alone (see onednn_conv_backward_weights). No
// bias gradient: conv_grad's own sums it in double.
std::shared_ptr<Plan> make_backward_weights_plan(const DnnlConvShape& s) {
  auto p = std::make_shared<Plan>();
  const BackwardDescs d = backward_descs(s);
  p->user_src = memory::desc(d.src, dt::f32, tag::nchw);  // X
  p->user_z = memory::desc(d.dst, dt::f32, tag::nchw);    // dY
  p->user_wei = d.user_wei;
  p->bww_pd = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, d.any_src, d.any_wei, memory::desc(),
                                               d.any_dst, d.strides, d.dil, d.pl, d.pr),
      d.attr, engine(), d.hint);
  p->direct = is_direct_impl(p->bww_pd.impl_info_str());
  if (!p->direct) return p;
  p->bww = dnnl::convolution_backward_weights(p->bww_pd);
  p->src_bytes = p->bww_pd.src_desc().get_size();
  p->dst_bytes = p->bww_pd.diff_dst_desc().get_size();
  p->wei_bytes = p->bww_pd.diff_weights_desc().get_size();
  p->pad_bytes = p->bww_pd.scratchpad_desc().get_size();
  p->reorder_src = p->bww_pd.src_desc() != p->user_src;
  p->reorder_z = p->bww_pd.diff_dst_desc() != p->user_z;
  p->reorder_wei = p->bww_pd.diff_weights_desc() != p->user_wei;
  if (p->reorder_src) p->src_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p->user_src, engine(), p->bww_pd.src_desc()));
  if (p->reorder_z) p->z_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p->user_z, engine(), p->bww_pd.diff_dst_desc()));
  if (p->reorder_wei)
    p->dst_out = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p->bww_pd.diff_weights_desc(), engine(), p->user_wei));
  return p;
}

// Plain NCHW, or the channel-blocked layouts of runtime/cpu/channel_blocks.h (aBcd8b is nChw8c;
// kChannelsLast is NHWC).
memory::desc activation_desc(const memory::dims& dims, int64_t block) {
  if (block == 8) return memory::desc(dims, dt::f32, tag::aBcd8b);
  if (block == 16) return memory::desc(dims, dt::f32, tag::aBcd16b);
  if (block == kChannelsLast) return memory::desc(dims, dt::f32, tag::nhwc);
  return memory::desc(dims, dt::f32, tag::nchw);
}

std::shared_ptr<Plan> make_plan(const DnnlConvShape& s);

// The float plan of s, for an int8 convolution oneDNN has no direct int8 kernel for (its int8
// kernels take NHWC only: on a CPU where tensors stay nChw8c, for instance). The values are the
// same either way; the plan says which it is (Plan::int8).
std::shared_ptr<Plan> float_plan_of(const DnnlConvShape& s) {
  DnnlConvShape f = s;
  f.int8 = nullptr;
  return make_plan(f);
}

std::shared_ptr<Plan> make_plan(const DnnlConvShape& s) {
  auto p = std::make_shared<Plan>();
  const memory::dims src{s.n, s.c, s.ih, s.iw}, dst{s.n, s.m, s.oh, s.ow};
  const memory::dims wei = s.group > 1 ? memory::dims{s.group, s.m / s.group, s.c / s.group, s.kh, s.kw}
                                       : memory::dims{s.m, s.c, s.kh, s.kw};
  p->user_src = activation_desc(src, s.x_block);
  p->user_dst = activation_desc(dst, s.y_block);
  // A first layer (a few input channels, the image) writing 16 channels channels-last: NHWC with
  // C = 16 is nChw16c byte for byte, and oneDNN has a direct kernel for plain NCHW in and nChw16c
  // out (as in an FP32 model) but gives NHWC out only to brgconv, which wants X reordered to NHWC
  // first. INT8 ResNet's stem at batch 1: 12.7 us in brgconv plus a 1.7 us reorder of X, 10 us in
  // the direct kernel (DNNL_VERBOSE, one thread).
  if (s.y_block == kChannelsLast && s.m == 16 && s.group == 1 && s.c < 8 && !s.residual && s.int8 == nullptr &&
      s.x_block == 0)
    p->user_dst = activation_desc(dst, 16);
  p->user_z = activation_desc(dst, s.z_block);
  p->user_wei = memory::desc(wei, dt::f32, s.group > 1 ? tag::goihw : tag::oihw);
  p->user_bias = s.bias ? memory::desc({s.m}, dt::f32, tag::x) : memory::desc();
  // In integers: int8 source and weights in layouts of oneDNN's choice (X arrives in its float
  // layout and is reordered every call); group 1 only, where one scale per output channel is one
  // per weight row.
  p->int8 = s.int8 != nullptr;
  if (p->int8 && s.group != 1) return float_plan_of(s);
  const dt in_type = p->int8 ? dt::s8 : dt::f32;
  dnnl::primitive_attr attr;
  const dnnl::post_ops po = post_ops_of(s);
  attr.set_post_ops(po);
  if (s.fake_quant) {  // the divisor, or for an int8 convolution the factor 1 / s
    p->fq_scale = std::make_unique<float>(requantize_by_factor(s) ? 1.0f / s.fq_scale : s.fq_scale);
    p->fq_scale_mem = memory(memory::desc({1, 1, 1, 1}, dt::f32, tag::nchw), engine(), p->fq_scale.get());
    p->fq_scale_arg = DNNL_ARG_ATTR_MULTIPLE_POST_OP(po.len() - 4) | DNNL_ARG_SRC_1;
  }
  // Scratch memory comes from the caller (per thread), so that one plan may run on several threads
  // at once whatever oneDNN's build options.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // tag::any lets oneDNN pick its blocked layouts, where its direct (jit) kernels run; on plain
  // NCHW it would fall back to im2col + GEMM, no faster than mpq's own. A tensor that already is
  // channel-blocked is taken (or written) in that layout, so that no reorder is needed.
  auto d = dnnl::convolution_forward::desc(
      dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
      s.x_block && !p->int8 ? p->user_src : memory::desc(src, in_type, tag::any), memory::desc(wei, in_type, tag::any),
      p->user_bias, s.y_block ? p->user_dst : memory::desc(dst, dt::f32, tag::any), {s.sh, s.sw},
      {s.dh - 1, s.dw - 1}, {s.pt, s.pl}, {s.pb, s.pr});
  try {
    p->pd = dnnl::convolution_forward::primitive_desc(d, attr, engine());
  } catch (const dnnl::error& e) {
    if (!p->int8 || e.status != dnnl_unimplemented) throw;
    return float_plan_of(s);
  }
  const std::string impl = p->pd.impl_info_str();
  p->direct = is_direct_impl(impl);
  // In integers only with a direct kernel that computes them exactly. Without VNNI, oneDNN's int8
  // kernels for signed input halve the weights when it reorders them (scale_adjust 0.5, so that
  // their 16-bit intermediate sums cannot overflow) and double the result: every odd weight would
  // lose a step.
  if (p->int8) {
    const auto extra = p->pd.weights_desc().data.extra;
    const bool adjusted = (extra.flags & dnnl_memory_extra_flag_scale_adjust) != 0 && extra.scale_adjust != 1.0f;
    if (!p->direct || adjusted) return float_plan_of(s);
  }
  if (!p->direct) return p;  // mpq runs it; the primitive is never needed
  p->conv = dnnl::convolution_forward(p->pd);
  p->src_bytes = p->pd.src_desc().get_size();
  p->wei_bytes = p->pd.weights_desc().get_size();
  p->dst_bytes = p->pd.dst_desc().get_size();
  p->pad_bytes = p->pd.scratchpad_desc().get_size();
  p->reorder_src = p->pd.src_desc() != p->user_src;
  p->reorder_wei = p->pd.weights_desc() != p->user_wei;
  p->reorder_dst = p->pd.dst_desc() != p->user_dst;
  p->reorder_z = s.residual && p->pd.dst_desc() != p->user_z;
  // Quantizing reorders: round(x * scale), half to even, saturated (the scale given per call).
  dnnl::primitive_attr x_scaled, w_scaled;
  if (p->int8) {
    x_scaled.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
    w_scaled.set_output_scales(1 << 0, {DNNL_RUNTIME_F32_VAL});
    x_scaled.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    w_scaled.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    p->x_scale_desc = memory::desc({1}, dt::f32, tag::x);
    p->w_scale_desc = memory::desc({s.m}, dt::f32, tag::x);
    p->out_scale_desc = memory::desc({1, s.m, 1, 1}, dt::f32, tag::nchw);
  }
  try {
    if (p->reorder_src) {
      const dnnl::reorder::primitive_desc rpd(engine(), p->user_src, engine(), p->pd.src_desc(), x_scaled);
      p->src_in = dnnl::reorder(rpd);
      if (p->int8) p->src_in_pad_bytes = rpd.scratchpad_desc().get_size();
    }
    if (p->reorder_wei) {
      const dnnl::reorder::primitive_desc rpd(engine(), p->user_wei, engine(), p->pd.weights_desc(), w_scaled);
      p->wei_in = dnnl::reorder(rpd);
      if (p->int8) p->wei_in_pad_bytes = rpd.scratchpad_desc().get_size();
    }
  } catch (const dnnl::error& e) {
    // No quantizing reorder for these layouts: oneDNN's float plan rather than mpq's kernels.
    if (!p->int8 || e.status != dnnl_unimplemented) throw;
    return float_plan_of(s);
  }
  p->quantize_src_here = p->int8 && p->reorder_src && (s.x_block == 0 || s.x_block == kChannelsLast) &&
                         p->pd.src_desc() == memory::desc(src, dt::s8, tag::nhwc);
  p->dst_channels_last_to_plain = p->reorder_dst && s.y_block == 0 &&
                                  p->pd.dst_desc() == memory::desc(dst, dt::f32, tag::nhwc) &&
                                  p->user_dst == memory::desc(dst, dt::f32, tag::nchw);
  if (p->reorder_dst)
    p->dst_out = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p->pd.dst_desc(), engine(), p->user_dst));
  if (p->reorder_z) p->z_in = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), p->user_z, engine(), p->pd.dst_desc()));
  return p;
}

// Bounded least-recently-used cache of plans: a model has a few dozen convolution shapes per batch
// size; the bound only keeps a long-lived process that sees many shapes from growing without end.
constexpr size_t kMaxPlans = 256;

class PlanCache {
 public:
  std::shared_ptr<Plan> get(const DnnlConvShape& s, int threads, Direction direction = Direction::Forward) {
    const Key k = key_of(s, threads, direction);
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = map_.find(k);
      if (it != map_.end()) {
        order_.splice(order_.begin(), order_, it->second.second);
        return it->second.first;
      }
    }
    std::shared_ptr<Plan> p;  // milliseconds: outside the lock
    try {
      p = direction == Direction::Data      ? make_backward_data_plan(s)
          : direction == Direction::Weights ? make_backward_weights_plan(s)
                                            : make_plan(s);
    } catch (const dnnl::error& e) {
      // No implementation at all for these layouts: mpq's kernels run the shape. Anything else
      // (out of memory, a bad descriptor) is a real error.
      if (e.status != dnnl_unimplemented) throw;
      spdlog::debug("oneDNN has no convolution for this shape and layout; mpq's kernels run it");
      p = std::make_shared<Plan>();
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(k);
    if (it != map_.end()) return it->second.first;
    order_.push_front(k);
    map_.emplace(k, std::make_pair(p, order_.begin()));
    if (map_.size() > kMaxPlans) {
      map_.erase(order_.back());
      order_.pop_back();
    }
    return p;
  }

 private:
  std::mutex mu_;
  std::list<Key> order_;
  std::unordered_map<Key, std::pair<std::shared_ptr<Plan>, std::list<Key>::iterator>, KeyHash> map_;
};

PlanCache& cache() {
  static PlanCache c;
  return c;
}

// Per-thread scratch for the blocked copies, kept between calls (allocating per call made glibc
// hand large buffers back to the OS and fault them in again every run). 64-byte aligned for the
// vector loads of oneDNN's kernels.
struct Scratch {
  std::vector<float> buf;
  float* get(size_t bytes) {
    const size_t floats = bytes / sizeof(float) + 16;
    if (buf.size() < floats) buf.assign(floats, 0.0f);
    auto addr = reinterpret_cast<uintptr_t>(buf.data());
    return reinterpret_cast<float*>((addr + 63) & ~uintptr_t{63});
  }
};

}  // namespace

// Which convolutions mpq's own kernels run faster, from tests/bench_conv on the shipped models'
// shapes (one thread, AVX2; docs/runtime.md). A oneDNN call costs about 10 us more than mpq's
// however small the convolution (four primitives: source, weights and result reorders around the
// convolution), so:
//   * pointwise convolutions (1x1, stride 1, no padding) stay one OpenBLAS GEMM on the NCHW input,
//     with no reorder: 1.1-3.9x faster than oneDNN on these shapes (0.9x on one);
//   * other dense convolutions under kMinDenseMacs multiply-adds stay with mpq (1x1 stride-2
//     shortcuts and the ViT's patch embedding at batch 1: oneDNN 1.2-1.8x slower);
//   * depthwise ones always go to oneDNN (0.2-0.8x mpq's time; 1.2x on the smallest, 16 channels
//     at 8x8 output, batch 1: 15 vs 12 us, kept for one simple rule).
// Training's dX (Direction::Data) also stays with mpq where oneDNN's backward-data kernels pad the
// channels to their block: `bench_conv_grad` (batch 64, 3x3 at 28x28, one thread, AVX-512) measured
// them slower wherever the input channels were not a multiple of the block (1-12 channels: 1.4-3.4x
// mpq's time; 16: 0.64x), and with 3 output channels (3.1x); 8 and 24 output channels were 0.85x
// and 0.94x. The weight gradient had no such pattern (0.3-0.7x on these shapes, 1.1x on one).
constexpr double kMinDenseMacs = 200e3;

bool mpq_is_faster(const DnnlConvShape& s, Direction direction) {
  if (direction == Direction::Data) {
    const int64_t block = onednn_channel_block();
    if (block <= 0 || (s.c / s.group) % block != 0 || s.m / s.group < 8) return true;
  }
  const bool depthwise = s.group > 1 && s.group == s.c;
  if (depthwise) return false;
  const bool pointwise =
      s.kh == 1 && s.kw == 1 && s.sh == 1 && s.sw == 1 && s.pt == 0 && s.pl == 0 && s.pb == 0 && s.pr == 0;
  if (pointwise) return true;
  const double macs = static_cast<double>(s.n) * static_cast<double>(s.m) * static_cast<double>(s.oh * s.ow) *
                      static_cast<double>(s.c / s.group) * static_cast<double>(s.kh * s.kw);
  return macs < kMinDenseMacs;
}

// A second thread pays only from some size on: oneDNN splits the work and joins at a barrier, and a
// convolution here is four parallel regions (three reorders and the convolution). Where idle threads
// sleep between regions (OMP_WAIT_POLICY=PASSIVE, which `mpq` sets on a busy machine; a futex
// wake-up, about 15 us, per region, and a wait for a core at each barrier) the break-even is about
// 4M multiply-adds; where they spin briefly (a quiet machine, apps/mpq/main.cpp), 0.3M measured best
// of 4M, 1M and 0.3M (scripts/bench_run.py, 2 threads, geometric mean mpq/ONNX Runtime over 20 rows:
// 1.05, 1.06, 0.98, two rounds each). Smaller convolutions run on the calling thread alone. The
// result is the same either way (direct kernels, see header).
double macs_per_thread() {
  static const double macs = [] {
    const char* policy = std::getenv("OMP_WAIT_POLICY");
    return policy != nullptr && (std::string(policy) == "PASSIVE" || std::string(policy) == "passive") ? 4e6 : 3e5;
  }();
  return macs;
}

int onednn_team_size(double macs, int threads) {
  // OnednnUse::Always (tests) uses every thread, so that one and two threads are really compared.
  if (g_override.load(std::memory_order_relaxed) == static_cast<int>(OnednnUse::Always)) return std::max(threads, 1);
  return static_cast<int>(std::clamp(macs / macs_per_thread(), 1.0, static_cast<double>(std::max(threads, 1))));
}

int team_size(const DnnlConvShape& s, int threads) {
  const double outputs = static_cast<double>(s.n) * static_cast<double>(s.m) * static_cast<double>(s.oh * s.ow);
  double macs = outputs * static_cast<double>(s.c / s.group) * static_cast<double>(s.kh * s.kw);
  // A float convolution's fused fake quantization divides every output: about the time of 24
  // multiply-adds each. INT8 ResNet's stem (3 -> 16 channels, 32 x 32, 0.44M multiply-adds), one
  // thread against two, oneDNN alone: 6.0 and 6.4 us without it, 10.5 and 7.5 us with it.
  if (s.fake_quant && s.int8 == nullptr) macs += 24.0 * outputs;
  // With a batch, oneDNN gives each thread whole images, which costs less to split than the
  // spatial or channel blocks of one image: a batched convolution gets the second thread from a
  // third of the size. `mpq run --repeat 300 --threads 2`, three runs each: MobileNetV3 at batch
  // 8 0.31 -> 0.25 ms, fashion_resnet at batch 8 0.48 -> 0.456 ms, the other shipped CNNs at
  // batch 8 unchanged; the same at batch 1 made fashion_mobilenet slower (0.107 -> 0.117 ms).
  return onednn_team_size(s.n > 1 ? 3.0 * macs : macs, threads);
}

namespace {

// Whether oneDNN may run `s` in `direction`: enabled, allowed on this thread, and not a shape
// mpq's kernels are measured faster on (blocked tensors always go to oneDNN). usable_plan: the
// cached forward or backward-data plan for it, or null where mpq's kernels run instead (also where
// oneDNN has no direct kernel for the shape).
// oneDNN runs on OpenMP; its team size is the calling thread's setting, read when a primitive is
// created (its work split is fixed then, and it later asks OpenMP for exactly that many threads),
// so it is set first and is part of the cache key.
bool onednn_runs(const DnnlConvShape& s, Direction direction) {
  if (!onednn_enabled() || !onednn_allowed_here()) return false;
  // Blocked tensors go to oneDNN whenever it has a direct kernel: mpq's would convert both ways.
  return g_override.load(std::memory_order_relaxed) == static_cast<int>(OnednnUse::Always) || s.blocked() ||
         !mpq_is_faster(s, direction);
}

// The plan for `s` on an OpenMP team of `team` threads (set here), or null (see usable_plan).
std::shared_ptr<Plan> plan_for_team(int team, const DnnlConvShape& s, Direction direction) {
  if (!onednn_runs(s, direction)) return nullptr;
  if (omp_get_max_threads() != team) omp_set_num_threads(team);
  std::shared_ptr<Plan> p = cache().get(s, team, direction);
  return p->direct ? p : nullptr;
}

std::shared_ptr<Plan> usable_plan(int threads, const DnnlConvShape& s, Direction direction) {
  return plan_for_team(team_size(s, threads), s, direction);
}

}  // namespace

bool onednn_bf16_cores() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;
}

bool onednn_channels_last_direct() {
  if (!onednn_enabled()) return false;
  static const bool direct = [] {
    DnnlConvShape pointwise;
    pointwise.n = 8;
    pointwise.c = 24;
    pointwise.m = 72;
    pointwise.ih = pointwise.iw = pointwise.oh = pointwise.ow = 8;
    pointwise.bias = true;
    pointwise.x_block = pointwise.y_block = kChannelsLast;
    DnnlConvShape depthwise = pointwise;
    depthwise.c = depthwise.group = 72;
    depthwise.kh = depthwise.kw = 3;
    depthwise.pt = depthwise.pl = depthwise.pb = depthwise.pr = 1;
    try {
      return make_plan(pointwise)->direct && make_plan(depthwise)->direct;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return direct;
}

bool onednn_int8_convolutions() {
  if (!onednn_enabled()) return false;
  static const bool exact = [] {
    // A 3x3 convolution of 16 channels, NHWC in and out, as passes/int8_conv marks them.
    static const Int8ConvScales probe_scales;
    DnnlConvShape probe;
    probe.n = 1;
    probe.c = probe.m = 16;
    probe.ih = probe.iw = probe.oh = probe.ow = 8;
    probe.kh = probe.kw = 3;
    probe.pt = probe.pl = probe.pb = probe.pr = 1;
    probe.bias = true;
    probe.x_block = probe.y_block = kChannelsLast;
    probe.int8 = &probe_scales;
    try {
      const std::shared_ptr<Plan> p = make_plan(probe);
      return p->direct && p->int8;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return exact;
}

int64_t onednn_channel_block() {
  if (!onednn_enabled()) return 0;
  // The ISA values are bit sets: every AVX-512 core level contains avx512_core's bits.
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto avx512 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core);
  return (isa & avx512) == avx512 ? 16 : 8;
}

namespace {

// The memory objects of one plan's forward calls and the convolution's argument map over them.
// They are handles: the buffers behind them are set on every call (set_data_handle), so a node
// that keeps them (OnednnConvState) creates no oneDNN objects and allocates nothing per run.
struct Bound {
  std::shared_ptr<Plan> plan;
  memory usrc, udst, uwei, uz, src, dst, wei, bias, pad;
  memory x_scale, out_scale;  // in integers: the per-call scales (Int8ConvScales)
  std::unordered_map<int, memory> args;

  explicit Bound(std::shared_ptr<Plan> p) : plan(std::move(p)) {
    dnnl::engine& eng = engine();
    const Plan& q = *plan;
    usrc = memory(q.user_src, eng, DNNL_MEMORY_NONE);
    udst = memory(q.user_dst, eng, DNNL_MEMORY_NONE);
    uwei = memory(q.user_wei, eng, DNNL_MEMORY_NONE);
    uz = memory(q.user_z, eng, DNNL_MEMORY_NONE);
    src = q.reorder_src ? memory(q.pd.src_desc(), eng, DNNL_MEMORY_NONE) : usrc;
    dst = q.reorder_dst ? memory(q.pd.dst_desc(), eng, DNNL_MEMORY_NONE) : udst;
    wei = q.reorder_wei ? memory(q.pd.weights_desc(), eng, DNNL_MEMORY_NONE) : uwei;
    pad = memory(q.pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
    args = {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}, {DNNL_ARG_SCRATCHPAD, pad}};
    if (q.user_bias != memory::desc()) {
      bias = memory(q.user_bias, eng, DNNL_MEMORY_NONE);
      args.emplace(DNNL_ARG_BIAS, bias);
    }
    if (q.fq_scale) args.emplace(q.fq_scale_arg, q.fq_scale_mem);
    if (q.int8) {
      x_scale = memory(q.x_scale_desc, eng, DNNL_MEMORY_NONE);
      out_scale = memory(q.out_scale_desc, eng, DNNL_MEMORY_NONE);
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, out_scale);
    }
  }
};

// One part of a split convolution: its shape and where its X and its Y (and Z) start in the whole
// convolution's, in elements.
struct Part {
  DnnlConvShape shape;
  int64_t x_offset = 0, y_offset = 0;
};

}  // namespace

struct OnednnConvState::Impl {
  // The last call's shape and thread count, and what ran it (bound null: mpq's kernels).
  bool valid = false;
  DnnlConvShape shape;
  int threads = 0;
  int policy = 0;  // what else decides the plan: oneDNN on/off/always
  std::unique_ptr<Bound> bound;  // the plan and its memory objects; null where mpq's kernels run
  // The weights in reordered_for->pd.weights_desc(), reordered from `source` (the plan is held so
  // that its address cannot be reused by another).
  const float* source = nullptr;
  std::shared_ptr<Plan> reordered_for;
  Scratch weights;
  // With the batch split over the threads (forward_split): one state per part, whether the last
  // split shape had a direct single-thread kernel for every part, and the plan whose weight layout
  // all parts share (the reordered copy is then `weights` above), null where each keeps its own.
  std::vector<std::unique_ptr<Impl>> parts;
  std::vector<Part> split_parts;  // empty: the shape runs whole
  DnnlConvShape split_shape;
  int split_threads = 0, split_policy = -1;
  bool split_valid = false, split_usable = false, split_by_size = true;
  std::shared_ptr<Plan> split_weights_plan;
  // The measured choice (forward_tuned): for the shape, thread count and policy it was made for,
  // which tactics may run, the timed calls of each, the calls made and the tactic chosen
  // (-1 while measuring). The whole-convolution tactics keep their own states (plans and weight
  // copies), so that alternating them reorders nothing; the split one uses this state's.
  struct Tuning {
    bool valid = false;
    DnnlConvShape shape;
    int threads = 0, policy = -1;
    std::array<bool, 4> usable{};
    std::array<std::array<double, kConvTimedRounds>, 4> seconds{};
    int calls = 0, chosen = -1;
  } tuning;
  // How often the shape changed before a choice was made; past kTuningRestarts the size rule decides.
  int tuning_restarts = 0;
  bool tuning_given_up = false;
  std::array<std::unique_ptr<Impl>, 3> whole_states;  // one thread, the size rule's team, every thread
};
OnednnConvState::OnednnConvState() : impl(std::make_unique<Impl>()) {}
OnednnConvState::~OnednnConvState() = default;

namespace {

// A layout reorder of fewer elements than this runs on the calling thread alone. oneDNN's reorders
// split over the OpenMP team of the moment, which is the convolution's; for a small tensor the
// split costs more than the copy (ResNet's last 64 x 8 x 8 activation at batch 1: 0.8 us on one
// thread, 4.0 us on two, DNNL_VERBOSE). A reorder copies values, so the result is the same.
constexpr int64_t kMinSplitReorder = 64 * 1024;

// The scratch memory of a quantizing reorder (user mode, see Plan::src_in_pad_bytes), per thread.
memory reorder_scratch(size_t bytes) {
  thread_local Scratch s_reorder_pad;
  const size_t size = std::max<size_t>(bytes, 1);
  return memory(memory::desc({static_cast<memory::dim>(size)}, dt::u8, tag::x), engine(), s_reorder_pad.get(size));
}

// A quantizing reorder (DnnlConvShape::int8): its runtime scale and its scratch memory.
void execute_scaled(const dnnl::reorder& r, const dnnl::stream& stream, memory& from, memory& to, const memory& scale,
                    size_t pad_bytes) {
  r.execute(stream, {{DNNL_ARG_FROM, from},
                     {DNNL_ARG_TO, to},
                     {DNNL_ARG_ATTR_OUTPUT_SCALES, scale},
                     {DNNL_ARG_SCRATCHPAD, reorder_scratch(pad_bytes)}});
}

// `scale`, where given: the quantizing reorder's runtime scale, `pad_bytes` its scratch memory.
void execute_reorder(const dnnl::reorder& r, const dnnl::stream& stream, memory& from, memory& to, int64_t elements,
                     const memory* scale = nullptr, size_t pad_bytes = 0) {
  auto run = [&] {
    if (scale)
      execute_scaled(r, stream, from, to, *scale, pad_bytes);
    else
      r.execute(stream, from, to);
  };
  const int team = omp_get_max_threads();
  if (team == 1 || elements >= kMinSplitReorder) {
    run();
    return;
  }
  struct RestoreTeam {
    int team;
    ~RestoreTeam() { omp_set_num_threads(team); }
  } restore{team};
  omp_set_num_threads(1);
  run();
}

// W into p's weight layout (to), quantized to int8 with s.int8's scales where the plan is in
// integers.
void reorder_weights(const Plan& p, const DnnlConvShape& s, const dnnl::stream& stream, memory& from, memory& to) {
  if (!p.int8) {
    p.wei_in.execute(stream, from, to);
    return;
  }
  const memory scale(p.w_scale_desc, engine(), const_cast<float*>(s.int8->w_inv.data()));
  execute_scaled(p.wei_in, stream, from, to, scale, p.wei_in_pad_bytes);
}

int current_policy() { return (onednn_enabled() ? 1 : 0) + 2 * (g_override.load(std::memory_order_relaxed) + 1); }

// Constant weights w in p's layout, kept in st: reordered once per plan and source.
const float* kept_weights(OnednnConvState::Impl& st, const std::shared_ptr<Plan>& p, const DnnlConvShape& s,
                          const float* w, const dnnl::stream& stream) {
  float* dst = st.weights.get(p->wei_bytes);
  if (st.source != w || st.reordered_for != p) {
    memory from(p->user_wei, engine(), const_cast<float*>(w)), to(p->pd.weights_desc(), engine(), dst);
    reorder_weights(*p, s, stream, from, to);
    st.source = w;
    st.reordered_for = p;
  }
  return dst;
}

// One convolution (or one part of a split batch) on an OpenMP team of `team` threads. `packed`,
// where not null, holds w already in the plan's weight layout (shared by the parts of a split batch).
bool forward_whole(int team, const DnnlConvShape& s, const float* x, const float* w, const float* bias,
                   const float* z, float* y, OnednnConvState::Impl* st, const float* packed = nullptr) {
  std::shared_ptr<Plan> p;
  const int policy = current_policy();
  if (st && st->valid && st->shape == s && st->threads == team && st->policy == policy) {
    if (st->bound) {
      p = st->bound->plan;
      // Another node may have changed the OpenMP team size since (plan_for_team sets it).
      if (omp_get_max_threads() != team) omp_set_num_threads(team);
    }
  } else {
    p = plan_for_team(team, s, Direction::Forward);
    if (st) {
      // Everything that may throw first: a half-updated state must never look valid.
      st->valid = false;
      std::unique_ptr<Bound> bound = p ? std::make_unique<Bound>(p) : nullptr;
      st->shape = s;
      st->threads = team;
      st->policy = policy;
      st->bound = std::move(bound);
      st->valid = true;
    }
  }
  if (!p) return false;
  std::unique_ptr<Bound> local;
  Bound& b = st ? *st->bound : *(local = std::make_unique<Bound>(p));
  thread_local Scratch s_src, s_wei, s_dst, s_pad;
  thread_local dnnl::stream stream(engine());
  b.usrc.set_data_handle(const_cast<float*>(x));
  b.udst.set_data_handle(y);
  if (p->int8) {
    b.x_scale.set_data_handle(const_cast<float*>(&s.int8->x_inv));
    b.out_scale.set_data_handle(const_cast<float*>(s.int8->out.data()));
  }
  if (p->reorder_src) {
    b.src.set_data_handle(s_src.get(p->src_bytes));
    const int64_t elements = s.n * s.c * s.ih * s.iw;
    // mpq's quantization on one thread where oneDNN's reorder would run on one too (see
    // execute_reorder); a large one stays split over the team.
    if (p->quantize_src_here && (omp_get_max_threads() == 1 || elements < kMinSplitReorder))
      quantize_to_nhwc_s8(x, s.x_block == kChannelsLast, s.n, s.c, s.ih, s.iw, s.int8->x_inv,
                          static_cast<int8_t*>(b.src.get_data_handle()));
    else
      execute_reorder(p->src_in, stream, b.usrc, b.src, elements, p->int8 ? &b.x_scale : nullptr, p->src_in_pad_bytes);
  }
  if (p->reorder_dst) b.dst.set_data_handle(s_dst.get(p->dst_bytes));
  b.uwei.set_data_handle(const_cast<float*>(w));
  if (p->reorder_wei) {
    if (packed || st) {
      b.wei.set_data_handle(const_cast<float*>(packed ? packed : kept_weights(*st, p, s, w, stream)));
    } else {
      b.wei.set_data_handle(s_wei.get(p->wei_bytes));
      reorder_weights(*p, s, stream, b.uwei, b.wei);
    }
  }
  if (s.residual) {
    // The sum post-op adds what dst holds: Z goes there first, in dst's layout.
    if (p->reorder_z) {
      b.uz.set_data_handle(const_cast<float*>(z));
      execute_reorder(p->z_in, stream, b.uz, b.dst, s.n * s.m * s.oh * s.ow);
    } else if (z != static_cast<const float*>(b.dst.get_data_handle())) {  // Y in place of Z: Z is there
      std::copy(z, z + s.n * s.m * s.oh * s.ow, static_cast<float*>(b.dst.get_data_handle()));
    }
  }
  b.pad.set_data_handle(s_pad.get(p->pad_bytes));
  if (s.bias) b.bias.set_data_handle(const_cast<float*>(p->int8 ? s.int8->bias.data() : bias));
  p->conv.execute(stream, b.args);
  if (p->int8) g_int8_count.fetch_add(1, std::memory_order_relaxed);
  if (p->reorder_dst) {
    const int64_t elements = s.n * s.m * s.oh * s.ow;
    // Channels-last to plain NCHW by mpq's tiled copy where oneDNN's reorder would run on one
    // thread too (see execute_reorder): the same values, several times faster (channel_blocks.h).
    if (p->dst_channels_last_to_plain && (omp_get_max_threads() == 1 || elements < kMinSplitReorder)) {
      stream.wait();  // the convolution has written dst
      channels_last_to_plain(static_cast<const float*>(b.dst.get_data_handle()), y, s.n, s.m, s.oh * s.ow);
    } else {
      execute_reorder(p->dst_out, stream, b.dst, b.udst, elements);
    }
  }
  stream.wait();
  return true;
}

// One image of an int8 convolution on channels-last tensors, cut into bands of whole output rows,
// one per thread; empty where it is not (see split_parts). In NHWC a band of rows is a contiguous
// stretch of X, Y and Z, so a part is the same convolution on fewer rows: its input rows (with the
// window's overlap into the neighbouring band) at an offset, padded only by the rows its windows
// reach beyond the image's top or bottom edge (a band inside the image has none). Integer sums are
// exact and the post-ops act per element, so the parts give the whole convolution's bits.
std::vector<Part> row_band_parts(const DnnlConvShape& s, int threads) {
  std::vector<Part> parts;
  if (s.n != 1 || s.int8 == nullptr || s.x_block != kChannelsLast || s.y_block != kChannelsLast ||
      (s.residual && s.z_block != kChannelsLast) || s.ih == 1)
    return parts;
  const std::vector<int64_t> rows = row_parts(s.oh, threads);
  if (rows.empty()) return parts;
  const int64_t window = (s.kh - 1) * s.dh + 1;  // input rows one output row reads
  int64_t o0 = 0;
  for (const int64_t count : rows) {
    const int64_t o1 = o0 + count;
    const int64_t first = o0 * s.sh - s.pt;                    // may lie in the top padding
    const int64_t last = (o1 - 1) * s.sh - s.pt + window - 1;  // may lie in the bottom padding
    const int64_t i0 = std::max<int64_t>(first, 0), i1 = std::min<int64_t>(last + 1, s.ih);
    // A band whose windows lie wholly in padding (pads at least the window's height) has no input
    // rows, which no primitive takes: such a convolution runs whole.
    if (i1 <= i0) return {};
    Part p;
    p.shape = s;
    p.shape.oh = count;
    p.shape.ih = i1 - i0;
    p.shape.pt = i0 - first;
    p.shape.pb = last + 1 - i1;
    p.x_offset = i0 * s.iw * s.c;
    p.y_offset = o0 * s.ow * s.m;
    parts.push_back(p);
    o0 = o1;
  }
  return parts;
}

// How a convolution on `threads` threads is split into parts, one per thread, each convolved by a
// single-thread primitive (see onednn_conv_forward); empty where it runs whole. A batch is split
// into whole images (every layout here, NCHW, channel blocks and NHWC, keeps each image's C * H * W
// values together, images one after the other). One float image is not split: parts of whole
// output channel blocks (each reading all of X) were measured on the fashion ResNet at batch 1, 2
// threads: each split convolution was faster than oneDNN's own two-thread split (12.3 -> 8.1 us for
// the stride-2 16 -> 32 one), but the unsplit ones after them slower (16 -> 25 us), 3-6% slower in
// all. One image of an int8 convolution on channels-last tensors is cut into bands of output rows
// (row_band_parts): oneDNN's own two-thread split of the int8 kernel hardly paid at batch 1 (INT8
// ResNet, 2 threads: 0.171 -> 0.172 ms, its 16-channel 3x3 convolutions 32 -> 28 us), and with bands
// each thread quantizes and convolves its own rows, which stay in its cache for the next
// convolution's band.
// `by_size`: only where the size rule gives the convolution every thread (team_size); without it,
// wherever the shape can be cut (the measured choice, forward_tuned, times the split against the
// other ways).
std::vector<Part> split_parts(const DnnlConvShape& s, int threads, bool by_size) {
  std::vector<Part> parts;
  if (!batch_split_enabled()) return parts;
  // Images per part as the executor's whole-graph split cuts a batch (row_parts): none where there
  // are fewer images than threads (oneDNN's own split would use the idle ones) or an uneven split
  // with few images per thread (3 images on 2 threads: 2 image-times, where oneDNN's split takes
  // about 1.5).
  // A convolution too small for a second thread runs on one, whole.
  if (by_size && team_size(s, threads) < threads) return parts;
  const std::vector<int64_t> images = row_parts(s.n, threads);
  if (images.empty()) return row_band_parts(s, threads);
  int64_t at = 0;
  for (const int64_t count : images) {
    Part p;
    p.shape = s;
    p.shape.n = count;
    p.x_offset = at * s.c * s.ih * s.iw;
    p.y_offset = at * s.m * s.oh * s.ow;
    at += count;
    parts.push_back(p);
  }
  return parts;
}

// Runs the convolution split (split_parts), part i as task i of the pool with a single-thread
// primitive and its own state; false, computing nothing, where it is not split. The split, and
// whether every part has a direct kernel, are decided once per shape with the node's state: every
// part must have one before any runs, since a part left to mpq's kernels would mean redoing the
// whole convolution, and with Y in Z's buffer the parts already done would have overwritten Z.
// The split's state in st for `threads` (made once per shape), and whether it can run.
bool prepare_split(int threads, const DnnlConvShape& s, OnednnConvState::Impl& st, bool by_size) {
  const int policy = current_policy();
  if (!(st.split_valid && st.split_shape == s && st.split_threads == threads && st.split_policy == policy &&
        st.split_by_size == by_size)) {
    // Everything that may throw first: a half-updated state must never look valid.
    st.split_valid = false;
    std::vector<Part> parts = split_parts(s, threads, by_size);
    std::vector<std::shared_ptr<Plan>> plans;
    for (const Part& part : parts) plans.push_back(usable_plan(1, part.shape, Direction::Forward));
    bool usable = !parts.empty() && std::find(plans.begin(), plans.end(), nullptr) == plans.end();
    // An int8 convolution is split only where the whole one and every part run in integers: a part
    // on the float plan would round where the whole sums exactly, and parts in integers where the
    // whole shape's plan on these threads is float would give other bits than the unsplit run.
    // (No test reaches the latter: oneDNN 2.6 has had an int8 kernel for every band of a shape it
    // runs whole in int8; the check keeps it so if that changes.)
    if (usable && s.int8) {
      const std::shared_ptr<Plan> whole = usable_plan(threads, s, Direction::Forward);
      usable = whole && whole->int8;
      for (const auto& q : plans) usable = usable && q->int8;
    }
    // The parts share one reordered copy of the weights where every part's plan takes them in the
    // same layout (parts of equal size share the plan itself).
    bool share = usable && plans[0]->reorder_wei;
    for (const auto& q : plans) share = share && q->pd.weights_desc() == plans[0]->pd.weights_desc();
    std::vector<std::unique_ptr<OnednnConvState::Impl>> states;
    for (size_t i = 0; i < parts.size(); ++i) states.push_back(std::make_unique<OnednnConvState::Impl>());
    st.parts = std::move(states);
    st.split_parts = std::move(parts);
    st.split_weights_plan = share ? plans[0] : nullptr;
    st.split_usable = usable;
    st.split_shape = s;
    st.split_threads = threads;
    st.split_policy = policy;
    st.split_by_size = by_size;
    st.split_valid = true;
  }
  return st.split_usable;
}

bool forward_split(ThreadPool& pool, const DnnlConvShape& s, const float* x, const float* w, const float* bias,
                   const float* z, float* y, OnednnConvState::Impl& st, bool by_size) {
  if (!prepare_split(pool.size(), s, st, by_size)) return false;
  const std::vector<Part>& parts = st.split_parts;
  // The shared weights, reordered once on this thread (the parts only read them).
  const float* packed = nullptr;
  if (st.split_weights_plan) {
    thread_local dnnl::stream stream(engine());
    packed = kept_weights(st, st.split_weights_plan, s, w, stream);
    stream.wait();
  }
  std::vector<char> ran(parts.size(), 0);
  pool.run_per_thread(static_cast<int>(parts.size()), [&](int task) {
    const auto k = static_cast<size_t>(task);
    const Part& p = parts[k];
    ran[k] = forward_whole(1, p.shape, x + p.x_offset, w, bias, z ? z + p.y_offset : nullptr, y + p.y_offset,
                           st.parts[k].get(), packed);
  });
  // Checked above for these shapes; a part that still did not run is a bug, not a fallback.
  if (std::find(ran.begin(), ran.end(), 0) != ran.end()) fail_internal("oneDNN convolution: a split part did not run");
  g_split_count.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// The measured choice. A convolution can use a pool of several threads in these ways: on the
// calling thread alone, whole on an OpenMP team (oneDNN's own split) of every thread or of the
// size rule's team where that lies in between, or cut into parts, one per thread (split_parts
// without the size rule). Which is fastest depends on the shape and the machine in ways a size
// rule misses: per node on the 2-core EPYC (`mpq run --profile-nodes`, batch 1, two threads)
// oneDNN's own split made the fashion MobileNet's 14 x 14 pointwise convolutions 1.2-1.3x faster
// but its 7 x 7 ones 0.9x, and the INT8 MobileNetV3's row bands were 0.7-1.1x one thread's time.
// So each node times every way it may use on its first calls, alternately: kConvWarmupRounds
// rounds untimed (plan creation, weight reorders, caches and page faults of a process's first
// runs: timing from the first round on chose other ways from one process to the next), then
// kConvTimedRounds rounds, and keeps the one whose median call was fastest. A way with more
// threads must beat one thread by 10% (kTuningMargin): a second thread that only one small node
// wakes adds waits in the tail (with the fastest call deciding and a 3% margin, the MobileNetV3 at
// batch 1 put one 72-channel 8 x 8 depthwise convolution on the team, 2.0 against 2.1 us, and one
// of three runs had a p99 of 0.12 ms against the size rule's 0.06), and a tie should leave the
// other cores free. Every way gives the same bits: oneDNN's direct kernels sum each output in an
// order set by the shape's blocking, and int8 bands sum exactly; a float way whose plan runs
// another oneDNN implementation than the size rule's is not used (computes_as), and
// conv_tuning_test checks the bits of every way on the test machine's kernels. So what is chosen
// changes the time only. Each call runs one way once, so a Y in place of Z is safe while measuring.
constexpr double kTuningMargin = 0.9;
// The ways: the calling thread alone, the team the size rule gives (where it is neither one thread
// nor every thread: pools of three or more), every thread, the parts.
enum Tactic : int { kOneThread = 0, kRuleTeam = 1, kWholeTeam = 2, kSplit = 3 };
constexpr int kTactics = 4;
// A state whose shape changes this often before a choice is made keeps the size rule.
constexpr int kTuningRestarts = 3;

// Whether `p` computes as `rule` does: the same arithmetic (int8 or float) and, for float, the same
// oneDNN implementation (a thread count that made oneDNN pick another kernel could change the
// order of the sums; int8 sums are exact).
bool computes_as(const std::shared_ptr<Plan>& p, const std::shared_ptr<Plan>& rule) {
  if (!p || p->int8 != rule->int8) return false;
  return rule->int8 || std::string(p->pd.impl_info_str()) == rule->pd.impl_info_str();
}

// Runs `s` the measured way and returns true; false, computing nothing, where the measured choice
// does not apply (fewer than two ways can run the shape, none of them on oneDNN, or the state gave
// up): the caller then decides as without it. Every way it runs was checked to have a direct kernel.
bool forward_tuned(ThreadPool& pool, const DnnlConvShape& s, const float* x, const float* w, const float* bias,
                  const float* z, float* y, OnednnConvState::Impl& st) {
  using Impl = OnednnConvState::Impl;
  const int threads = pool.size();
  const int policy = current_policy();
  Impl::Tuning& t = st.tuning;
  if (st.tuning_given_up) return false;
  const int rule_team = team_size(s, threads);
  if (!(t.valid && t.shape == s && t.threads == threads && t.policy == policy)) {
    // A node whose shape keeps changing before it settles (batches of several sizes through one
    // executor) would never leave its first way; it keeps the size rule instead.
    if (t.valid && t.chosen < 0 && t.calls > 0 && ++st.tuning_restarts >= kTuningRestarts) {
      st.tuning_given_up = true;
      st.whole_states = {};
      return false;
    }
    t.valid = false;
    const std::shared_ptr<Plan> rule = usable_plan(threads, s, Direction::Forward);
    Impl::Tuning fresh;
    if (rule) {
      fresh.usable[kOneThread] = computes_as(plan_for_team(1, s, Direction::Forward), rule);
      fresh.usable[kRuleTeam] = rule_team > 1 && rule_team < threads;
      fresh.usable[kWholeTeam] = computes_as(plan_for_team(threads, s, Direction::Forward), rule);
      // The split's state (parts, plans, whether each has a direct kernel, int8 where the whole
      // runs in integers) is made here, without running it; float parts must run the whole's kernel.
      bool split = prepare_split(threads, s, st, false);
      for (size_t i = 0; split && i < st.split_parts.size(); ++i)
        split = computes_as(plan_for_team(1, st.split_parts[i].shape, Direction::Forward), rule);
      fresh.usable[kSplit] = split;
    }
    fresh.shape = s;
    fresh.threads = threads;
    fresh.policy = policy;
    fresh.valid = true;
    t = fresh;
  }
  std::array<int, kTactics> tactics{};
  int count = 0;
  for (int i = 0; i < kTactics; ++i)
    if (t.usable[static_cast<size_t>(i)]) tactics[static_cast<size_t>(count++)] = i;
  if (count < 2) return false;
  auto run = [&](int tactic) {
    if (tactic == kSplit) return forward_split(pool, s, x, w, bias, z, y, st, false);
    auto& sub = st.whole_states[static_cast<size_t>(tactic)];
    if (!sub) sub = std::make_unique<Impl>();
    const int team = tactic == kOneThread ? 1 : tactic == kRuleTeam ? rule_team : threads;
    return forward_whole(team, s, x, w, bias, z, y, sub.get());
  };
  if (t.chosen >= 0) {
    if (!run(t.chosen)) fail_internal("oneDNN convolution: the measured tactic did not run");
    return true;
  }
  const int tactic = tactics[static_cast<size_t>(t.calls % count)];
  const auto start = std::chrono::steady_clock::now();
  if (!run(tactic)) fail_internal("oneDNN convolution: a measured tactic did not run");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int round = t.calls / count;
  if (round >= kConvWarmupRounds)
    t.seconds[static_cast<size_t>(tactic)][static_cast<size_t>(round - kConvWarmupRounds)] = seconds;
  if (++t.calls == count * (kConvWarmupRounds + kConvTimedRounds)) {
    std::array<double, kTactics> median{};
    median.fill(-1.0);
    for (int i = 0; i < count; ++i) {
      const auto c = static_cast<size_t>(tactics[static_cast<size_t>(i)]);
      std::array<double, kConvTimedRounds> sorted = t.seconds[c];
      std::sort(sorted.begin(), sorted.end());
      median[c] = 0.5 * (sorted[(kConvTimedRounds - 1) / 2] + sorted[kConvTimedRounds / 2]);
    }
    int chosen = tactics[0];
    for (int i = 1; i < count; ++i) {
      const int c = tactics[static_cast<size_t>(i)];
      const double bar = median[static_cast<size_t>(chosen)] * (chosen == kOneThread ? kTuningMargin : 1.0);
      if (median[static_cast<size_t>(c)] < bar) chosen = c;
    }
    t.chosen = chosen;
    static const char* const names[] = {"one thread", "the size rule's team", "every thread", "split"};
    auto us = [&](int i) { return median[static_cast<size_t>(i)] < 0 ? -1.0 : median[static_cast<size_t>(i)] * 1e6; };
    spdlog::debug("convolution {}x{}x{}x{} -> {} ({}x{} kernel, {}{}) on {} threads, median us (-1: cannot): one "
                  "thread {:.1f}, the size rule's team of {} {:.1f}, every thread {:.1f}, split {:.1f}: {}",
                  s.n, s.c, s.ih, s.iw, s.m, s.kh, s.kw, s.group > 1 ? "grouped, " : "", s.int8 ? "int8" : "float",
                  threads, us(kOneThread), rule_team, us(kRuleTeam), us(kWholeTeam), us(kSplit), names[chosen]);
    // The tactics not chosen give back their plans' buffers and weight copies.
    for (size_t i = 0; i < st.whole_states.size(); ++i)
      if (static_cast<int>(i) != chosen) st.whole_states[i].reset();
    if (chosen != kSplit) {
      st.split_valid = false;
      st.parts.clear();
      st.split_parts.clear();
      st.split_weights_plan.reset();
      st.weights = Scratch{};
      st.reordered_for.reset();
      st.source = nullptr;
    }
    g_tuned_count.fetch_add(1, std::memory_order_relaxed);
  }
  return true;
}

}  // namespace

bool onednn_conv_forward(ThreadPool& pool, const DnnlConvShape& s, const float* x, const float* w, const float* bias,
                         const float* z, float* y, OnednnConvState* constant_weights) {
  // Training (a DeterministicBlas scope) updates weights in place between calls: no state there.
  OnednnConvState::Impl* st = constant_weights && !deterministic_blas() ? constant_weights->impl.get() : nullptr;
  const int threads = pool.size();
  // With a batch and a node state (inference), each thread convolves its own images with a
  // single-thread primitive instead of oneDNN splitting every image over the threads: no barrier
  // inside the convolution, no thread reading the other's part of an image, and each core keeps
  // the same images in its cache from one convolution to the next.
  if (st && threads > 1 && !ThreadPool::inside_parallel_loop()) {
    // The measured choice where it applies (see forward_tuned), else the size rule: the split where
    // the convolution is large enough for every thread, or whole on the team its size gives.
    const bool measured = conv_tuning_enabled() &&
                          g_override.load(std::memory_order_relaxed) != static_cast<int>(OnednnUse::Always) &&
                          forward_tuned(pool, s, x, w, bias, z, y, *st);
    if (measured || forward_split(pool, s, x, w, bias, z, y, *st, true)) {
      g_conv_count.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
  if (!forward_whole(team_size(s, threads), s, x, w, bias, z, y, st)) return false;
  g_conv_count.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool onednn_conv_backward_data(ThreadPool& pool, const DnnlConvShape& s, const float* w, const float* dy, float* dx) {
  const std::shared_ptr<Plan> p = usable_plan(pool.size(), s, Direction::Data);
  if (!p) return false;
  thread_local Scratch s_dy, s_wei, s_dx;
  thread_local dnnl::stream stream(engine());
  dnnl::engine& eng = engine();
  memory udy(p->user_src, eng, const_cast<float*>(dy));
  memory uwei(p->user_wei, eng, const_cast<float*>(w));
  memory udx(p->user_dst, eng, dx);
  memory ddy = p->reorder_src ? memory(p->bwd_pd.diff_dst_desc(), eng, s_dy.get(p->bwd_pd.diff_dst_desc().get_size())) : udy;
  memory wei = p->reorder_wei ? memory(p->bwd_pd.weights_desc(), eng, s_wei.get(p->bwd_pd.weights_desc().get_size())) : uwei;
  memory ddx = p->reorder_dst ? memory(p->bwd_pd.diff_src_desc(), eng, s_dx.get(p->bwd_pd.diff_src_desc().get_size())) : udx;
  if (p->reorder_src) p->src_in.execute(stream, udy, ddy);
  if (p->reorder_wei) p->wei_in.execute(stream, uwei, wei);
  thread_local Scratch s_pad;
  const memory::desc pad_desc = p->bwd_pd.scratchpad_desc();
  p->bwd.execute(stream, {{DNNL_ARG_DIFF_DST, ddy},
                          {DNNL_ARG_WEIGHTS, wei},
                          {DNNL_ARG_DIFF_SRC, ddx},
                          {DNNL_ARG_SCRATCHPAD, memory(pad_desc, eng, s_pad.get(pad_desc.get_size()))}});
  if (p->reorder_dst) p->dst_out.execute(stream, ddx, udx);
  stream.wait();
  g_conv_count.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool onednn_conv_backward_weights(ThreadPool& pool, const DnnlConvShape& s, const float* x, const float* dy, float* dw) {
  if (s.n <= 0 || !onednn_runs(s, Direction::Weights)) return false;
  // Blocks of images by the shape alone, each on one thread: the plans are made for a team of one.
  const int64_t per = std::min(s.n, kImagesPerWeightBlock);
  const int64_t blocks = (s.n + per - 1) / per, tail = s.n - (blocks - 1) * per;
  DnnlConvShape whole_block = s, last_block = s;
  whole_block.n = per;
  last_block.n = tail;
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
  const std::shared_ptr<Plan> pw = cache().get(whole_block, 1, Direction::Weights);
  const std::shared_ptr<Plan> pl = tail == per ? pw : cache().get(last_block, 1, Direction::Weights);
  // Both blocks' dW must be in one layout to be added as they are.
  if (!pw->direct || !pl->direct || pw->bww_pd.diff_weights_desc() != pl->bww_pd.diff_weights_desc()) return false;
  const size_t count = pw->wei_bytes / sizeof(float);
  const size_t stride = (count + 15) / 16 * 16;  // 64-byte aligned slices
  // The blocks run in waves of one per thread, so that memory holds the running sum and one wave's
  // results, not one dW per block. Slice 0 is the sum; a wave's blocks go to slices 1 and up.
  const int64_t wave = std::max<int64_t>(1, std::min<int64_t>(pool.size(), blocks));
  thread_local Scratch s_partial;
  float* partial = s_partial.get(static_cast<size_t>(wave + 1) * stride * sizeof(float));
  dnnl::engine& eng = engine();
  const int64_t x_image = s.c * s.ih * s.iw, dy_image = s.m * s.oh * s.ow;
  for (int64_t first = 0; first < blocks; first += wave) {
    const int64_t in_wave = std::min(wave, blocks - first);
    pool.parallel_for(in_wave, 1, [&](int64_t lo, int64_t hi) {
      thread_local Scratch s_x, s_dy, s_pad;
      thread_local dnnl::stream stream(engine());
      for (int64_t k = lo; k < hi; ++k) {
        const int64_t b = first + k;
        const Plan& p = b == blocks - 1 ? *pl : *pw;
        memory ux(p.user_src, eng, const_cast<float*>(x + b * per * x_image));
        memory udy(p.user_z, eng, const_cast<float*>(dy + b * per * dy_image));
        memory bx = p.reorder_src ? memory(p.bww_pd.src_desc(), eng, s_x.get(p.src_bytes)) : ux;
        memory bdy = p.reorder_z ? memory(p.bww_pd.diff_dst_desc(), eng, s_dy.get(p.dst_bytes)) : udy;
        if (p.reorder_src) p.src_in.execute(stream, ux, bx);
        if (p.reorder_z) p.z_in.execute(stream, udy, bdy);
        // Block 0 writes the sum's slice directly.
        float* out = b == 0 ? partial : partial + static_cast<size_t>(k + 1) * stride;
        memory bdw(p.bww_pd.diff_weights_desc(), eng, out);
        p.bww.execute(stream, {{DNNL_ARG_SRC, bx},
                               {DNNL_ARG_DIFF_DST, bdy},
                               {DNNL_ARG_DIFF_WEIGHTS, bdw},
                               {DNNL_ARG_SCRATCHPAD, memory(p.bww_pd.scratchpad_desc(), eng, s_pad.get(p.pad_bytes))}});
        stream.wait();
      }
    });
    // The wave's blocks added to the sum in block order, each element by one thread.
    const int64_t from_k = first == 0 ? 1 : 0;
    if (from_k >= in_wave) continue;
    pool.parallel_for(static_cast<int64_t>(count), 16384, [&](int64_t lo, int64_t hi) {
      for (int64_t k = from_k; k < in_wave; ++k) {
        const float* from = partial + static_cast<size_t>(k + 1) * stride;
        for (int64_t i = lo; i < hi; ++i) partial[i] += from[i];
      }
    });
  }
  if (pw->reorder_wei) {
    thread_local dnnl::stream stream(engine());
    memory from(pw->bww_pd.diff_weights_desc(), eng, partial), to(pw->user_wei, eng, dw);
    pw->dst_out.execute(stream, from, to);
    stream.wait();
  } else {
    std::copy(partial, partial + count, dw);
  }
  g_conv_count.fetch_add(1, std::memory_order_relaxed);
  return true;
}

#endif

}  // namespace mpq::rt::cpu
