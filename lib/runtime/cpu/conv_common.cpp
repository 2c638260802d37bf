#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/conv_onednn.h"

#include <algorithm>

#include "runtime/cpu/reference.h"

namespace mpq::rt::cpu {

namespace {
thread_local bool t_deterministic = false;
thread_local bool t_deterministic_onednn = false;
// Rows of C per block: a multiple of OpenBLAS's register blocking, large enough for its kernels to
// run at speed, and fixed so that the pieces do not depend on the thread count.
constexpr int64_t kDeterministicRows = 64;

// Pieces of a split GEMM are multiples of this many rows or columns (OpenBLAS's AVX2 kernels work on
// blocks of 8 or 16), so that no piece ends in a ragged tail of a few.
constexpr int64_t kSplitAlign = 16;

// C[r, 0:cols] = row_bias[r] for r in [0, rows): the bias a GEMM with beta 1 then adds to.
template <typename T>
void fill_rows(T* c, int64_t ldc, int64_t rows, int64_t cols, const T* row_bias) {
  for (int64_t r = 0; r < rows; ++r) std::fill(c + r * ldc, c + r * ldc + cols, row_bias[r]);
}

// OpenBLAS runs on one thread (see ThreadPool): a large GEMM is cut into one piece per pool thread
// along the longer of M and N, each piece a one-thread GEMM over all of K. With row_bias (the caller
// then passes beta 1), C's rows are first set to it: each piece sets its own part, on the thread
// that then accumulates into it, since a part of C set by one core and summed into by the other
// moves between their caches. U-Net's 1x1 convolution after its Resize (16 x 1024 x 32, two
// threads): 18.3 -> 16.3 us (medians of four processes, on one thread 12.6; the rest of the loss
// is its input, written by the Resize a channel per thread).
template <typename T>
void split_gemm(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
                const T* b, int64_t ldb, T beta, T* c, int64_t ldc, const T* row_bias = nullptr) {
  const int threads = pool.size();
  const bool split = threads > 1 && !ThreadPool::inside_parallel_loop() &&
                     static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) > kBlasSingleThreadMNK &&
                     std::max(m, n) >= 2 * kSplitAlign;
  if (!split) {
    if (row_bias) fill_rows(c, ldc, m, n, row_bias);
    blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool by_rows = m >= n;
  const int64_t extent = by_rows ? m : n;
  const int64_t piece = ceil_div(ceil_div(extent, threads), kSplitAlign) * kSplitAlign;
  const int64_t pieces = ceil_div(extent, piece);
  pool.parallel_for(pieces, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t p = lo; p < hi; ++p) {
      const int64_t e0 = p * piece, len = std::min(piece, extent - e0);
      if (by_rows) {
        const T* ap = ta ? a + e0 : a + e0 * lda;
        if (row_bias) fill_rows(c + e0 * ldc, ldc, len, n, row_bias + e0);
        blas_gemm(ta, tb, len, n, k, alpha, ap, lda, b, ldb, beta, c + e0 * ldc, ldc);
      } else {
        const T* bp = tb ? b + e0 * ldb : b + e0;
        if (row_bias) fill_rows(c + e0, ldc, m, len, row_bias);
        blas_gemm(ta, tb, m, len, k, alpha, a, lda, bp, ldb, beta, c + e0, ldc);
      }
    }
  });
}

template <typename T>
void gemm_rows(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
               const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if (!t_deterministic) {
    split_gemm(pool, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (m <= kDeterministicRows) {
    blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const int64_t blocks = (m + kDeterministicRows - 1) / kDeterministicRows;
  pool.parallel_for(blocks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t blk = lo; blk < hi; ++blk) {
      const int64_t m0 = blk * kDeterministicRows, rows = std::min(kDeterministicRows, m - m0);
      const T* ab = ta ? a + m0 : a + m0 * lda;
      blas_gemm(ta, tb, rows, n, k, alpha, ab, lda, b, ldb, beta, c + m0 * ldc, ldc);
    }
  });
}
}  // namespace

bool deterministic_blas() { return t_deterministic; }
bool deterministic_onednn_convolutions() { return t_deterministic && t_deterministic_onednn; }

DeterministicBlas::DeterministicBlas(bool onednn_convolutions)
    : previous_(t_deterministic), previous_onednn_(t_deterministic_onednn), previous_threads_(openblas_get_num_threads()) {
  t_deterministic = true;
  t_deterministic_onednn = onednn_convolutions;
  openblas_set_num_threads(1);
}

DeterministicBlas::~DeterministicBlas() {
  t_deterministic = previous_;
  t_deterministic_onednn = previous_onednn_;
  openblas_set_num_threads(previous_threads_);
}

