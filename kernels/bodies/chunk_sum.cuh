#pragma once
// Deterministic sums of long segments, for the backward's per-channel reductions (the LSQ scale
// gradient, a convolution's bias gradient, BatchNormalization's statistics and sums, the sum of a
// broadcast gradient back to a bias). One thread per segment walking all of it in order is exact
// and simple, but on a GPU it leaves a per-tensor reduction of a [64, 16, 28, 28] activation to a
// single thread: milliseconds, where the data takes microseconds to read (the first H100 run of
// `qat-finetune --device cuda` spent most of a step there). So each segment's m values are cut
// into `chunks` runs of ceil(m / chunks):
//   pass 1 (ChunkPartialBody): one thread per (segment, run) adds its run in order, in double;
//   pass 2 (ChunkTotalBody):   one thread per segment adds its runs in order.
// No atomics and no shared memory (the host harness runs the same code), and `chunks` depends on the
// problem's size alone (sum_chunks), so the result is the same for every launch shape and every run.
//
// The values of segment g are read through a term, `double operator()(int64_t g, int64_t flat)`,
// where flat walks the layout [outer, segments, inner]: segment g's j-th value (j = o * inner + i)
// has flat = (o * segments + g) * inner + i. A term that is not laid out so (SumToShapeTerm) takes
// outer = 1 and inner = m and recovers j as flat - g * m.
#include "kernels/hd.h"

namespace mpq::cuda {

// Runs per segment: enough for about 256 values each, but at most 1024 (pass 2's serial part) and
// at most 65536 / segments (so about 64K partial sums in all, unless there are more segments than
// that: then one run each); at least one. The caps make runs longer than 256 values.
MPQ_HD inline int64_t sum_chunks(int64_t segments, int64_t m) {
  int64_t k = (m + 255) / 256;
  int64_t cap = 65536 / (segments > 0 ? segments : 1);
  if (cap > 1024) cap = 1024;
  if (cap < 1) cap = 1;
  if (k > cap) k = cap;
  return k < 1 ? 1 : k;
}

// take_max: the largest value instead of the sum (-inf for an empty run; Softmax's row maximum).
template <class Term>
struct ChunkPartialBody {
  Term term;
  int64_t outer, segments, inner, chunks;
  double* partials;  // [segments, chunks]
  bool take_max = false;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t m = outer * inner, len = (m + chunks - 1) / chunks;
    for (int64_t idx = t.global(); idx < segments * chunks; idx += t.stride()) {
      const int64_t g = idx / chunks, k = idx % chunks;
      const int64_t lo = k * len, hi = lo + len < m ? lo + len : m;
      double s = take_max ? -__builtin_huge_val() : 0.0;
      if (lo < hi) {
        int64_t o = lo / inner, i = lo % inner;
        for (int64_t j = lo; j < hi; ++j) {
          const double v = term(g, (o * segments + g) * inner + i);
          s = take_max ? (v > s ? v : s) : s + v;
          if (++i == inner) {
            i = 0;
            ++o;
          }
        }
      }
      partials[idx] = s;
    }
  }
};

// totals[g] = the sum of segment g's partials, in order (or their largest, with take_max).
struct ChunkTotalBody {
  const double* partials;
  int64_t segments, chunks;
  double* totals;
  bool take_max = false;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t g = t.global(); g < segments; g += t.stride()) {
      double s = take_max ? -__builtin_huge_val() : 0.0;
      for (int64_t k = 0; k < chunks; ++k) {
        const double v = partials[g * chunks + k];
        s = take_max ? (v > s ? v : s) : s + v;
      }
      totals[g] = s;
    }
  }
};

// out[g] = totals[g] (times factor[g] when given), rounded once to float.
struct TotalsToFloatBody {
  const double* totals;
  const double* factor;  // may be null: 1
  float* out;
  int64_t segments;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t g = t.global(); g < segments; g += t.stride())
      out[g] = static_cast<float>(factor ? totals[g] * factor[g] : totals[g]);
  }
};

struct DoubleTerm {
  const double* v;
  MPQ_HD double operator()(int64_t, int64_t flat) const { return v[flat]; }
};
struct FloatTerm {
  const float* v;
  MPQ_HD double operator()(int64_t, int64_t flat) const { return static_cast<double>(v[flat]); }
};

// A launch for pass 1: the caller's shape (sized for the segments) widened to cover every partial,
// so a per-tensor sum does not run on the caller's one block.
inline LaunchShape chunk_launch(const LaunchShape& caller, int64_t partials) {
  LaunchShape s = caller;
  const int64_t threads = s.threads > 0 ? s.threads : 1;
  int64_t want = (partials + threads - 1) / threads;
  if (want > 4096) want = 4096;
  if (want > s.blocks) s.blocks = want;
  return s;
}

}  // namespace mpq::cuda
