#include "runtime/cuda/plan_gemm.h"

#include <algorithm>

#include "core/error.h"

namespace mpq::rt::cuda_plan {

size_t lt_type_size(LtType t) {
  switch (t) {
    case LtType::F32: return 4;
    case LtType::F16: return 2;
    case LtType::BF16: return 2;
    case LtType::I8: return 1;
    case LtType::I32: return 4;
  }
  return 4;
}

int alignment_bytes(uintptr_t addr, int64_t ld_bytes) {
  int a = 256;
  while (a > 1 && ((addr % static_cast<uintptr_t>(a)) != 0 || (ld_bytes % a) != 0)) a /= 2;
  return a;
}

GemmPlan plan_gemm(const GemmRequest& r) {
  if (r.m < 0 || r.n < 0 || r.k < 0 || r.batch < 1) fail_input("GEMM: bad sizes m={} n={} k={} batch={}", r.m, r.n, r.k, r.batch);
  // Row-major shapes of the stored matrices and their packed leading dimensions.
  const int64_t a_cols = r.trans_a ? r.m : r.k, b_cols = r.trans_b ? r.k : r.n;
  const int64_t a_rows = r.trans_a ? r.k : r.m, b_rows = r.trans_b ? r.n : r.k;
  const int64_t lda = r.lda ? r.lda : a_cols, ldb = r.ldb ? r.ldb : b_cols, ldc = r.ldc ? r.ldc : r.n;
  if (lda < std::max<int64_t>(a_cols, 1) || ldb < std::max<int64_t>(b_cols, 1) || ldc < std::max<int64_t>(r.n, 1))
    fail_input("GEMM: leading dimension smaller than the row (lda={} ldb={} ldc={})", lda, ldb, ldc);

  GemmPlan p;
  LtType in = LtType::F32, out = LtType::F32;
  switch (r.precision) {
    case GemmPrecision::FP32: break;
    case GemmPrecision::TF32: p.compute = LtCompute::F32_FAST_TF32; break;
    case GemmPrecision::FP16: in = LtType::F16; out = r.fp32_output ? LtType::F32 : LtType::F16; break;
    case GemmPrecision::BF16: in = LtType::BF16; out = r.fp32_output ? LtType::F32 : LtType::BF16; break;
    case GemmPrecision::INT8:
      in = LtType::I8;
      out = LtType::I32;
      p.compute = LtCompute::I32;
      p.scale_type = LtType::I32;
      break;
  }
  // Operand swap (see the header): cuBLASLt A = mpq B, cuBLASLt B = mpq A. A row-major [R, C]
  // matrix with leading dimension ld is a column-major [C, R] one with the same ld.
  p.m = r.n;
  p.n = r.m;
  p.k = r.k;
  p.op_a_transposed = r.trans_b;
  p.op_b_transposed = r.trans_a;
  p.a = LtLayout{in, b_cols, b_rows, ldb, r.batch, b_rows * ldb};
  p.b = LtLayout{in, a_cols, a_rows, lda, r.batch, a_rows * lda};
  p.c = LtLayout{out, r.n, r.m, ldc, r.batch, r.m * ldc};
  const int64_t esz = static_cast<int64_t>(lt_type_size(in)), osz = static_cast<int64_t>(lt_type_size(out));
  p.align_a = alignment_bytes(r.b_addr, ldb * esz);
  p.align_b = alignment_bytes(r.a_addr, lda * esz);
  p.align_c = alignment_bytes(r.c_addr, ldc * osz);
  // Hopper kernels want 32 MiB of workspace for their best algorithms, older GPUs 4 MiB
  // (cuBLAS documentation, "cuBLASLt workspace").
  p.workspace_bytes = r.sm >= 90 ? (size_t{32} << 20) : (size_t{4} << 20);

  if (r.m == 0 || r.n == 0) {
    p.fallback_reason = "empty output: nothing to compute";
    return p;
  }
  if (std::max({r.m, r.n, r.k, lda, ldb, ldc}) > int64_t{0x7fffffff}) {
    p.fallback_reason = "a dimension exceeds cuBLASLt's 32-bit limit";
    return p;
  }
  if (r.precision == GemmPrecision::INT8) {
    // cuBLASLt's IMMA rules for the regular (column) ordering.
    if (!p.op_a_transposed || p.op_b_transposed)
      p.fallback_reason = "INT8 needs the TN form: B given as [N, K] (transB) and A untransposed";
    else if (p.m % 4 != 0 || p.k % 4 != 0)
      p.fallback_reason = "INT8 needs N and K multiples of 4";
    else if (lda % 4 != 0 || ldb % 4 != 0 || ldc % 4 != 0)
      p.fallback_reason = "INT8 needs leading dimensions multiples of 4";
    else if (p.align_a < 4 || p.align_b < 4 || p.align_c < 4)
      p.fallback_reason = "INT8 needs 4-byte-aligned matrices";
    if (!p.fallback_reason.empty()) return p;
  }
  if ((r.precision == GemmPrecision::FP16 || r.precision == GemmPrecision::BF16) && (p.align_a < 2 || p.align_b < 2))
    p.fallback_reason = "half-precision operands not 2-byte aligned";
  p.use_cublaslt = p.fallback_reason.empty();
  return p;
}

MatmulGradRequests plan_matmul_grad(const GemmRequest& f) {
  if (f.lda || f.ldb || f.ldc) fail_input("GEMM backward: the forward's operands must be packed (lda, ldb, ldc 0)");
  if (f.m < 0 || f.n < 0 || f.k < 0 || f.batch < 1) fail_input("GEMM backward: bad sizes m={} n={} k={} batch={}", f.m, f.n, f.k, f.batch);
  auto request = [&](int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
    GemmRequest r;
    r.m = m;
    r.n = n;
    r.k = k;
    r.trans_a = ta;
    r.trans_b = tb;
    r.batch = f.batch;
    r.sm = f.sm;
    return r;
  };
  MatmulGradRequests g;
  // dA: [M, K] = dC[M, N] * op(B)^T, where op(B)^T is B itself when B is stored transposed; or,
  // stored as [K, M], op(B)[K, N] * dC^T.
  if (!f.trans_a) g.da = {request(f.m, f.k, f.n, false, !f.trans_b), true};
  else g.da = {request(f.k, f.m, f.n, f.trans_b, true), false};
  // dB: [K, N] = op(A)^T[K, M] * dC; or, stored as [N, K], dC^T[N, M] * op(A)[M, K].
  if (!f.trans_b) g.db = {request(f.k, f.n, f.m, !f.trans_a, false), false};
  else g.db = {request(f.n, f.k, f.m, true, f.trans_a), true};
  return g;
}

}  // namespace mpq::rt::cuda_plan
