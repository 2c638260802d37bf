#pragma once
// cuBLASLt GEMM plans as plain data (no CUDA headers): what the plugin will hand to
// cublasLtMatmulDescCreate / cublasLtMatrixLayoutCreate / cublasLtMatmulPreference, decided and
// checked on the host so that the rules are unit-tested without a GPU (tests/runtime/cuda_plan_test.cpp;
// tests/cuda/lt_descriptors_test.cpp also builds the real cuBLASLt descriptors from them).
//
// mpq's matrices are row-major; cuBLASLt is column-major. A row-major C[M,N] = A[M,K] * B[K,N] is
// the column-major C^T[N,M] = B^T[N,K] * A^T[K,M], so the plan swaps the operands: cuBLASLt's "A"
// is mpq's B and its "B" is mpq's A, and no data moves.
#include <cstdint>
#include <string>

namespace mpq::rt::cuda_plan {

enum class GemmPrecision {
  FP32,  // FP32 in/out, FP32 math
  TF32,  // FP32 in/out, TF32 tensor-core math (only when asked: --tf32)
  FP16,  // FP16 A/B, FP32 accumulation and scale, FP16 or FP32 output
  BF16,  // BF16 A/B, FP32 accumulation and scale, BF16 or FP32 output
  INT8,  // INT8 A/B, INT32 accumulation and output
};
enum class LtType { F32, F16, BF16, I8, I32 };
enum class LtCompute { F32, F32_FAST_TF32, I32 };

// Row-major problem: C[batch][M,N] = alpha * op(A) * op(B) + beta * C. Leading dimensions are in
// elements (0: packed). Addresses only matter for their alignment (0: assume 256-byte aligned,
// as the caching allocator returns).
struct GemmRequest {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  GemmPrecision precision = GemmPrecision::FP32;
  bool fp32_output = false;  // FP16/BF16 only: write C in FP32
  uintptr_t a_addr = 0, b_addr = 0, c_addr = 0;
  int sm = 90;  // compute capability major*10 + minor (workspace choice)
};

// One column-major cuBLASLt matrix layout.
struct LtLayout {
  LtType type = LtType::F32;
  int64_t rows = 0, cols = 0, ld = 0;
  int64_t batch = 1, batch_stride = 0;
};

struct GemmPlan {
  bool use_cublaslt = false;
  std::string fallback_reason;  // why not (then the caller uses another path), empty when usable
  LtCompute compute = LtCompute::F32;
  LtType scale_type = LtType::F32;
  bool op_a_transposed = false, op_b_transposed = false;  // cuBLASLt's opA / opB
  LtLayout a, b, c;                                       // cuBLASLt's A (= mpq's B), B (= mpq's A), C=D
  int64_t m = 0, n = 0, k = 0;                            // cuBLASLt's problem (m = mpq's N, n = mpq's M)
  // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES: the largest power of two up to 256 dividing the
  // address and every column start.
  int align_a = 256, align_b = 256, align_c = 256;
  size_t workspace_bytes = 0;
};

// Builds the plan or says why cuBLASLt cannot take the problem (the INT8 rules: int8 A/B need the
// "TN" form -- mpq's B given transposed, as [N, K] -- leading dimensions and m, k multiples of 4,
// 4-byte-aligned pointers). Throws BadInput on an inconsistent request (negative sizes, ld too small).
GemmPlan plan_gemm(const GemmRequest& r);

// The two GEMMs of a matrix product's backward (training). For the forward C = op(A) * op(B) of
// `forward` (packed operands; leading dimensions must be 0), dA has A's stored shape and dB B's:
//   dA = dC * op(B)^T, or op(B) * dC^T when A is stored transposed;
//   dB = op(A)^T * dC, or dC^T * op(A) when B is stored transposed.
// `grad_first` says whether dC is the request's first operand (mpq's A) and the forward operand
// (B for dA, A for dB) its second, or the other way round. FP32; batches as the forward's.
struct GemmGradRequest {
  GemmRequest request;
  bool grad_first = true;
};
struct MatmulGradRequests {
  GemmGradRequest da, db;
};
MatmulGradRequests plan_matmul_grad(const GemmRequest& forward);

// Byte alignment (power of two, capped at 256) common to `addr` and every multiple of `ld_bytes`.
int alignment_bytes(uintptr_t addr, int64_t ld_bytes);

size_t lt_type_size(LtType t);

}  // namespace mpq::rt::cuda_plan
