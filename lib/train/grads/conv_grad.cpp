// Backward of Conv and ConvTranspose (1-D, 2-D, 3-D; groups, strides, dilations, pads, auto_pad,
// output_padding / output_shape, bias), with the forward's geometry (runtime/cpu/conv_common.h).
//
// Both ops are one correlation seen from two sides. Call P the tensor whose windows are unrolled
// (im2col) and Q the tensor at the window positions, with weights Wt laid out [G*Qg, Pg*K]:
//   Conv:          P = X,  Q = dY, Wt = W [M, C/G, k...];  dW = sum_n dY_n im2col(X_n)^T,
//                                                          dX = col2im(W^T dY_n);
//   ConvTranspose: P = dY, Q = X,  Wt = W [C, M/G, k...];  dW = sum_n X_n im2col(dY_n)^T,
//                                                          dX = W im2col(dY_n).
// A stride-1 Conv with fewer output than input channels computes dX the ConvTranspose way instead:
// the full correlation of dY with the flipped kernels (a smaller column matrix). window_grad runs these as BLAS GEMMs over pieces of a few images whose column
// matrix fits in cache (columns of the images side by side); 1-D/2-D windows build it from
// zero-padded, stride-phase-split planes with one long copy per column row (see Grid), 3-D ones
// with a plain im2col, and pointwise windows (1x1, stride 1, no padding) use the planes as they
// are. Depthwise Conv (one input channel per group, 1-D/2-D) has its own direct kernel
// (conv_grad_depthwise.cpp). Float32 1-D/2-D dX goes to oneDNN's backward-data kernel where
// runtime/cpu/conv_onednn.cpp takes the shape (each dX element summed by one thread in a fixed
// order); dW always stays here, since oneDNN's weight gradient adds per-thread partial sums.
//
// Determinism: pieces and the slices that sum dW (each its own part, the parts added in order)
// follow from the shapes alone; slices run side by side on the kernel pool with OpenBLAS on the
// calling thread, so the gradients are bit-identical at any thread count.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/conv_onednn.h"
#include "train/grads/conv_grad_internal.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;
using rt::cpu::blas_gemm;
using rt::cpu::ceil_div;
using rt::cpu::floor_div;
using rt::cpu::Window;
using rt::cpu::Window3;

// A piece's column matrix (im2col of its images or rows) is kept to about this size, so that it is
// still in cache when the GEMM packs it.
constexpr int64_t kChunkBytes = int64_t{1} << 20;
// dW is summed in at most kMaxSlices independent parts (fewer when they would take more than
// kPartialBytes), the unit of parallel work over images.
constexpr int64_t kMaxSlices = 64;
constexpr int64_t kPartialBytes = int64_t{16} << 20;

// OpenBLAS 0.3 splits a GEMM's inner dimension into blocks of GEMM_Q (SkylakeX: 448 for sgemm, 768
// for dgemm) and sizes the last blocks differently when it runs threaded, so a GEMM with a longer
// inner dimension rounds differently on one thread and on several (measured: sgemm 64x288 with
// K = 456 differs in 70% of the elements). The GEMMs here therefore always run on the calling
// thread (BlasOnCallingThread), and the parallelism comes from the kernel pool, over pieces of work
// fixed by the shapes alone.
class BlasOnCallingThread {
 public:
  BlasOnCallingThread() : threads_(openblas_get_num_threads()) { openblas_set_num_threads(1); }
  ~BlasOnCallingThread() { openblas_set_num_threads(threads_); }
  BlasOnCallingThread(const BlasOnCallingThread&) = delete;
  BlasOnCallingThread& operator=(const BlasOnCallingThread&) = delete;

 private:
  int threads_;
};

