// Gemm and MatMul. Float32 goes to cblas_sgemm and float64 to cblas_dgemm, except float32 products
// with a small B (a classifier head, attention's per-head products), which run in mpq's own kernel
// (gemm_small.h); integer types use a plain loop (wrapping two's-complement arithmetic, as ONNX Runtime). float16/bfloat16 run in
// float32 through the executor.
//
// MatMul with a 2-D right operand folds A's batch dimensions into M (one GEMM); otherwise one GEMM
// per batch entry, spread over the kernel pool when OpenBLAS would run each on one thread anyway.
#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/gemm_small.h"
#include "runtime/cpu/matmul_onednn.h"
#include "runtime/cpu/register_all.h"

namespace mpq::rt::cpu {

namespace {

bool blas_type(DType t) { return t == DType::Float32 || t == DType::Float64; }

bool gemm_int_type(DType t) {
  return t == DType::Int32 || t == DType::Int64 || t == DType::UInt32 || t == DType::UInt64 || t == DType::Int8 ||
         t == DType::UInt8 || t == DType::Int16 || t == DType::UInt16;
}

// y[M, N] (+)= a[M, K] * b[K, N] for integer types, with arbitrary leading dimensions, rows [r0, r1).
template <typename T>
void int_matmul_rows(const T* a, int64_t lda, bool ta, const T* b, int64_t ldb, bool tb, T* y, int64_t N, int64_t K,
                     int64_t r0, int64_t r1, T alpha, bool accumulate) {
  using U = uint64_t;  // wrapping arithmetic without signed overflow
  std::vector<U> acc(static_cast<size_t>(N));
  for (int64_t i = r0; i < r1; ++i) {
    std::fill(acc.begin(), acc.end(), U(0));
    for (int64_t p = 0; p < K; ++p) {
      const U av = static_cast<U>(static_cast<int64_t>(ta ? a[p * lda + i] : a[i * lda + p]));
      if (tb) {
        for (int64_t j = 0; j < N; ++j) acc[static_cast<size_t>(j)] += av * static_cast<U>(static_cast<int64_t>(b[j * ldb + p]));
      } else {
        const T* brow = b + p * ldb;
        for (int64_t j = 0; j < N; ++j) acc[static_cast<size_t>(j)] += av * static_cast<U>(static_cast<int64_t>(brow[j]));
      }
    }
    T* yrow = y + i * N;
    const U al = static_cast<U>(static_cast<int64_t>(alpha));
    for (int64_t j = 0; j < N; ++j) {
      const U v = acc[static_cast<size_t>(j)] * al + (accumulate ? static_cast<U>(static_cast<int64_t>(yrow[j])) : U(0));
      yrow[j] = static_cast<T>(v);
    }
  }
}

// ---------------------------------------------------------------- Gemm

void gemm_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  const Tensor* c = ctx.input_or_null(2);
  const ir::Node& node = ctx.node();
  const bool ta = node.attr_int("transA", 0) != 0, tb = node.attr_int("transB", 0) != 0;
  const double alpha = node.attr_float("alpha", 1.0f), beta = node.attr_float("beta", 1.0f);
  if (a.dtype() != b.dtype() || (c && c->dtype() != a.dtype()))
    ctx.fail("inputs must have the same element type (A {}, B {}{})", dtype_name(a.dtype()), dtype_name(b.dtype()),
             c ? fmt::format(", C {}", dtype_name(c->dtype())) : std::string());
  if (!blas_type(a.dtype()) && !gemm_int_type(a.dtype()))
    ctx.fail("element type {} is not supported by Gemm", dtype_name(a.dtype()));
  if (a.rank() != 2 || b.rank() != 2)
    ctx.fail("A {} and B {} must be 2-D", shape_str(a.shape()), shape_str(b.shape()));
  const int64_t M = ta ? a.dim(1) : a.dim(0), K = ta ? a.dim(0) : a.dim(1);
  const int64_t Kb = tb ? b.dim(1) : b.dim(0), N = tb ? b.dim(0) : b.dim(1);
  if (K != Kb)
    ctx.fail("A {} (transA={}) and B {} (transB={}) have different inner dimensions {} and {}", shape_str(a.shape()),
             int(ta), shape_str(b.shape()), int(tb), K, Kb);
  int64_t cm = 1, cn = 1;
  if (c) {
    if (c->rank() > 2) ctx.fail("C must have rank 2 or less, got shape {}", shape_str(c->shape()));
    if (c->rank() == 2) cm = c->dim(0);
    if (c->rank() >= 1) cn = c->dim(-1);
    if ((cm != 1 && cm != M) || (cn != 1 && cn != N))
      ctx.fail("C {} cannot be broadcast to [{},{}]", shape_str(c->shape()), M, N);
  }
  Tensor& y = ctx.alloc_output(0, a.dtype(), {M, N});
  const bool use_c = c != nullptr && beta != 0.0;
  visit_arith(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* yp = y.data<T>();
    const T* ap = a.data<T>();
    const T* bp = b.data<T>();
    if (M == 0 || N == 0) return;
    // Y = beta * C (broadcast), then the product accumulates onto it.
    if (use_c) {
      const T* cp = c->data<T>();
      const T bt = static_cast<T>(beta);
      ctx.pool().parallel_for(M, std::max<int64_t>(1, 16384 / N), [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          const T* crow = cp + (cm == 1 ? 0 : i * cn);
          T* yrow = yp + i * N;
          if (cn == 1)
            std::fill(yrow, yrow + N, static_cast<T>(bt * crow[0]));
          else
            for (int64_t j = 0; j < N; ++j) yrow[j] = static_cast<T>(bt * crow[j]);
        }
      });
    }
    if (K == 0) {
      if (!use_c) std::fill(yp, yp + M * N, T(0));
      return;
    }
    const int64_t lda = a.dim(1), ldb = b.dim(1);
    if constexpr (std::is_same_v<T, float>) {
      if (small_gemm_applies(ta, tb, K, N))
        small_gemm(ctx.pool(), tb, M, N, K, static_cast<T>(alpha), ap, lda, bp, ldb, use_c ? 1.0f : 0.0f, yp, N);
      else
        blas_gemm_rows(ctx.pool(), ta, tb, M, N, K, static_cast<T>(alpha), ap, lda, bp, ldb, use_c ? T(1) : T(0), yp, N);
    } else if constexpr (std::is_floating_point_v<T>) {
      blas_gemm_rows(ctx.pool(), ta, tb, M, N, K, static_cast<T>(alpha), ap, lda, bp, ldb, use_c ? T(1) : T(0), yp, N);
    } else {
      ctx.pool().parallel_for(M, std::max<int64_t>(1, 16384 / std::max<int64_t>(N * K, 1)), [&](int64_t lo, int64_t hi) {
        int_matmul_rows<T>(ap, lda, ta, bp, ldb, tb, yp, N, K, lo, hi, static_cast<T>(alpha), use_c);
      });
    }
  });
}

