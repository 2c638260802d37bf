#pragma once
// mpq::MatMulBias (Y = A W + bias with W a graph constant: a transformer's projections) through
// oneDNN's matmul, with W packed once into oneDNN's layout. Measured against OpenBLAS on the shipped
// transformers' shapes (one thread, AVX-512; docs/runtime.md): oneDNN is 1.3-1.6x faster from about
// 0.5M multiply-adds (M 128, K 64-128, N 64-192: a batch of 8 x 16 tokens) and even below it, so
// smaller products stay with OpenBLAS, whose call costs less.
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

// How many products oneDNN has run in this process (tests check which path a shape took).
uint64_t onednn_matmul_count();

}  // namespace mpq::rt::cpu
