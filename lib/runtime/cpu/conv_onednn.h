#pragma once
// Float32 1-D/2-D convolution forward through oneDNN (Intel's deep-learning primitives, the
// library PyTorch's CPU convolutions run on), for Conv and mpq::FusedConv. Plain NCHW in and out:
// the source is reordered into oneDNN's blocked layout (nChw8c on AVX2) and the result back, since
// its direct kernels on blocked data beat im2col + GEMM on NCHW even with both reorders on all but
// the smallest shapes (measured per shape with tests/bench_conv, see docs/runtime.md). Primitives
// (convolution and reorders) are cached per shape and attribute set in a bounded process-wide
// cache, so repeated runs of a plan pay oneDNN's primitive creation once. Weights are reordered on
// every call unless the caller passes an OnednnConvState (graph-constant weights, outside
// training), and tensors that passes/block_conv_layout keeps channel-blocked are not reordered at
// all. Not a public API.
#include <cstdint>
#include <memory>
#include <vector>

namespace mpq::rt {
class ThreadPool;
}

namespace mpq::rt::cpu {

struct Window3;

// The activation of mpq::FusedConv, applied as a oneDNN post-op.
enum class DnnlAct { None, Relu, LeakyRelu, Clip, Sigmoid, HardSigmoid, Tanh, HardSwish };

// A convolution run in integers (mpq::FusedConv's int8_scales, passes/int8_conv): X holds integer
// multiples of x_scale within [-128, 127] and W[m] integer multiples of w_scale[m] within
// [-127, 127], so oneDNN's int8 kernel computes the same products exactly (integer sums) at about
// half the FP32 kernel's time on 3x3 convolutions (scripts/bench_int8_conv.py). X is reordered to
// int8 on every call (times x_inv, rounding half to even), W once per plan (times w_inv[m]); the
// int32 sums plus `bias` are multiplied by `out` (a per-channel post-op; oneDNN 2.6 rejects
// runtime output scales on its int8 convolution and adds the bias before them, hence the divided
// bias). Then the usual post-ops: Z, activation, fake quantization.
struct Int8ConvScales {
  float x_inv = 1.0f;           // 1 / x_scale
  std::vector<float> w_inv;     // 1 / w_scale[m]
  std::vector<float> out;       // x_scale * w_scale[m]
  std::vector<float> bias;      // bias[m] / out[m] (empty without a bias)
};

struct DnnlConvShape {
  int64_t n = 0, c = 0, m = 0, group = 1;
  int64_t ih = 1, iw = 1, kh = 1, kw = 1;  // 1-D convolutions have ih = kh = 1
  int64_t sh = 1, sw = 1, dh = 1, dw = 1;  // strides; dilations as in ONNX (1 = dense)
  int64_t pt = 0, pl = 0, pb = 0, pr = 0;  // pads: top, left, bottom, right
  int64_t oh = 1, ow = 1;
  bool bias = false, residual = false;
  DnnlAct act = DnnlAct::None;
  float p0 = 0.0f, p1 = 0.0f;
  // Then fake quantization with one scale (mpq::FusedConv's fake_quant): y = round(clamp(v /
  // fq_scale, fq_lo, fq_hi)) * fq_scale, as post-ops that give FakeQuant's bits.
  bool fake_quant = false;
  float fq_scale = 1.0f, fq_lo = 0.0f, fq_hi = 0.0f;
  // Layout of x, z and y: 0 = plain NCHW, 8 or 16 = channel-blocked, kChannelsLast = NHWC
  // (runtime/cpu/channel_blocks.h), as passes/block_conv_layout marks them. A blocked tensor is used
  // by oneDNN as it is.
  int64_t x_block = 0, z_block = 0, y_block = 0;
  // Non-null: run in integers with these scales (the node's own; group 1 only). Plans depend only
  // on whether it is set: X's and the output's scales are given on every call, W's when its
  // reordered copy is made.
  const Int8ConvScales* int8 = nullptr;
  bool blocked() const { return x_block != 0 || z_block != 0 || y_block != 0; }
  bool operator==(const DnnlConvShape&) const = default;
};

// What one node's kernel object keeps between calls when its weights are constants of the graph
// (Conv and mpq::FusedConv with an initializer W): the plan of the last shape it ran, its memory
// objects, and the weights already in that plan's layout, so that repeated runs neither look the
// plan up nor reorder the weights again. Inside a DeterministicBlas scope (training, which updates
// weights in place) onednn_conv_forward ignores it.
class OnednnConvState {
 public:
  OnednnConvState();
  ~OnednnConvState();
  OnednnConvState(const OnednnConvState&) = delete;
  OnednnConvState& operator=(const OnednnConvState&) = delete;
  struct Impl;
  std::unique_ptr<Impl> impl;
};

// The geometry of a 1-D/2-D convolution window (g in its rank-3 form, leading dimension 1) as oneDNN
// takes it; bias, residual and activation are left at their defaults.
DnnlConvShape dnnl_conv_shape(int64_t n, int64_t c, int64_t m, int64_t group, const Window3& g);

// Whether oneDNN is compiled in and not switched off (MPQ_ONEDNN=0 in the environment runs mpq's
// own kernels everywhere, for comparisons). Training (inside a DeterministicBlas scope) uses it where
// the scope allows (FP32 steps), or everywhere with MPQ_ONEDNN=all (see conv_onednn.cpp for why).
bool onednn_enabled();
bool onednn_available();  // compiled in

// Which convolutions oneDNN runs: none, those it is measured faster on (the default), or every one
// it has a direct kernel for, on every thread of the pool however small (tests, to reach odd shapes
// and really compare thread counts; bench_conv, to measure).
enum class OnednnUse { Off, Auto, Always };

// Sets the choice for the whole process while alive.
class ScopedOnednn {
 public:
  explicit ScopedOnednn(OnednnUse use);
  ~ScopedOnednn();
  ScopedOnednn(const ScopedOnednn&) = delete;
  ScopedOnednn& operator=(const ScopedOnednn&) = delete;