// C = beta * C + op(A) op(B), row-major (alpha is always 1 here).
template <typename T>
void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T beta,
          T* c, int64_t ldc) {
  blas_gemm(ta, tb, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
}

std::vector<int64_t> spatial(const Shape& s) { return std::vector<int64_t>(s.begin() + 2, s.end()); }

// Where tap kk of a window reads: offsets from an output position's window origin and the range
// [ow_lo, ow_hi) of output columns whose tap lies inside the input row.
struct Tap {
  int64_t doff, hoff, woff, ow_lo, ow_hi;
};

Tap tap_of(const Window3& g, int64_t kk) {
  const int64_t kw = kk % g.k[2], kh = (kk / g.k[2]) % g.k[1], kd = kk / (g.k[2] * g.k[1]);
  Tap t;
  t.doff = kd * g.d[0] - g.pb[0];
  t.hoff = kh * g.d[1] - g.pb[1];
  t.woff = kw * g.d[2] - g.pb[2];
  t.ow_lo = std::clamp<int64_t>(ceil_div(-t.woff, g.s[2]), 0, g.out[2]);
  t.ow_hi = std::clamp<int64_t>(floor_div(g.in[2] - 1 - t.woff, g.s[2]) + 1, t.ow_lo, g.out[2]);
  return t;
}

// Row r = (c, kd, kh, kw) of the column matrix of one image for output rows [p0, p1) (p = od * OH
// + oh): dst[(p - p0) * OW + ow] = P[c, od*s + kd*d - pad, oh*s + kh*d - pad, ow*s + kw*d - pad],
// zero in the padding.
template <typename T>
void im2col_row(const T* p, const Window3& g, int64_t r, int64_t p0, int64_t p1, T* dst) {
  const int64_t K = g.k_size(), OW = g.out[2], OH = g.out[1];
  const Tap t = tap_of(g, r % K);
  const T* pc = p + r / K * g.in_size() + t.ow_lo * g.s[2] + t.woff;
  int64_t od = p0 / OH, oh = p0 % OH;
  for (int64_t q = p0; q < p1; ++q, dst += OW) {
    const int64_t id = od * g.s[0] + t.doff, ih = oh * g.s[1] + t.hoff;
    if (++oh == OH) {
      oh = 0;
      ++od;
    }
    if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) {
      std::fill(dst, dst + OW, T(0));
      continue;
    }
    std::fill(dst, dst + t.ow_lo, T(0));
    copy_strided(pc + (id * g.in[1] + ih) * g.in[2], g.s[2], dst + t.ow_lo, t.ow_hi - t.ow_lo);
    std::fill(dst + t.ow_hi, dst + OW, T(0));
  }
}

// The transpose of im2col_row for channel c over every tap: plane[pos] += col[(c, tap), p] for the
// output rows [p0, p1) whose windows read pos, taps in order. The plane is zeroed first when the
// range starts at output row 0.
template <typename T>
void col2im_plane(const T* col, int64_t ld, const Window3& g, int64_t c, int64_t p0, int64_t p1, T* plane) {
  const int64_t K = g.k_size(), OW = g.out[2], OH = g.out[1], W = g.in[2], sw = g.s[2];
  if (p0 == 0) std::fill(plane, plane + g.in_size(), T(0));
  for (int64_t kk = 0; kk < K; ++kk) {
    const Tap t = tap_of(g, kk);
    const T* src = col + (c * K + kk) * ld;
    int64_t od = p0 / OH, oh = p0 % OH;
    for (int64_t q = p0; q < p1; ++q, src += OW) {
      const int64_t id = od * g.s[0] + t.doff, ih = oh * g.s[1] + t.hoff;
      if (++oh == OH) {
        oh = 0;
        ++od;
      }
      if (id < 0 || id >= g.in[0] || ih < 0 || ih >= g.in[1]) continue;
      T* __restrict dst = plane + (id * g.in[1] + ih) * W + t.woff;
      const T* __restrict s = src;
      if (sw == 1) {
        for (int64_t ow = t.ow_lo; ow < t.ow_hi; ++ow) dst[ow] += s[ow];
      } else {
        for (int64_t ow = t.ow_lo; ow < t.ow_hi; ++ow) dst[ow * sw] += s[ow];
      }
    }
  }
}

template <typename T>
struct WindowGradArgs {
  Window3 g;  // windows over P's spatial dimensions (g.in) at Q's positions (g.out)
  int64_t N = 0, G = 1, Pg = 0, Qg = 0;
  const T* p = nullptr;  // [N, G*Pg, g.in]
  const T* q = nullptr;  // [N, G*Qg, g.out]
  const T* w = nullptr;  // [G*Qg, Pg*K]
  T* dw = nullptr;       // sum_n Q_n im2col(P_n)^T
  T* dp = nullptr;       // col2im(W^T Q_n)
  T* dq = nullptr;       // W im2col(P_n)
};