// ---------------------------------------------------------------- MatMul

void matmul_kernel(KernelContext& ctx) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  if (a.dtype() != b.dtype())
    ctx.fail("A and B have different element types ({} and {})", dtype_name(a.dtype()), dtype_name(b.dtype()));
  if (!blas_type(a.dtype()) && !gemm_int_type(a.dtype()))
    ctx.fail("element type {} is not supported by MatMul", dtype_name(a.dtype()));
  if (a.rank() == 0 || b.rank() == 0)
    ctx.fail("MatMul needs operands of rank 1 or more, got {} and {}", shape_str(a.shape()), shape_str(b.shape()));
  Shape as = a.shape(), bs = b.shape();
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  if (bs[bs.size() - 2] != K)
    ctx.fail("A {} and B {} have different inner dimensions {} and {}", shape_str(a.shape()), shape_str(b.shape()), K,
             bs[bs.size() - 2]);
  const size_t brank = std::max(as.size(), bs.size()) - 2;
  Shape abatch(brank, 1), bbatch(brank, 1), batch(brank, 1);
  for (size_t i = 0; i + 2 < as.size(); ++i) abatch[brank - (as.size() - 2) + i] = as[i];
  for (size_t i = 0; i + 2 < bs.size(); ++i) bbatch[brank - (bs.size() - 2) + i] = bs[i];
  for (size_t i = 0; i < brank; ++i) {
    if (abatch[i] != bbatch[i] && abatch[i] != 1 && bbatch[i] != 1)
      ctx.fail("batch dimensions of A {} and B {} cannot be broadcast", shape_str(a.shape()), shape_str(b.shape()));
    batch[i] = std::max(abatch[i], bbatch[i]);
  }
  Shape yshape = batch;
  if (!a1) yshape.push_back(M);
  if (!b1) yshape.push_back(N);
  Tensor& y = ctx.alloc_output(0, a.dtype(), yshape);
  const int64_t nb = shape_numel(batch);
  if (nb == 0 || M == 0 || N == 0) return;

  // Offsets of A and B for every batch entry.
  const int64_t nba = shape_numel(abatch), nbb = shape_numel(bbatch);
  std::vector<int64_t> aoff(static_cast<size_t>(nb)), boff(static_cast<size_t>(nb));
  {
    std::vector<int64_t> idx(brank, 0);
    for (int64_t t = 0; t < nb; ++t) {
      int64_t ao = 0, bo = 0;
      for (size_t d = 0; d < brank; ++d) {
        ao = ao * abatch[d] + (abatch[d] == 1 ? 0 : idx[d]);
        bo = bo * bbatch[d] + (bbatch[d] == 1 ? 0 : idx[d]);
      }
      aoff[static_cast<size_t>(t)] = ao * M * K;
      boff[static_cast<size_t>(t)] = bo * K * N;
      for (size_t d = brank; d-- > 0;) {
        if (++idx[d] < batch[d]) break;
        idx[d] = 0;
      }
    }
  }
  visit_arith(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* ap = a.data<T>();
    const T* bp = b.data<T>();
    T* yp = y.data<T>();
    if (K == 0) {
      std::fill(yp, yp + nb * M * N, T(0));
      return;
    }
    if constexpr (std::is_floating_point_v<T>) {
      // A small B (attention's per-head products, 16 x 16 x 16 in the shipped transformers) in
      // mpq's own kernel, whose rows do not depend on how many there are (gemm_small.h).
      // y[rows, N] = a[rows, K] b[K, N] there; false, computing nothing, where it does not apply.
      auto small_product = [&](int64_t rows, const T* at, const T* bt, T* yt) {
        if constexpr (std::is_same_v<T, float>) {
          if (small_gemm_applies(false, false, K, N)) {
            small_gemm(ctx.pool(), false, rows, N, K, 1.0f, at, K, bt, N, 0.0f, yt, N);
            return true;
          }
        }
        return false;
      };
      if (nbb == 1 && nba == nb) {
        // B shared by every batch entry and A contiguous: one [nb*M, K] x [K, N] GEMM.
        if (!small_product(nb * M, ap, bp, yp))
          blas_gemm_rows(ctx.pool(), false, false, nb * M, N, K, T(1), ap, K, bp, N, T(0), yp, N);
        return;
      }
      auto one = [&](int64_t t) {
        if (small_product(M, ap + aoff[static_cast<size_t>(t)], bp + boff[static_cast<size_t>(t)], yp + t * M * N))
          return;
        blas_gemm_split(ctx.pool(), false, false, M, N, K, T(1), ap + aoff[static_cast<size_t>(t)], K,
                        bp + boff[static_cast<size_t>(t)], N, T(0), yp + t * M * N, N);
      };
      if (blas_runs_single_threaded(M, N, K) && nb > 1) {
        ctx.pool().parallel_for(nb, independent_gemm_grain(M, N, K), [&](int64_t lo, int64_t hi) {
          for (int64_t t = lo; t < hi; ++t) one(t);
        });
      } else {
        for (int64_t t = 0; t < nb; ++t) one(t);
      }
    } else {
      ctx.pool().parallel_for(nb * M, std::max<int64_t>(1, 16384 / std::max<int64_t>(N * K, 1)),
                              [&](int64_t lo, int64_t hi) {
                                for (int64_t r = lo; r < hi;) {
                                  const int64_t t = r / M, i0 = r % M;
                                  const int64_t i1 = std::min(M, i0 + (hi - r));
                                  int_matmul_rows<T>(ap + aoff[static_cast<size_t>(t)], K, false,
                                                     bp + boff[static_cast<size_t>(t)], N, false, yp + t * M * N, N, K, i0,
                                                     i1, T(1), false);
                                  r += i1 - i0;
                                }
                              });
    }
  });
}

