#pragma once
// Shared helpers for CPU kernels: axis handling, strides and numpy-style broadcasting.
#include <array>
#include <cstdint>
#include <vector>

#include "core/dispatch.h"
#include "core/tensor.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace mpq::rt::cpu {

// Maps a possibly negative axis into [0, rank); fails naming the node when out of range.
int normalize_axis(const KernelContext& ctx, int64_t axis, int rank);
std::vector<int64_t> strides_of(const Shape& shape);

// numpy broadcasting of any number of shapes; fails naming the node when incompatible.
Shape broadcast_shapes(const KernelContext& ctx, const std::vector<const Shape*>& shapes);

// Iteration over a broadcast result with dimensions collapsed where every input agrees.
// fn(out_offset, in_offsets, inner, in_inner_strides) is called for runs of `inner` contiguous
// output elements; input k advances by in_inner_strides[k] (0 or 1) per element.
class BroadcastIter {
 public:
  static constexpr int kMaxInputs = 4;
  BroadcastIter(const Shape& out, const std::vector<const Shape*>& ins);
  int64_t outer_count() const { return outer_; }
  int64_t inner() const { return inner_; }
  int64_t inner_stride(size_t k) const { return inner_strides_[k]; }
  // Input offsets for outer index `o` (0 <= o < outer_count()).
  void offsets(int64_t o, int64_t* in_offsets) const;

 private:
  size_t n_inputs_;
  int64_t outer_ = 1;
  int64_t inner_ = 1;
  std::array<int64_t, kMaxInputs> inner_strides_{};
  std::vector<int64_t> outer_dims_;                       // collapsed outer dims
  std::vector<std::array<int64_t, kMaxInputs>> strides_;  // per outer dim, per input
};

// out[i] = f(a[i], b[i]) with broadcasting, parallel over outer runs.
template <typename TA, typename TB, typename TO, typename F>
void broadcast_binary(ThreadPool& pool, const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const TA* pa = a.data<TA>();
  const TB* pb = b.data<TB>();
  TO* po = out.data<TO>();
  const int64_t n = out.numel();
  if (n == 0) return;
  if (a.shape() == b.shape()) {
    pool.parallel_for(n, 16384, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) po[i] = f(pa[i], pb[i]);
    });
    return;
  }
  // A single-element operand never changes the element count, so the other one is contiguous.
  if (b.numel() == 1) {
    const TB bv = pb[0];
    pool.parallel_for(n, 16384, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) po[i] = f(pa[i], bv);
    });
    return;
  }
  if (a.numel() == 1) {
    const TA av = pa[0];
    pool.parallel_for(n, 16384, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) po[i] = f(av, pb[i]);
    });
    return;
  }
  BroadcastIter it(out.shape(), {&a.shape(), &b.shape()});
  const int64_t inner = it.inner();
  const int64_t sa = it.inner_stride(0), sb = it.inner_stride(1);
  int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(inner, 1));
  pool.parallel_for(it.outer_count(), grain, [&](int64_t lo, int64_t hi) {
    int64_t off[BroadcastIter::kMaxInputs];
    for (int64_t o = lo; o < hi; ++o) {
      it.offsets(o, off);
      const TA* xa = pa + off[0];
      const TB* xb = pb + off[1];
      TO* xo = po + o * inner;
      if (sa == 1 && sb == 1) {
        for (int64_t i = 0; i < inner; ++i) xo[i] = f(xa[i], xb[i]);
      } else if (sa == 1) {
        const TB bv = xb[0];
        for (int64_t i = 0; i < inner; ++i) xo[i] = f(xa[i], bv);
      } else if (sb == 1) {
        const TA av = xa[0];
        for (int64_t i = 0; i < inner; ++i) xo[i] = f(av, xb[i]);
      } else {
        for (int64_t i = 0; i < inner; ++i) xo[i] = f(xa[0], xb[0]);
      }
    }
  });
}

// Read a 1-D integer input (axes, shape, pads...) as int64 values.
std::vector<int64_t> input_ints(const KernelContext& ctx, size_t i);
// Scalar input as double (e.g. Clip min/max, Pad constant value).
double input_scalar(const KernelContext& ctx, size_t i);

}  // namespace mpq::rt::cpu