template <typename T>
struct Scratch {
  std::vector<T> col, q, padded;
};

template <typename T>
T* reserve(std::vector<T>& v, int64_t n) {
  if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
  return v.data();
}

// The work of window_grad is cut into pieces (several whole images side by side, or row tiles of
// one large image) whose column matrix fits kChunkBytes; consecutive pieces form slices, each
// summing its own part of dW, and the slices' parts are added in order at the end. Pieces and
// slices follow from the shapes alone; slices run side by side on the kernel pool.
template <typename T>
void window_grad(rt::ThreadPool& pool, const WindowGradArgs<T>& a) {
  const Window3& g = a.g;
  const int64_t K = g.k_size(), Sp = g.in_size(), So = g.out_size(), PgK = a.Pg * K;
  const int64_t G = a.G, Pg = a.Pg, Qg = a.Qg, OW = g.out[2], rows = g.out[0] * g.out[1];
  bool pointwise = true;
  for (int d = 0; d < 3; ++d)
    if (g.k[d] != 1 || g.s[d] != 1 || g.pb[d] != 0 || g.in[d] != g.out[d]) pointwise = false;
  const Grid grid = pointwise ? Grid{} : grid_of(g);
  const int64_t row_bytes =
      std::max<int64_t>({PgK, Qg, 1}) * (grid.on ? grid.Wq : OW) * static_cast<int64_t>(sizeof(T));
  const int64_t fit_rows = std::max<int64_t>(1, kChunkBytes / row_bytes);
  const int64_t images = std::clamp<int64_t>(fit_rows / std::max<int64_t>(rows, 1), 1, std::max<int64_t>(a.N, 1));
  const int64_t tile = images > 1 ? rows : std::min(rows, fit_rows);
  struct Piece {
    int64_t n0, nb, p0, p1;
  };
  std::vector<Piece> pieces;
  for (int64_t n0 = 0; n0 < a.N; n0 += images)
    for (int64_t p0 = 0; p0 < rows; p0 += tile) pieces.push_back({n0, std::min(images, a.N - n0), p0, std::min(rows, p0 + tile)});
  // Slices hold whole images when the row tiles of one image add into the same dX planes (col2im).
  const int64_t per_unit = images > 1 || !a.dp ? 1 : ceil_div(rows, tile);
  const int64_t units = static_cast<int64_t>(pieces.size()) / per_unit;
  const int64_t dw_elems = G * Qg * PgK;
  int64_t slices = units;
  if (a.dw)
    slices = std::clamp<int64_t>(kPartialBytes / std::max<int64_t>(dw_elems * static_cast<int64_t>(sizeof(T)), 1), 1,
                                 std::min<int64_t>(units, kMaxSlices));
  std::vector<T> partials(a.dw && slices > 1 ? static_cast<size_t>(slices * dw_elems) : 0);
  auto first_piece = [&](int64_t j) { return j * units / slices * per_unit; };

  // Piece `pi` for group gi; dw_dst receives the slice's part of dW (beta 0 on its first piece).
  auto piece_group = [&](int64_t pi, int64_t gi, T* dw_dst, bool first) {
    const Piece pc = pieces[static_cast<size_t>(pi)];
    const int64_t trows = pc.p1 - pc.p0;
    thread_local Scratch<T> scratch;
    const T* wg = a.w + gi * Qg * PgK;
    T* dwg = a.dw ? dw_dst + gi * Qg * PgK : nullptr;
    const T beta = first ? T(0) : T(1);
    auto p_of = [&](int64_t b) { return a.p + ((pc.n0 + b) * G + gi) * Pg * Sp; };
    auto q_of = [&](int64_t b) { return ((pc.n0 + b) * G + gi) * Qg * So + pc.p0 * OW; };  // offset in Q / dQ
    auto dp_of = [&](int64_t b) { return a.dp + ((pc.n0 + b) * G + gi) * Pg * Sp; };
    if (grid.on) {
      // Each image's columns are (trows - 1) * Wq + OW grid positions (the last row's extra ones left out).
      const int64_t Wq = grid.Wq, Hq = grid.phase_rows(g, trows), chan = grid.sy * grid.sx * Hq * Wq;
      const int64_t cols = (trows - 1) * Wq + OW, L = pc.nb * cols, r0 = pc.p0 * grid.sy;
      T* col = (a.dw || a.dq || a.dp) ? reserve(scratch.col, PgK * L) : nullptr;
      T* phases = reserve(scratch.padded, pc.nb * Pg * chan);
      auto tap_src = [&](int64_t b, int64_t r) {
        return phases + (b * Pg + r / K) * chan + grid.tap_phase[static_cast<size_t>(r % K)] * Hq * Wq +
               grid.tap_off[static_cast<size_t>(r % K)];
      };
      if (a.dw || a.dq) {
        for (int64_t it = 0; it < pc.nb * Pg; ++it)
          fill_phases(p_of(it / Pg) + it % Pg * Sp, g.in[1], g.in[2], g.pb[1], g.pb[2], r0, Hq, grid, phases + it * chan);
        for (int64_t b = 0; b < pc.nb; ++b)
          for (int64_t r = 0; r < PgK; ++r) std::memcpy(col + r * L + b * cols, tap_src(b, r), static_cast<size_t>(cols) * sizeof(T));
      }
      T* qg = reserve(scratch.q, Qg * L);
      if (a.dw || a.dp) {
        for (int64_t b = 0; b < pc.nb; ++b)
          for (int64_t m = 0; m < Qg; ++m) {
            const T* src = a.q + q_of(b) + m * So;
            T* dst = qg + m * L + b * cols;
            for (int64_t r = 0; r < trows; ++r) {
              copy_row(src + r * OW, dst + r * Wq, OW);
              if (r + 1 < trows) std::fill(dst + r * Wq + OW, dst + (r + 1) * Wq, T(0));
            }
          }
      }
      if (a.dw) gemm(false, true, Qg, PgK, L, qg, L, col, L, beta, dwg, PgK);
      if (a.dq) {
        gemm(false, false, Qg, L, PgK, wg, PgK, col, L, T(0), qg, L);
        for (int64_t b = 0; b < pc.nb; ++b)
          for (int64_t m = 0; m < Qg; ++m)
            for (int64_t r = 0; r < trows; ++r) copy_row(qg + m * L + b * cols + r * Wq, a.dq + q_of(b) + m * So + r * OW, OW);
      }
      if (a.dp) {
        gemm(true, false, PgK, L, Qg, wg, PgK, qg, L, T(0), col, L);
        std::fill(phases, phases + pc.nb * Pg * chan, T(0));
        for (int64_t b = 0; b < pc.nb; ++b)
          for (int64_t r = 0; r < PgK; ++r) {
            T* __restrict dst = tap_src(b, r);
            const T* __restrict src = col + r * L + b * cols;
            for (int64_t j = 0; j < cols; ++j) dst[j] += src[j];
          }
        for (int64_t it = 0; it < pc.nb * Pg; ++it) {
          T* plane = dp_of(it / Pg) + it % Pg * Sp;
          if (pc.p0 == 0) std::fill(plane, plane + Sp, T(0));
          add_phases(phases + it * chan, g.in[1], g.in[2], g.pb[1], g.pb[2], r0, Hq, grid, plane);
        }
      }
      return;
    }
    const int64_t cols = trows * OW, L = pc.nb * cols;
    // Q's columns [Qg, L] (ld ldq).
    const T* qc = nullptr;
    int64_t ldq = L;
    if (a.dw || a.dp) {
      if (pc.nb == 1) {
        qc = a.q + q_of(0);
        ldq = So;
      } else {
        T* buf = reserve(scratch.q, Qg * L);
        for (int64_t b = 0; b < pc.nb; ++b)
          for (int64_t m = 0; m < Qg; ++m) copy_row(a.q + q_of(b) + m * So, buf + m * L + b * cols, cols);
        qc = buf;
      }
    }
    // P's columns [PgK, L] (ld ldc).
    const T* colp = nullptr;
    int64_t ldc = L;
    if (a.dw || a.dq) {
      if (pointwise && pc.nb == 1) {
        colp = p_of(0) + pc.p0 * OW;
        ldc = Sp;
      } else {
        T* col = reserve(scratch.col, PgK * L);
        for (int64_t b = 0; b < pc.nb; ++b)
          for (int64_t r = 0; r < PgK; ++r) {
            if (pointwise) copy_row(p_of(b) + r * Sp, col + r * L + b * cols, cols);
            else im2col_row(p_of(b), g, r, pc.p0, pc.p1, col + r * L + b * cols);
          }
        colp = col;
      }
    }
    if (a.dw) gemm(false, true, Qg, PgK, L, qc, ldq, colp, ldc, beta, dwg, PgK);
    if (a.dq)
      for (int64_t b = 0; b < pc.nb; ++b)
        gemm(false, false, Qg, cols, PgK, wg, PgK, colp + b * cols, ldc, T(0), a.dq + q_of(b), So);
    if (a.dp) {
      if (pointwise) {
        for (int64_t b = 0; b < pc.nb; ++b)
          gemm(true, false, Pg, cols, Qg, wg, PgK, qc + b * cols, ldq, T(0), dp_of(b) + pc.p0 * OW, Sp);
      } else {
        T* col = reserve(scratch.col, PgK * L);
        gemm(true, false, PgK, L, Qg, wg, PgK, qc, ldq, T(0), col, L);
        for (int64_t b = 0; b < pc.nb; ++b)
          for (int64_t c = 0; c < Pg; ++c) col2im_plane(col + b * cols, L, g, c, pc.p0, pc.p1, dp_of(b) + c * Sp);
      }
    }
  };

  {
    const BlasOnCallingThread blas_guard;
    pool.parallel_for(slices, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t j = lo; j < hi; ++j) {
        T* dst = slices > 1 ? partials.data() + j * dw_elems : a.dw;
        for (int64_t pi = first_piece(j); pi < first_piece(j + 1); ++pi)
          for (int64_t gi = 0; gi < G; ++gi) piece_group(pi, gi, dst, pi == first_piece(j));
      }
    });
  }
  if (a.dw && slices > 1) {
    pool.parallel_for(dw_elems, std::max<int64_t>(1, 16384 / slices), [&](int64_t lo, int64_t hi) {
      for (int64_t e = lo; e < hi; ++e) {
        T acc = partials[static_cast<size_t>(e)];
        for (int64_t j = 1; j < slices; ++j) acc += partials[static_cast<size_t>(j * dw_elems + e)];
        a.dw[e] = acc;
      }
    });
  }
}