// ---------------------------------------------------------------- mpq::MatMulBias

// Y = MatMul(A, B) + bias for a 2-D B [K, N] and a bias of N values (or one), from
// passes/fuse_matmul_bias in `mpq run`. Y starts as the bias rows and the GEMM accumulates onto it
// (beta = 1): OpenBLAS then skips its pass that zeroes C, and the Add's pass is gone too. With K
// inside one of OpenBLAS's blocks the sum is rounded once and then added to the bias, as before.
// A small B (gemm_small.h) runs in mpq's own kernel, a large one on oneDNN (matmul_onednn.h) or
// OpenBLAS.
void matmul_bias_compute(KernelContext& ctx, OnednnMatmulState* state) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  const Tensor& bias = ctx.input(2);
  if (a.dtype() != DType::Float32 || b.dtype() != DType::Float32 || bias.dtype() != DType::Float32)
    ctx.fail("needs float32 A, B and bias, got {}, {} and {}", dtype_name(a.dtype()), dtype_name(b.dtype()),
             dtype_name(bias.dtype()));
  if (a.rank() == 0 || b.rank() != 2)
    ctx.fail("needs A of rank >= 1 and a 2-D B, got {} and {}", shape_str(a.shape()), shape_str(b.shape()));
  const int64_t K = a.dim(-1), N = b.dim(1);
  if (b.dim(0) != K)
    ctx.fail("A {} and B {} have different inner dimensions {} and {}", shape_str(a.shape()), shape_str(b.shape()), K,
             b.dim(0));
  if (bias.numel() != N && bias.numel() != 1)
    ctx.fail("bias {} must have {} values (one per column) or one", shape_str(bias.shape()), N);
  Shape yshape(a.shape().begin(), a.shape().end() - 1);
  yshape.push_back(N);
  Tensor& y = ctx.alloc_output(0, DType::Float32, yshape);
  const int64_t M = K > 0 ? a.numel() / K : shape_numel(Shape(a.shape().begin(), a.shape().end() - 1));
  if (M == 0 || N == 0) return;
  float* yp = y.data<float>();
  const float* bp = bias.data<float>();
  const bool per_column = bias.numel() == N;
  // A small B in mpq's own kernel (gemm_small.h) before oneDNN: at a transformer's batch 1 (M 16,
  // K * N 4-12K) oneDNN's call costs more than the product; from batch 8 the two are level.
  const bool small = K > 0 && small_gemm_applies(false, false, K, N);
  if (!small && state && per_column && K > 0 &&
      onednn_matmul_bias(ctx.pool(), M, K, N, a.data<float>(), b.data<float>(), bp, yp, *state))
    return;
  ctx.pool().parallel_for(M, std::max<int64_t>(1, 16384 / N), [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float* yrow = yp + i * N;
      if (per_column)
        std::copy(bp, bp + N, yrow);
      else
        std::fill(yrow, yrow + N, bp[0]);
    }
  });
  if (K == 0) return;
  if (small) {
    small_gemm(ctx.pool(), false, M, N, K, 1.0f, a.data<float>(), K, b.data<float>(), N, 1.0f, yp, N);
    return;
  }
  blas_gemm_rows(ctx.pool(), false, false, M, N, K, 1.0f, a.data<float>(), K, b.data<float>(), N, 1.0f, yp, N);
}

