#pragma once
// Plain data that describes one kernel launch: op codes, resolved shapes, quantization layouts.
// No functions and no CUDA headers: built by host code compiled with g++ (mpq's planning code,
// the Catch2 tests) and consumed by the kernel bodies (kernels/bodies/*.cuh), which only nvcc
// compiles. Keeping the bodies out of g++ translation units guarantees that the host harness runs
// nvcc's compilation of them, not a g++ copy of the same inline functions.
#include <cstdint>

namespace mpq::cuda {

// Largest rank that the broadcasting/shape bodies handle (ONNX models in practice stay <= 6).
inline constexpr int kMaxRank = 8;

// A 1-D launch: `blocks` x `threads`.
struct LaunchShape {
  int64_t blocks = 1, threads = 1;
};

// Softmax rows of at least this many values take the chunked path (kernels/bodies/reduce.cuh).
constexpr int64_t kSoftmaxChunkedFrom = 1024;

// Enough blocks to cover n work items, capped (a grid-stride loop covers the rest; the host tests
// use small caps so that every body's stride loop is exercised).
inline LaunchShape launch_shape_for(int64_t n, int64_t threads = 256, int64_t max_blocks = 4096) {
  LaunchShape s;
  s.threads = threads;
  const int64_t b = (n + threads - 1) / threads;
  s.blocks = b < 1 ? 1 : (b > max_blocks ? max_blocks : b);
  return s;
}

// HardSigmoid: clamp(alpha * x + beta, 0, 1); HardSwish: x * HardSigmoid(x) with alpha 1/6, beta 1/2.
// The other ops ignore alpha and beta.
enum class UnaryOp : int { Relu, Sigmoid, Tanh, Exp, Log, Neg, Abs, Sqrt, Erf, Gelu, Reciprocal, Identity, HardSigmoid, HardSwish };
// PowSlope is Pow's derivative in its base, B * A^(B-1) (training's backward; no ONNX op).
enum class BinaryOp : int { Add, Sub, Mul, Div, Max, Min, Pow, PowSlope };
enum class ReduceOp : int { Sum, Mean, Max, Min };
// Float storage conversions (mixed precision): FP32 to FP16 / BF16 rounds to nearest even (FP16
// overflow gives inf, NaN stays NaN), the widening directions are exact. FP16 and BF16 are their
// 16-bit patterns (uint16_t), as mpq's Float16 / BFloat16 tensors hold them.
enum class FloatConvert : int { F32ToF16, F16ToF32, F32ToBF16, BF16ToF32 };
enum class ResizeCoord : int { HalfPixel, PytorchHalfPixel, AlignCorners, Asymmetric };
enum class ResizeNearest : int { RoundPreferFloor, RoundPreferCeil, Floor, Ceil };

// Output dims and per-input element strides (0 along broadcast dimensions), from
// make_broadcast2() (kernels/plan_shape.h).
struct Broadcast2 {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t a_stride[kMaxRank] = {};
  int64_t b_stride[kMaxRank] = {};
};

// Output dims and, per output dimension, the input step in elements, plus the input offset of
// output element 0 (Slice: start*stride and step*stride; Transpose: permuted strides, base 0).
struct StridedView {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t in_step[kMaxRank] = {};
  int64_t base = 0;
};

// Slice's backward (SliceGradBody): the input's dimensions and, per dimension, the first input
// index the slice reads, its step (negative: backwards) and the output extent.
struct SliceGeom {
  int rank = 0;
  int64_t in_dims[kMaxRank] = {};
  int64_t begin[kMaxRank] = {};
  int64_t step[kMaxRank] = {};
  int64_t out_dims[kMaxRank] = {};
};

struct Pool2dGeom {
  int64_t planes = 1;  // N * C
  int64_t ih = 1, iw = 1, oh = 1, ow = 1;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t pad_t = 0, pad_l = 0, pad_b = 0, pad_r = 0;
};

struct Resize2dGeom {
  bool linear = false;
  ResizeCoord coord = ResizeCoord::HalfPixel;
  ResizeNearest nearest = ResizeNearest::RoundPreferFloor;
  int64_t planes = 1, ih = 1, iw = 1, oh = 1, ow = 1;
  double scale_h = 1.0, scale_w = 1.0;
};

// X viewed as [outer, channels, inner]; channel c uses scale[c] and zero_point[c] (zero_point may
// be null: all zeros). Pointers are device pointers on the GPU, host pointers in the harness.
struct QuantLayout {
  int64_t outer = 1, channels = 1, inner = 1;
  const float* scale = nullptr;
  const int32_t* zero_point = nullptr;
  int32_t qmin = -128, qmax = 127;
};

struct MinMaxPartial {
  float lo, hi;
  unsigned long long nonfinite;
};

// One FP32 matrix product as cuBLASLt sees it, column-major: for each batch b,
// C[b](i, j) = sum_k op(A[b])(i, k) * op(B[b])(k, j), i < m, j < n, with element (r, c) of a
// matrix at r + c * ld and op() a transpose when trans_*. Built from a cuBLASLt plan
// (kernels/lib_geom.h), so the same description drives cuBLASLt and the direct body
// (kernels/bodies/linalg.cuh) that checks the plan on the host and backs cuBLASLt up on the GPU.
struct MatmulGeom {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1, stride_a = 0, stride_b = 0, stride_c = 0;
};

// A direct NCDHW convolution (cross-correlation, as ONNX Conv and cuDNN): 2-D has d = 1, 1-D
// also h = 1. Pads are the leading pads (the plan only takes symmetric padding).
struct ConvGeom {
  int64_t n = 1, c = 1, m = 1, group = 1;
  int64_t id = 1, ih = 1, iw = 1, od = 1, oh = 1, ow = 1;
  int64_t kd = 1, kh = 1, kw = 1;
  int64_t sd = 1, sh = 1, sw = 1, pd = 0, ph = 0, pw = 0, dd = 1, dh = 1, dw = 1;
};

// One SGD step over a parameter tensor, as train::make_sgd does it (scalars resolved on the host:
// rate = lr * group scale, damp = 1 - dampening). log_space: the parameter is a learned
// quantization scale stepped multiplicatively (w *= exp(-rate * g * w)).
struct SgdStep {
  float rate = 0, weight_decay = 0, momentum = 0, damp = 1;
  bool nesterov = false, first = false, log_space = false;
};

// One AdamW step, as train::make_adamw does it: decay = 1 - lr * weight_decay (1 in log space),
// step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t), all computed in double on the
// host and rounded once.
struct AdamWStep {
  float decay = 1, one_minus_b1 = 0.1f, one_minus_b2 = 0.001f, b2 = 0.999f, step_size = 0, bc2_sqrt = 1, eps = 1e-8f;
  bool log_space = false;
};

}  // namespace mpq::cuda