// dB[m] = sum over images and positions of dY[n, m, ...]: each row of dY in 16 fixed partial sums,
// the rows added in image order in double.
template <typename T>
Tensor bias_grad(rt::ThreadPool& pool, const Tensor& dy, int64_t m_count, DType type) {
  Tensor db(type, {m_count});
  const int64_t n_count = dy.dim(0), S = m_count == 0 || n_count == 0 ? 0 : dy.numel() / (n_count * m_count);
  const T* g = dy.data<T>();
  T* out = db.data<T>();
  constexpr int64_t kLanes = 16;
  pool.parallel_for(m_count, std::max<int64_t>(1, 16384 / std::max<int64_t>(n_count * S, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) {
      double acc = 0.0;
      const int64_t s16 = S / kLanes * kLanes;
      for (int64_t n = 0; n < n_count; ++n) {
        const T* row = g + (n * m_count + m) * S;
        T lanes[kLanes] = {};
        for (int64_t i = 0; i < s16; i += kLanes)
          for (int64_t j = 0; j < kLanes; ++j) lanes[j] += row[i + j];
        for (int64_t i = s16; i < S; ++i) lanes[i - s16] += row[i];
        for (int64_t w = kLanes / 2; w > 0; w /= 2)
          for (int64_t j = 0; j < w; ++j) lanes[j] += lanes[j + w];
        acc += static_cast<double>(lanes[0]);
      }
      out[m] = static_cast<T>(acc);
    }
  });
  return db;
}

