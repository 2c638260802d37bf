#pragma once
// Internal helpers shared by the Conv, ConvTranspose, Gemm/MatMul and pooling kernels: BLAS
// wrappers, window attribute parsing (strides, dilations, pads, auto_pad), the depthwise
// convolution kernel and two AVX2 stride-2 copies (conv_depthwise.cpp). Not a public API.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/cpu/common.h"

namespace mpq::rt::cpu {

// OpenBLAS always runs on the calling thread (ThreadPool sets it so: its own threads would compete
// with the pool's). Independent GEMMs of at most this M*N*K are spread over the kernel pool, one per
// thread; larger ones are called one at a time and split over the pool (blas_gemm_split). The figure
// is OpenBLAS's own threading threshold, 65536 * GEMM_MULTITHREAD_THRESHOLD (interface/gemm.c).
inline constexpr double kBlasSingleThreadMNK = 65536.0 * 4.0;

// Deterministic GEMMs, for training: OpenBLAS (0.3.21 here) rounds differently on one thread and
// on several, and differently again when a GEMM is split into other pieces (its small-matrix kernels
// sum in another order). While a DeterministicBlas scope is alive on the calling thread, OpenBLAS
// runs on one thread, every kernel spreads its GEMMs over the kernel pool instead, and large GEMMs
// are cut into row blocks whose size depends only on the shapes (blas_gemm_rows), so the result
// is the same bits at any thread count. Inference splits large GEMMs by thread count instead.
//
// `onednn_convolutions` lets oneDNN's direct convolutions (forward, dX and dW, each the same bits at
// any thread count, runtime/cpu/conv_onednn.h) run inside the scope where they are measured faster;
// without it mpq's own kernels run every convolution, as the CUDA path's host-compiled bodies do.
bool deterministic_blas();
bool deterministic_onednn_convolutions();
class DeterministicBlas {
 public:
  explicit DeterministicBlas(bool onednn_convolutions = false);
  ~DeterministicBlas();
  DeterministicBlas(const DeterministicBlas&) = delete;
  DeterministicBlas& operator=(const DeterministicBlas&) = delete;

 private:
  bool previous_, previous_onednn_;
  int previous_threads_;
};

inline bool blas_runs_single_threaded(int64_t m, int64_t n, int64_t k) {
  return deterministic_blas() ||
         static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) <= kBlasSingleThreadMNK;
}

// Independent GEMMs of m*n*k multiply-adds each, spread over the pool: how many go in one chunk, so
// that a chunk holds at least kMinChunkMNK of work. Handing a tiny GEMM to another thread costs
// more than running it (a transformer's per-head [16,16]x[16,16] products at batch 1 took 2.6x as
// long on two threads as on one). The grouping never changes a GEMM, so results are the same.
inline constexpr double kMinChunkMNK = 65536.0;
inline int64_t independent_gemm_grain(int64_t m, int64_t n, int64_t k) {
  const double mnk = std::max(1.0, static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  return mnk >= kMinChunkMNK ? 1 : static_cast<int64_t>(std::ceil(kMinChunkMNK / mnk));
}

// Row-major C = alpha * op(A) * op(B) + beta * C.
inline void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}
inline void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a, int64_t lda,
                      const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// C = alpha * op(A) * op(B) + beta * C like blas_gemm, on the kernel pool: under DeterministicBlas
// the rows of C are cut into fixed blocks (one-thread GEMMs), otherwise as blas_gemm_split.
void blas_gemm_rows(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void blas_gemm_rows(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                    int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);

// C = alpha * op(A) * op(B) + beta * C like blas_gemm; above kBlasSingleThreadMNK and outside a
// parallel loop, cut along the longer of M and N into one piece per pool thread. Under
// DeterministicBlas one call on the calling thread (its summation order is then fixed).
void blas_gemm_split(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
void blas_gemm_split(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                     int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc);
// C = row_bias * 1^T + op(A) * op(B) (row_bias of M entries; null: C = op(A) * op(B)), split as
// blas_gemm_split, each piece setting its own part of C to the bias first: the same bits as setting
// all of C and then calling blas_gemm_split with beta 1, without most of C's lines moving between
// cores (a piece's edge may still fall inside a cache line).
void blas_gemm_split_bias(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
                          int64_t lda, const float* b, int64_t ldb, const float* row_bias, float* c, int64_t ldc);
void blas_gemm_split_bias(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a,
                          int64_t lda, const double* b, int64_t ldb, const double* row_bias, double* c, int64_t ldc);

// floor(a / b) for b > 0 and any sign of a.
inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }
inline int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

enum class AutoPad { NotSet, SameUpper, SameLower, Valid };
AutoPad read_auto_pad(const KernelContext& ctx);

// A sliding window over k spatial dimensions with every attribute resolved.
struct Window {
  std::vector<int64_t> in, kernel, strides, dilations;
  std::vector<int64_t> pads;  // 2k: begins then ends
  std::vector<int64_t> out;
  size_t rank() const { return in.size(); }
  int64_t pad_begin(size_t d) const { return pads[d]; }
  int64_t pad_end(size_t d) const { return pads[rank() + d]; }
};

// Reads strides / dilations / pads / auto_pad of a Conv or pooling node for the given input and
// kernel sizes and computes the output sizes (ceil_mode for pools). `use_dilations` false ignores
// the attribute (pools before the opset that introduced it).
Window forward_window(const KernelContext& ctx, const std::vector<int64_t>& in, const std::vector<int64_t>& kernel,
                      bool ceil_mode, bool use_dilations = true);

// The rank-3 form of a window (leading spatial dims of size 1 added), used by kernels that are
// written once for 1-D, 2-D and 3-D.
struct Window3 {
  int64_t in[3], k[3], s[3], d[3], pb[3], pe[3], out[3];
  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t out_size() const { return out[0] * out[1] * out[2]; }
  int64_t k_size() const { return k[0] * k[1] * k[2]; }
};
Window3 to_window3(const Window& w);

// dst[j] = src[2 * j] for j < n; reads src[0 .. 2n-2] only (AVX2 when the CPU has it).
void gather_stride2(const float* src, float* dst, int64_t n);

// dst0[j] = src[2 * j], dst1[j] = src[2 * j + 1] for j < n (AVX2 when the CPU has it).
void split_stride2(const float* src, float* dst0, float* dst1, int64_t n);

// Depthwise 2-D convolution (group == C, W [C*mult, 1, KH, KW]) for float32, any kernel size,
// stride, dilation and padding; parallel over input planes. `x` is [N, C, H, W]; 1-D convs pass
// H = KH = 1. `bias` may be null.
void depthwise_conv2d(ThreadPool& pool, const float* x, const float* w, const float* bias, float* y, int64_t n,
                      int64_t c, int64_t mult, const Window3& g);

// The same (multiplier 1, 2-D) with X and Y channel-blocked ([N, C/block, H, W, block], block 8
// or 16, C a multiple of it): conv_depthwise_blocked.cpp. `bias` may be null.
void depthwise_conv2d_blocked(ThreadPool& pool, const float* x, const float* w, const float* bias, float* y, int64_t n,
                              int64_t c, int64_t block, const Window3& g);

}  // namespace mpq::rt::cpu
