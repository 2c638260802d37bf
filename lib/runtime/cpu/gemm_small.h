#pragma once
// Float32 Gemm, MatMul and mpq::MatMulBias with a small right operand (a classifier head, [1, 96]
// x [96, 128]^T; attention's per-head products, [16, 16] x [16, 16]; a small transformer's
// projections, [16, 64] x [64, 192]) in mpq's own kernel instead of OpenBLAS or oneDNN. OpenBLAS's
// sgemm packs both operands on every call whatever M is: a batch-1 head took 2.8 us there against
// 0.6 us here, and the transformer's attention MatMuls 3.9 against 2.2 us a run. oneDNN's matmul
// call costs more than such a product at batch 1 (the transformer 37.9 -> 33.3 us); from batch 8
// the two are level.
//
// Every row of C is computed by the same arithmetic whatever M, the row's position and the thread
// count: the executor's batch split (a batch cut into rows, one part per thread, runtime/batch_rows)
// must give the whole run's bits, so the choice of this kernel depends on K and N only, never on M
// (an M rule would run the whole batch through OpenBLAS and its halves through this kernel).
//
// The order of each sum is fixed (and is what small_gemm_ref computes, bit for bit):
// - B not transposed (B[k, n], N contiguous): acc = fma(a[k], b[k, n], acc) for k = 0, 1, ..., K - 1;
// - B transposed (B[n, k], K contiguous): K padded with zeros to a multiple of 16, sixteen partial
//   sums, lane j = fma over k = j, j + 16, ... (fma(0, 0, s) beyond K, as a masked vector load
//   gives); the lanes added as a tree (j + 8 onto j, then + 4, + 2, + 1).
// Then C = alpha * acc (beta 0, C not read) or alpha * acc + beta * C, multiply and add rounded
// apart. AVX-512 and AVX2 (as two halves of the sixteen lanes) give the same bits as the reference;
// columns and sums left over from whole vectors are masked vector loads and stores, not scalar loops.
// Not a public API.
#include <cstdint>

namespace mpq::rt {
class ThreadPool;
}

namespace mpq::rt::cpu {

// B's size (K * N) up to which Gemm runs here: 64 KiB, within a core's L2 with room for A and C.
inline constexpr int64_t kSmallGemmMaxB = 16384;

// Whether a float32 product with these dimensions runs in small_gemm: A not transposed, K * N at most
// kSmallGemmMaxB, and outside training (a DeterministicBlas scope keeps OpenBLAS there, whose sums
// the emulated CUDA path is compared with), on a CPU with AVX2 and FMA at least. Not where the
// kernel's vectors would be mostly empty: B not transposed needs N >= 16 (otherwise each row is one
// long chain of partly filled vectors over K), B transposed K >= 8 (otherwise each output is a
// masked load and a 16-lane tree for a few products). M plays no part (see above).
bool small_gemm_applies(bool ta, bool tb, int64_t k, int64_t n);

// C[m, n] = alpha * sum_k A[m, k] * op(B)[k, n] + beta * C[m, n] (beta 0: C is only written), rows
// spread over the pool in blocks from 256K multiply-adds (a transformer's projection at batch 1,
// 16 x 64 x 192, split over two threads took longer than on one: 36.0 against 32.8 us a run).
void small_gemm(ThreadPool& pool, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The scalar ground truth: the same sums in the same order, rows [r0, r1).
void small_gemm_ref(bool tb, int64_t r0, int64_t r1, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                    const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The instruction sets small_gemm has a build for; it runs the first this CPU supports.
enum class SmallGemmIsa { Avx512, Avx2, Scalar };
SmallGemmIsa small_gemm_isa();
bool small_gemm_isa_supported(SmallGemmIsa isa);
// Rows [r0, r1) on the given instruction set, which the CPU must support (tests compare each with
// small_gemm_ref).
void small_gemm_rows_on(SmallGemmIsa isa, bool tb, int64_t r0, int64_t r1, int64_t n, int64_t k, float alpha,
                        const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

}  // namespace mpq::rt::cpu