// The windows of a stride-1 convolution's input gradient: over dY (g.out) at X's positions (g.in),
// with the kernel flipped, so each window starts (k-1)*d - pad_begin before the position.
Window3 full_correlation_window(const Window3& g) {
  Window3 r = g;
  for (int d = 0; d < 3; ++d) {
    r.in[d] = g.out[d];
    r.out[d] = g.in[d];
    r.pb[d] = (g.k[d] - 1) * g.d[d] - g.pb[d];
    r.pe[d] = r.out[d] - r.in[d] - r.pb[d] + (g.k[d] - 1) * g.d[d];
  }
  return r;
}

// dX of a float32 1-D/2-D Conv through oneDNN's backward-data kernel, where it has a direct one and
// is measured faster (runtime/cpu/conv_onednn.h; same bits at any thread count); false otherwise.
bool onednn_dx(rt::ThreadPool& pool, const Window3& g, int64_t N, int64_t C, int64_t M, int64_t G, const float* w,
               const float* dy, float* dx) {
  if (g.in[0] != 1 || g.k[0] != 1) return false;  // 3-D
  const rt::cpu::DnnlConvShape s = rt::cpu::dnnl_conv_shape(N, C, M, G, g);
  return rt::cpu::onednn_conv_backward_data(pool, s, w, dy, dx);
}