// mpq::MatMulBias with a constant B (the fusion's guard): the kernel object, one per node and
// executor, keeps oneDNN's plan and B packed in its layout between runs.
class MatMulBiasKernel : public OpKernel {
 public:
  explicit MatMulBiasKernel(const ir::Node& node) {
    const ir::Value* b = node.num_inputs() > 1 ? node.input(1) : nullptr;
    if (b && b->is_constant()) state_ = std::make_unique<OnednnMatmulState>();
  }
  void compute(KernelContext& ctx) override { matmul_bias_compute(ctx, state_.get()); }

 private:
  std::unique_ptr<OnednnMatmulState> state_;
};

}  // namespace

void register_matmul(OpRegistry& r) {
  const auto cpu = BackendKind::CPU;
  r.add_fn("", "Gemm", 1, kMaxOpset, cpu, gemm_kernel);
  r.add_fn("", "MatMul", 1, kMaxOpset, cpu, matmul_kernel);
  KernelDef matmul_bias;
  matmul_bias.domain = "mpq";
  matmul_bias.op_type = "MatMulBias";
  matmul_bias.backend = cpu;
  matmul_bias.since = 1;
  matmul_bias.until = 1;
  matmul_bias.factory = [](const ir::Node& node, int) -> std::unique_ptr<OpKernel> {
    return std::make_unique<MatMulBiasKernel>(node);
  };
  r.add(std::move(matmul_bias));
}

}  // namespace mpq::rt::cpu