 private:
  int previous_;
};

// The measured choice of how a convolution uses a pool of several threads (inference, constant
// weights, outside a parallel loop; see onednn_conv_forward): on by default, off with
// MPQ_CONV_TUNING=0 in the environment or inside a ScopedConvTuning(false), where a size rule
// decides alone. Never with OnednnUse::Always, whose tests compare thread counts on purpose.
bool conv_tuning_enabled();
class ScopedConvTuning {
 public:
  explicit ScopedConvTuning(bool on);
  ~ScopedConvTuning();
  ScopedConvTuning(const ScopedConvTuning&) = delete;
  ScopedConvTuning& operator=(const ScopedConvTuning&) = delete;

 private:
  int previous_;
};
// How many convolutions (node states) have settled on a measured choice in this process. A state
// times its tactics over its first (kConvWarmupRounds + kConvTimedRounds) * tactics calls.
uint64_t onednn_tuned_count();
inline constexpr int kConvWarmupRounds = 4, kConvTimedRounds = 8;

// The channel block oneDNN's direct kernels prefer on this CPU (16 with AVX-512, else 8), or 0 where
// oneDNN is not compiled in or switched off: passes/block_conv_layout keeps tensors between
// convolutions in that layout.
int64_t onednn_channel_block();

// Whether oneDNN runs channels-last (NHWC) convolutions with its direct kernels on this CPU: a
// pointwise and a depthwise probe of MobileNet-like shapes (24 -> 72 channels, 72 depthwise), planned
// once. passes/block_conv_layout keeps tensors channels-last only where this holds; elsewhere mpq's
// kernels would run such a convolution with a conversion on each side.
bool onednn_channels_last_direct();

// Whether oneDNN's effective ISA includes AVX-512 BF16 (Cooper Lake, Sapphire Rapids and later),
// where oneDNN 2.6 prefers its batch-reduce kernels: brgconv for the FP32 forward and brdgmm for
// depthwise, which takes no channel-blocked input (tests allow for that). False without oneDNN.
bool onednn_bf16_cores();

// The OpenMP team a oneDNN primitive of `macs` multiply-adds gets on a pool of `threads`: one
// thread below the size where a second pays (see conv_onednn.cpp), every thread with
// OnednnUse::Always. And whether oneDNN may run on this thread now (inside training's
// DeterministicBlas scope only where the scope allows its convolutions, or with MPQ_ONEDNN=all).
// For the other oneDNN callers (matmul_onednn, which never runs inside that scope).
int onednn_team_size(double macs, int threads);
bool onednn_allowed_here();

// How many convolutions oneDNN has run in this process (tests check which path a shape took).
uint64_t onednn_conv_count();
// Whether oneDNN runs int8 convolutions exactly on this CPU (a probe, planned once): it needs VNNI
// (without it oneDNN halves the weights of signed-input convolutions) and NHWC layouts. Where not,
// a convolution marked int8 runs oneDNN's float plan.
bool onednn_int8_convolutions();
// How many of them ran in integers (DnnlConvShape::int8).
uint64_t onednn_int8_conv_count();
// How many of them ran split over the threads, one part per thread (inference with constant
// weights, a convolution large enough for every thread): a batch by whole images, or one image of
// an int8 convolution on channels-last tensors by bands of output rows.
uint64_t onednn_batch_split_count();

// y = act(conv(x, w) + bias + z) through oneDNN, where it is enabled, measured faster than mpq's
// kernels for the shape, and has a direct (jit) kernel for it; returns false, computing nothing,
// otherwise. x is [N, C, IH, IW], w [M, C/G, KH, KW], y and z [N, M, OH, OW], all dense NCHW;
// `bias` and `z` may be null when s.bias / s.residual are false. The oneDNN threads (OpenMP) are
// set for the call: up to pool.size(), fewer for a small convolution (onednn_team_size). Shapes where oneDNN would fall back to im2col + GEMM (grouped
// convolutions whose channels per group are not a multiple of its vector block, for instance) are
// left to mpq: that is what mpq does too, and oneDNN's GEMM splits its reduction by thread count,
// so its results would not be the same bits on one thread and on two; its direct kernels sum every
// output in one fixed order. With s.blocked(), x, z and y are in the layouts s names, and oneDNN runs
// the shape whenever it has a direct kernel for it (mpq's kernels would need both conversions).
// With `constant_weights`, w must hold the same values on every call made with that state (the
// reordered copy is reused while w's address and the plan stay the same), and a batch of at least
// one image per thread (an even split, or 4 or more per thread) on a pool of several threads is
// split into whole images, one part per thread, each run by a single-thread primitive, where the
// convolution is large enough for every thread; so is one image of an int8 convolution whose X, Y
// (and Z) are channels-last, cut into bands of output rows (exact integer sums: the same bits). oneDNN's direct kernels sum each output in an
// order set by the shape's blocking, not by the batch or thread count: conv_blocked_test checks
// that a split batch gives the unsplit one's bits.
bool onednn_conv_forward(ThreadPool& pool, const DnnlConvShape& s, const float* x, const float* w, const float* bias,
                         const float* z, float* y, OnednnConvState* constant_weights = nullptr);

// dX of the convolution `s` describes (bias, residual and activation ignored) from dY [N, M, OH, OW]
// and W, both dense NCHW / OIHW, into dx [N, C, IH, IW] (overwritten), for training; the forward's
// choice of shapes and threads, narrowed to where oneDNN's dX was measured faster (input channels
// per group a multiple of its channel block, at least 8 output channels per group; see
// conv_onednn.cpp), false (computing nothing) where mpq's kernels run it. Each dX
// element is summed by one thread in a fixed order, so it is the same bits at any thread count
// (tests/train/conv_grad_test).
bool onednn_conv_backward_data(ThreadPool& pool, const DnnlConvShape& s, const float* w, const float* dy, float* dx);

// dW [M, C/G, KH, KW] (overwritten) of the convolution `s` describes from X [N, C, IH, IW] and dY
// [N, M, OH, OW], dense NCHW, for training; the same choice of shapes as the forward, false
// (computing nothing) where mpq's kernels run it. oneDNN's own threading would sum per-thread
// partials whose split depends on the thread count, so the batch is cut into blocks of
// kImagesPerWeightBlock images by the shape alone, each block's dW computed on one thread by a
// single-thread primitive, and the blocks' results added in block order: the same bits at any
// thread count (tests/train/conv_grad_test). The blocks run in waves of one per thread, so a batch
// of at most 8 images computes its dW on one thread.
inline constexpr int64_t kImagesPerWeightBlock = 8;
bool onednn_conv_backward_weights(ThreadPool& pool, const DnnlConvShape& s, const float* x, const float* dy, float* dw);

}  // namespace mpq::rt::cpu