// dW of a float32 1-D/2-D Conv through oneDNN's backward-weights kernel, in blocks of images
// added in a fixed order (runtime/cpu/conv_onednn.h; same bits at any thread count); false otherwise.
bool onednn_dw(rt::ThreadPool& pool, const Window3& g, int64_t N, int64_t C, int64_t M, int64_t G, const float* x,
               const float* dy, float* dw) {
  if (g.in[0] != 1 || g.k[0] != 1) return false;  // 3-D
  const rt::cpu::DnnlConvShape s = rt::cpu::dnnl_conv_shape(N, C, M, G, g);
  return rt::cpu::onednn_conv_backward_weights(pool, s, x, dy, dw);
}

int64_t read_group(const GradContext& ctx) {
  const int64_t G = ctx.node().attr_int("group", 1);
  if (G <= 0) ctx.fail("group must be positive, got {}", G);
  return G;
}

void conv_grad(GradContext& ctx) {
  const Tensor& dy = ctx.grad_output(0);
  const Shape& xs = ctx.input_shape(0);
  const Shape& ws = ctx.input_shape(1);
  const int64_t G = read_group(ctx);
  const rt::KernelContext kctx(ctx.node(), ctx.opset(), ctx.pool(), nullptr);
  const Window win = rt::cpu::forward_window(kctx, spatial(xs), spatial(ws), false);
  if (win.rank() > 3) ctx.fail_unsupported("the Conv backward takes 1 to 3 spatial dimensions, got {}", win.rank());
  const Window3 g = rt::cpu::to_window3(win);
  const int64_t N = xs[0], C = xs[1], M = ws[0], Cg = C / G, Mg = M / G;
  const DType type = dy.dtype();
  visit_float(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool want_x = ctx.needs_grad(0), want_w = ctx.needs_grad(1);
    // The kernels below write every element; only an empty problem leaves zeros.
    const bool compute = (want_x || want_w) && dy.numel() > 0 && Cg > 0;
    auto alloc = [&](bool want, const Shape& shape) {
      return !want ? Tensor() : compute ? Tensor(type, shape) : Tensor::zeros(type, shape);
    };
    Tensor dx = alloc(want_x, xs), dw = alloc(want_w, ws);
    if (compute) {
      const T* x = want_w ? ctx.input(0).data<T>() : nullptr;
      const T* w = want_x ? ctx.input(1).data<T>() : nullptr;
      T* dxp = want_x ? dx.data<T>() : nullptr;
      T* dwp = want_w ? dw.data<T>() : nullptr;
      if (Cg == 1 && G > 1 && depthwise_backward_applies(g)) {
        depthwise_conv_backward<T>(ctx.pool(), x, w, dy.data<T>(), dxp, dwp, N, C, Mg, g);
      } else {
        WindowGradArgs<T> a;
        a.g = g;
        a.N = N;
        a.G = G;
        a.Pg = Cg;
        a.Qg = Mg;
        a.p = x;
        a.q = dy.data<T>();
        a.w = w;
        a.dw = dwp;
        // With unit strides, dX is also the full correlation of dY with the flipped kernels: a
        // convolution of dY with windows at X's positions and weights W'[c, (m, k)] =
        // W[m, c, K-1-k]. Its column matrix has Mg*K rows where col2im's has Cg*K; the smaller
        // one wins (measured on 3x3 convs: 64->32 channels 10% faster this way, 32->64 20% slower).
        bool dx_done = false;
        if constexpr (std::is_same_v<T, float>) {
          if (want_x) dx_done = onednn_dx(ctx.pool(), g, N, C, M, G, w, dy.data<T>(), dxp);
          if (want_w && onednn_dw(ctx.pool(), g, N, C, M, G, x, dy.data<T>(), dwp)) a.dw = nullptr;
        }
        const bool full_correlation = want_x && !dx_done && g.s[0] == 1 && g.s[1] == 1 && g.s[2] == 1 && Mg < Cg;
        if (!full_correlation && !dx_done) a.dp = dxp;
        if (a.dw || a.dp) window_grad<T>(ctx.pool(), a);
        if (full_correlation) {
          const int64_t K = g.k_size();
          std::vector<T> flipped(static_cast<size_t>(G * Cg * Mg * K));
          for (int64_t gi = 0; gi < G; ++gi)
            for (int64_t c = 0; c < Cg; ++c)
              for (int64_t m = 0; m < Mg; ++m)
                for (int64_t k = 0; k < K; ++k)
                  flipped[static_cast<size_t>(((gi * Cg + c) * Mg + m) * K + k)] = w[((gi * Mg + m) * Cg + c) * K + K - 1 - k];
          WindowGradArgs<T> t;
          t.g = full_correlation_window(g);
          t.N = N;
          t.G = G;
          t.Pg = Mg;
          t.Qg = Cg;
          t.p = dy.data<T>();
          t.w = flipped.data();
          t.dq = dxp;
          window_grad<T>(ctx.pool(), t);
        }
      }
    }
    if (want_x) ctx.set_grad(0, std::move(dx));
    if (want_w) ctx.set_grad(1, std::move(dw));
    if (ctx.has_input(2) && ctx.needs_grad(2)) ctx.set_grad(2, bias_grad<T>(ctx.pool(), dy, M, type));
  });
}

