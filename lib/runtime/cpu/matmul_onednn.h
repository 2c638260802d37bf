#pragma once
// mpq::MatMulBias (Y = A W + bias with W a graph constant: a transformer's projections) through
// oneDNN's matmul, with W packed once into oneDNN's layout. Measured against OpenBLAS on the shipped
// transformers' shapes (one thread, AVX-512; docs/runtime.md): oneDNN is 1.3-1.6x faster at
// 0.5-1.6M multiply-adds (M 128, K 64-128, N 64-192: a batch of 8 x 16 tokens); at batch 1 (M 16,
// 130-200K) the two are within 0.2 us either way, so products under 256K stay with OpenBLAS.
// Where OpenBLAS runs kernels without AVX-512 on an AVX-512 CPU (blas_kernels_below_cpu), oneDNN is
// faster from about 40K (2.2x at 200K), and products from 48K go to it. Products whose B has at
// most kSmallGemmMaxB values (runtime/cpu/gemm_small.h) run in mpq's own kernel before either.
// Like the convolutions, a call sets the OpenMP team size (omp_set_num_threads) for its thread and
// leaves it so; mpq's thread pool names its team size on every loop.
#include <cstdint>
#include <memory>

#include "runtime/thread_pool.h"

namespace mpq::rt::cpu {

// One node's plan, the memory objects of its last shape and its packed weights.
class OnednnMatmulState {
 public:
  OnednnMatmulState();
  ~OnednnMatmulState();
  OnednnMatmulState(const OnednnMatmulState&) = delete;
  OnednnMatmulState& operator=(const OnednnMatmulState&) = delete;
  struct Impl;
  std::unique_ptr<Impl> impl;
};

// y[M, N] = a[M, K] w[K, N] + bias[N] (row-major, dense) through oneDNN where it is enabled and
// allowed here and the product is large enough; returns false, computing nothing, otherwise. w must
// hold the same values on every call with the same state and address (it is packed once).
bool onednn_matmul_bias(ThreadPool& pool, int64_t m, int64_t k, int64_t n, const float* a, const float* w,
                        const float* bias, float* y, OnednnMatmulState& state);

// C = alpha * op(A) * op(B) + beta * C (row-major) by oneDNN's sgemm on `threads` threads (one
// inside a parallel loop), where OpenBLAS runs kernels without AVX-512 on an AVX-512 CPU
// (blas_kernels_below_cpu) and oneDNN is enabled and allowed here, outside training (a
// DeterministicBlas scope keeps OpenBLAS); returns false, computing nothing, otherwise. For
// ConvTranspose's GEMMs (runtime/cpu/conv.cpp): U-Net's upsampling at batch 8 (W^T X, 128 x 64 x 64
// per image), one thread, 89 us on OpenBLAS's Haswell kernels, 55 on oneDNN (ONNX Runtime 57). Not
// for every GEMM: a transformer's per-head products, a few thousand multiply-adds each, were slower
// (the transformer at batch 8 190 -> 204 us), and with OpenBLAS's AVX-512 kernels OpenBLAS is the
// faster (the same ConvTranspose 51 against 58 us).
bool onednn_sgemm_below_cpu(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                            int64_t ldc);

// How many products oneDNN has run in this process, and how many times it packed a B (tests check
// which path a shape took and that B is packed once).
uint64_t onednn_matmul_count();
uint64_t onednn_matmul_pack_count();
uint64_t onednn_sgemm_count();  // calls of onednn_sgemm_below_cpu that ran

}  // namespace mpq::rt::cpu