void blas_gemm_rows(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_rows(pool, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void blas_gemm_rows(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const double* a,
                    int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  gemm_rows(pool, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void blas_gemm_split(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (t_deterministic) blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else split_gemm(pool, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void blas_gemm_split(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                     const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c, int64_t ldc) {
  if (t_deterministic) blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  else split_gemm(pool, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

namespace {
template <typename T>
void gemm_split_bias(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda,
                     const T* b, int64_t ldb, const T* row_bias, T* c, int64_t ldc) {
  const T beta = row_bias ? T(1) : T(0);
  if (t_deterministic) {  // one call on this thread, as blas_gemm_split makes
    if (row_bias) fill_rows(c, ldc, m, n, row_bias);
    blas_gemm(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
  } else {
    split_gemm(pool, ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc, row_bias);
  }
}
}  // namespace

void blas_gemm_split_bias(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a,
                          int64_t lda, const float* b, int64_t ldb, const float* row_bias, float* c, int64_t ldc) {
  gemm_split_bias(pool, ta, tb, m, n, k, a, lda, b, ldb, row_bias, c, ldc);
}
void blas_gemm_split_bias(ThreadPool& pool, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const double* a,
                          int64_t lda, const double* b, int64_t ldb, const double* row_bias, double* c, int64_t ldc) {
  gemm_split_bias(pool, ta, tb, m, n, k, a, lda, b, ldb, row_bias, c, ldc);
}

AutoPad read_auto_pad(const KernelContext& ctx) {
  std::string s = ctx.node().attr_string("auto_pad", "NOTSET");
  if (s == "NOTSET" || s.empty()) return AutoPad::NotSet;
  if (s == "SAME_UPPER") return AutoPad::SameUpper;
  if (s == "SAME_LOWER") return AutoPad::SameLower;
  if (s == "VALID") return AutoPad::Valid;
  ctx.fail("auto_pad must be NOTSET, SAME_UPPER, SAME_LOWER or VALID, got '{}'", s);
}

namespace {

std::vector<int64_t> positive_ints(const KernelContext& ctx, const char* name, size_t k, bool use) {
  std::vector<int64_t> v = use ? ctx.node().attr_ints(name, {}) : std::vector<int64_t>{};
  if (v.empty()) v.assign(k, 1);
  if (v.size() != k) ctx.fail("{} has {} values but the input has {} spatial dimensions", name, v.size(), k);
  for (int64_t x : v)
    if (x <= 0) ctx.fail("{} must be positive, got {}", name, x);
  return v;
}

}  // namespace

Window forward_window(const KernelContext& ctx, const std::vector<int64_t>& in, const std::vector<int64_t>& kernel,
                      bool ceil_mode, bool use_dilations) {
  const size_t k = in.size();
  Window w;
  w.in = in;
  w.kernel = kernel;
  if (kernel.size() != k) ctx.fail("kernel has {} dimensions but the input has {} spatial dimensions", kernel.size(), k);
  for (int64_t x : kernel)
    if (x <= 0) ctx.fail("kernel sizes must be positive, got {}", x);
  w.strides = positive_ints(ctx, "strides", k, true);
  w.dilations = positive_ints(ctx, "dilations", k, use_dilations);
  w.pads.assign(2 * k, 0);
  w.out.assign(k, 0);
  const AutoPad ap = read_auto_pad(ctx);
  if (ap == AutoPad::NotSet) {
    std::vector<int64_t> p = ctx.node().attr_ints("pads", {});
    if (!p.empty()) {
      if (p.size() != 2 * k) ctx.fail("pads has {} values, expected {}", p.size(), 2 * k);
      for (int64_t x : p)
        if (x < 0) ctx.fail("pads must not be negative, got {}", x);
      w.pads = p;
    }
  }
  for (size_t d = 0; d < k; ++d) {
    const int64_t ek = (kernel[d] - 1) * w.dilations[d] + 1;
    if (ap == AutoPad::SameUpper || ap == AutoPad::SameLower) {
      w.out[d] = ceil_div(in[d], w.strides[d]);
      const int64_t total = std::max<int64_t>(0, (w.out[d] - 1) * w.strides[d] + ek - in[d]);
      const int64_t small = total / 2, large = total - total / 2;
      w.pads[d] = ap == AutoPad::SameUpper ? small : large;
      w.pads[k + d] = ap == AutoPad::SameUpper ? large : small;
    } else {
      w.out[d] = pool_output_size(in[d], kernel[d], w.strides[d], w.dilations[d], w.pads[d], w.pads[k + d], ceil_mode);
    }
    if (w.out[d] <= 0)
      ctx.fail("the window (kernel {}, dilation {}) is larger than the padded input ({} + {} + {}) in spatial dimension {}",
               kernel[d], w.dilations[d], in[d], w.pads[d], w.pads[k + d], d);
  }
  return w;
}

Window3 to_window3(const Window& w) {
  Window3 r;
  const size_t k = w.rank();
  if (k > 3) fail_internal("to_window3: {} spatial dimensions", k);
  const size_t lead = 3 - k;
  for (size_t d = 0; d < 3; ++d) {
    if (d < lead) {
      r.in[d] = r.k[d] = r.s[d] = r.d[d] = r.out[d] = 1;
      r.pb[d] = r.pe[d] = 0;
    } else {
      const size_t s = d - lead;
      r.in[d] = w.in[s];
      r.k[d] = w.kernel[s];
      r.s[d] = w.strides[s];
      r.d[d] = w.dilations[s];
      r.pb[d] = w.pad_begin(s);
      r.pe[d] = w.pad_end(s);
      r.out[d] = w.out[s];
    }
  }
  return r;
}

DnnlConvShape dnnl_conv_shape(int64_t n, int64_t c, int64_t m, int64_t group, const Window3& g) {
  DnnlConvShape s;
  s.n = n;
  s.c = c;
  s.m = m;
  s.group = group;
  s.ih = g.in[1];
  s.iw = g.in[2];
  s.kh = g.k[1];
  s.kw = g.k[2];
  s.sh = g.s[1];
  s.sw = g.s[2];
  s.dh = g.d[1];
  s.dw = g.d[2];
  s.pt = g.pb[1];
  s.pl = g.pb[2];
  s.pb = g.pe[1];
  s.pr = g.pe[2];
  s.oh = g.out[1];
  s.ow = g.out[2];
  return s;
}

}  // namespace mpq::rt::cpu