// ConvTranspose's geometry, as runtime/cpu/conv.cpp resolves it: pads (explicit, or derived from
// auto_pad / output_shape, the extra element going to the end for SAME_UPPER) and the output size.
struct TransposeWindow {
  std::vector<int64_t> strides, dilations, pads, out;
};

TransposeWindow transpose_window(const GradContext& ctx, const rt::KernelContext& kctx, const std::vector<int64_t>& in,
                                 const std::vector<int64_t>& kernel) {
  const size_t k = in.size();
  const ir::Node& node = ctx.node();
  TransposeWindow t;
  auto ints = [&](const char* name, int64_t fill, bool positive) {
    std::vector<int64_t> v = node.attr_ints(name, {});
    if (v.empty()) v.assign(k, fill);
    if (v.size() != k) ctx.fail("{} has {} values but the input has {} spatial dimensions", name, v.size(), k);
    for (int64_t x : v)
      if (positive ? x <= 0 : x < 0) ctx.fail("{} must be {}, got {}", name, positive ? "positive" : "non-negative", x);
    return v;
  };
  t.strides = ints("strides", 1, true);
  t.dilations = ints("dilations", 1, true);
  const std::vector<int64_t> output_padding = ints("output_padding", 0, false);
  const rt::cpu::AutoPad ap = rt::cpu::read_auto_pad(kctx);
  std::vector<int64_t> os = node.attr_ints("output_shape", {});
  if (!os.empty()) {
    if (os.size() == k + 2) os.erase(os.begin(), os.begin() + 2);
    if (os.size() != k) ctx.fail("output_shape has {} values but the input has {} spatial dimensions", os.size(), k);
  }
  t.pads = node.attr_ints("pads", {});
  if (ap != rt::cpu::AutoPad::NotSet || !os.empty() || t.pads.empty()) t.pads.assign(2 * k, 0);
  if (t.pads.size() != 2 * k) ctx.fail("pads has {} values, expected {}", t.pads.size(), 2 * k);
  t.out.assign(k, 0);
  for (size_t d = 0; d < k; ++d) {
    const int64_t full = t.strides[d] * (in[d] - 1) + output_padding[d] + (kernel[d] - 1) * t.dilations[d] + 1;
    auto distribute = [&](int64_t total) {
      total = std::max<int64_t>(0, total);
      const int64_t small = total / 2, large = total - total / 2;
      t.pads[d] = ap == rt::cpu::AutoPad::SameUpper ? small : large;
      t.pads[k + d] = ap == rt::cpu::AutoPad::SameUpper ? large : small;
    };
    if (!os.empty()) {
      t.out[d] = os[d];
      distribute(full - os[d]);
    } else if (ap == rt::cpu::AutoPad::SameUpper || ap == rt::cpu::AutoPad::SameLower) {
      t.out[d] = in[d] * t.strides[d];
      distribute(full - t.out[d]);
    } else {
      t.out[d] = full - t.pads[d] - t.pads[k + d];
    }
    if (t.out[d] <= 0) ctx.fail("the output would be empty in spatial dimension {}", d);
  }
  return t;
}

