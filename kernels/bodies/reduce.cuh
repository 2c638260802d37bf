#pragma once
// Reductions over one axis, softmax and layer normalization. The input is viewed as
// [outer, n, inner] (n the reduced/normalized axis); one thread owns one (outer, inner) column and
// walks its n values, accumulating in double so the result does not depend on how work is split.
// Long softmax rows are the exception: chunked (SoftmaxApplyBody). (A block-per-row version with
// warp shuffles would be faster still; not written yet, see docs/gpu.md.)
#include "kernels/bodies/chunk_sum.cuh"
#include "kernels/hd.h"

namespace mpq::cuda {

struct ReduceBody {
  ReduceOp op;
  const float* x;
  float* y;  // [outer, inner]
  int64_t outer, n, inner;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t cols = outer * inner;
    for (int64_t c = t.global(); c < cols; c += t.stride()) {
      const int64_t o = c / inner, j = c % inner;
      const float* p = x + o * n * inner + j;
      if (op == ReduceOp::Max || op == ReduceOp::Min) {
        float m = p[0];
        for (int64_t k = 1; k < n; ++k) {
          const float v = p[k * inner];
          if (hd_isnan(v) || (op == ReduceOp::Max ? v > m : v < m)) m = v;
          if (hd_isnan(m)) break;
        }
        y[c] = m;
      } else {
        double s = 0.0;
        for (int64_t k = 0; k < n; ++k) s += p[k * inner];
        y[c] = static_cast<float>(op == ReduceOp::Mean ? s / static_cast<double>(n) : s);
      }
    }
  }
};

// Softmax (log_softmax when `log`) along the n axis of [outer, n, inner].
struct SoftmaxBody {
  bool log;
  const float* x;
  float* y;
  int64_t outer, n, inner;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t cols = outer * inner;
    for (int64_t c = t.global(); c < cols; c += t.stride()) {
      const int64_t off = (c / inner) * n * inner + c % inner;
      float m = x[off];
      for (int64_t k = 1; k < n; ++k) m = hd_max(m, x[off + k * inner]);
      double s = 0.0;
      for (int64_t k = 0; k < n; ++k) s += exp(static_cast<double>(x[off + k * inner]) - m);
      const double ls = ::log(s);
      for (int64_t k = 0; k < n; ++k) {
        const double v = static_cast<double>(x[off + k * inner]) - m;
        y[off + k * inner] = static_cast<float>(log ? v - ls : exp(v) / s);
      }
    }
  }
};

// Softmax for long rows (n >= kSoftmaxChunkedFrom): the row maximum and the sum of exponentials
// as chunked reductions (chunk_sum.cuh, rows as segments of the virtual layout [1, rows, n]), then
// one thread per element. The same arithmetic as SoftmaxBody (double exponentials of x - max, the
// sum in double), with the sum added in chunks: on a GPU one thread per row left a 256 x 4096
// softmax ten times slower than the CPU (bench_cuda_kernels on the H100).
// Element k of row r (r = o * inner + i) of [outer, n, inner].
MPQ_HD inline int64_t softmax_index(int64_t r, int64_t k, int64_t n, int64_t inner) {
  return ((r / inner) * n + k) * inner + r % inner;
}
struct SoftmaxValueTerm {
  const float* x;
  int64_t n, inner;
  MPQ_HD double operator()(int64_t r, int64_t flat) const { return x[softmax_index(r, flat - r * n, n, inner)]; }
};
struct SoftmaxExpTerm {
  const float* x;
  const double* row_max;
  int64_t n, inner;
  MPQ_HD double operator()(int64_t r, int64_t flat) const {
    // The maximum is a float value: rounding it to float, as SoftmaxBody's running maximum is, is exact.
    return exp(static_cast<double>(x[softmax_index(r, flat - r * n, n, inner)]) - static_cast<float>(row_max[r]));
  }
};
struct SoftmaxApplyBody {
  bool log;
  const float* x;
  const double* row_max;
  const double* row_sum;
  float* y;
  int64_t outer, n, inner;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = outer * n * inner;
    for (int64_t e = t.global(); e < total; e += t.stride()) {
      const int64_t r = (e / (n * inner)) * inner + e % inner;
      const double s = row_sum[r];
      const double v = static_cast<double>(x[e]) - static_cast<float>(row_max[r]);
      y[e] = static_cast<float>(log ? v - ::log(s) : exp(v) / s);
    }
  }
};

// LayerNormalization over the trailing n values of each of `rows` rows, with scale/bias of n
// (bias may be null); mean and inverse std-dev per row are optional outputs (may be null).
struct LayerNormBody {
  const float* x;
  const float* gamma;
  const float* beta;
  float* y;
  float* mean_out;
  float* inv_std_out;
  int64_t rows, n;
  float epsilon;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t r = t.global(); r < rows; r += t.stride()) {
      const float* p = x + r * n;
      double s = 0.0;
      for (int64_t k = 0; k < n; ++k) s += p[k];
      const double mean = s / static_cast<double>(n);
      double v = 0.0;
      for (int64_t k = 0; k < n; ++k) v += (p[k] - mean) * (p[k] - mean);
      const double inv = 1.0 / sqrt(v / static_cast<double>(n) + epsilon);
      for (int64_t k = 0; k < n; ++k)
        y[r * n + k] = static_cast<float>((p[k] - mean) * inv * gamma[k] + (beta ? beta[k] : 0.0f));
      if (mean_out) mean_out[r] = static_cast<float>(mean);
      if (inv_std_out) inv_std_out[r] = static_cast<float>(inv);
    }
  }
};

}  // namespace mpq::cuda