void conv_transpose_grad(GradContext& ctx) {
  const Tensor& dy = ctx.grad_output(0);
  const Shape& xs = ctx.input_shape(0);
  const Shape& ws = ctx.input_shape(1);
  const int64_t G = read_group(ctx);
  const rt::KernelContext kctx(ctx.node(), ctx.opset(), ctx.pool(), nullptr);
  const std::vector<int64_t> in = spatial(xs), kernel = spatial(ws);
  if (in.size() > 3) ctx.fail_unsupported("the ConvTranspose backward takes 1 to 3 spatial dimensions, got {}", in.size());
  const TransposeWindow tw = transpose_window(ctx, kctx, in, kernel);
  // The windows of im2col run over Y (dY) and sit at X's positions.
  const Window3 g = rt::cpu::to_window3(Window{tw.out, kernel, tw.strides, tw.dilations, tw.pads, in});
  const int64_t N = xs[0], C = xs[1], Cg = C / G, Mg = ws[1], M = Mg * G;
  const DType type = dy.dtype();
  visit_float(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const bool want_x = ctx.needs_grad(0), want_w = ctx.needs_grad(1);
    const bool compute = (want_x || want_w) && dy.numel() > 0 && Cg > 0 && Mg > 0;
    auto alloc = [&](bool want, const Shape& shape) {
      return !want ? Tensor() : compute ? Tensor(type, shape) : Tensor::zeros(type, shape);
    };
    Tensor dx = alloc(want_x, xs), dw = alloc(want_w, ws);
    if (compute) {
      WindowGradArgs<T> a;
      a.g = g;
      a.N = N;
      a.G = G;
      a.Pg = Mg;
      a.Qg = Cg;
      a.p = dy.data<T>();
      a.q = want_w ? ctx.input(0).data<T>() : nullptr;
      a.w = want_x ? ctx.input(1).data<T>() : nullptr;
      a.dw = want_w ? dw.data<T>() : nullptr;
      a.dq = want_x ? dx.data<T>() : nullptr;
      window_grad<T>(ctx.pool(), a);
    }
    if (want_x) ctx.set_grad(0, std::move(dx));
    if (want_w) ctx.set_grad(1, std::move(dw));
    if (ctx.has_input(2) && ctx.needs_grad(2)) ctx.set_grad(2, bias_grad<T>(ctx.pool(), dy, M, type));
  });
}

}  // namespace

void register_conv_grads(GradRegistry& r) {
  for (auto [op, fn] : {std::pair<const char*, GradFn>{"Conv", conv_grad}, {"ConvTranspose", conv_transpose_grad}}) {
    GradDef d;
    d.op_type = op;
    d.fn = fn;
    d.differentiable = bit(0) | bit(1) | bit(2);
    d.saved_inputs = bit(0) | bit(1);  // X for dW, W for dX
    r.add(std::move(d));
  }
}

}  // namespace mpq::train::grads
