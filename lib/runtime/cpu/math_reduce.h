#pragma once
// The reduction engine behind Reduce* (reduce.cpp) and MeanVarianceNormalization (norm.cpp).
//
// A reduction over any set of axes is planned once: size-1 dimensions are dropped and adjacent
// dimensions that are both kept or both reduced are merged. Two layouts remain:
//  - the innermost group is reduced: each output folds contiguous rows of length `inner`
//    (multi-lane accumulators, so the fold vectorises), and a reduction with few outputs splits
//    each output's range over threads and combines the partial results;
//  - the innermost group is kept: each output row accumulates contiguous vectors of length
//    `inner` over every reduced offset.
// An op supplies init / map(x, shift) / comb / fin(acc, count, shift); `shift` is a per-output
// value (the maximum for LogSumExp, the mean for a variance), 0 when no shift array is given.
// An op may also supply row(p, n, shift), the fold of a contiguous row, to replace the lanes.
#include <algorithm>
#include <vector>

#include "runtime/cpu/common.h"

namespace mpq::rt::cpu::math {

struct ReducePlan {
  bool inner_reduced = true;
  int64_t inner = 1;        // length of the innermost merged group
  int64_t outputs = 1;      // number of output elements
  int64_t count = 1;        // input elements folded into each output
  std::vector<int64_t> kept_offsets;     // input offset of each output (row when !inner_reduced)
  std::vector<int64_t> reduced_offsets;  // relative offsets of each reduced combination (rows)
};

namespace detail {

struct Group {
  int64_t size, stride;
};

// Offsets of every combination of the groups, row-major.
inline std::vector<int64_t> enumerate_offsets(const std::vector<Group>& groups) {
  int64_t total = 1;
  for (const Group& g : groups) total *= g.size;
  std::vector<int64_t> out(static_cast<size_t>(total));
  if (total == 0) return out;
  std::vector<int64_t> idx(groups.size(), 0);
  int64_t off = 0;
  for (int64_t k = 0; k < total; ++k) {
    out[static_cast<size_t>(k)] = off;
    for (size_t d = groups.size(); d-- > 0;) {
      off += groups[d].stride;
      if (++idx[d] < groups[d].size) break;
      off -= groups[d].stride * groups[d].size;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace detail

// `reduce[i]` marks the reduced axes of `shape`.
inline ReducePlan plan_reduce(const Shape& shape, const std::vector<bool>& reduce) {
  ReducePlan p;
  const std::vector<int64_t> strides = strides_of(shape);
  std::vector<detail::Group> groups;
  std::vector<bool> flags;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (reduce[i]) p.count *= shape[i];
    else p.outputs *= shape[i];
    if (shape[i] == 1) continue;
    if (!groups.empty() && flags.back() == reduce[i]) {
      groups.back().size *= shape[i];
      groups.back().stride = strides[i];
    } else {
      groups.push_back({shape[i], strides[i]});
      flags.push_back(reduce[i]);
    }
  }
  std::vector<detail::Group> kept, red;
  if (!groups.empty()) {
    p.inner_reduced = flags.back();
    p.inner = groups.back().size;
    groups.pop_back();
    flags.pop_back();
  }
  for (size_t i = 0; i < groups.size(); ++i) (flags[i] ? red : kept).push_back(groups[i]);
  p.kept_offsets = detail::enumerate_offsets(kept);
  p.reduced_offsets = detail::enumerate_offsets(red);
  return p;
}

// out[o] = fin(fold over o's inputs of map(x, shift[o])). Acc is the accumulator type.
template <typename T, typename TO, typename Op>
void run_reduce(ThreadPool& pool, const ReducePlan& p, const T* x, TO* out, const typename Op::Acc* shift) {
  using Acc = typename Op::Acc;
  const int64_t inner = p.inner;
  const int64_t nred = static_cast<int64_t>(p.reduced_offsets.size());
  const int64_t* red = p.reduced_offsets.data();
  const int64_t* kept = p.kept_offsets.data();
  if (p.outputs == 0) return;
  if (p.inner_reduced) {
    // Fold the contiguous rows of output o over reduced elements [e0, e1) (e = row * inner + i).
    auto fold = [&](int64_t o, int64_t e0, int64_t e1) {
      const Acc s = shift ? shift[o] : Acc(0);
      Acc lanes[8];
      for (int j = 0; j < 8; ++j) lanes[j] = Op::init();
      Acc acc = Op::init();
      while (e0 < e1) {
        const int64_t r = e0 / inner, i0 = e0 % inner;
        const int64_t len = std::min(inner - i0, e1 - e0);
        const T* px = x + kept[o] + red[r] + i0;
        if constexpr (requires { Op::row(px, len, s); }) {
          acc = Op::comb(acc, Op::row(px, len, s));
        } else {
          int64_t i = 0;
          for (; i + 8 <= len; i += 8)
            for (int j = 0; j < 8; ++j) lanes[j] = Op::comb(lanes[j], Op::map(px[i + j], s));
          for (; i < len; ++i) acc = Op::comb(acc, Op::map(px[i], s));
        }
        e0 += len;
      }
      for (int j = 0; j < 8; ++j) acc = Op::comb(acc, lanes[j]);
      return acc;
    };
    const int64_t per_out = nred * inner;
    const int64_t threads = pool.size();
    // Few outputs with long ranges: split each range in pieces of at least 64K elements.
    int64_t pieces = 1;
    if (p.outputs < threads * 2 && per_out >= 2 * 65536)
      pieces = std::min<int64_t>(threads * 4 / std::max<int64_t>(p.outputs, 1) + 1, per_out / 65536);
    if (pieces <= 1) {
      pool.parallel_for(p.outputs, std::max<int64_t>(1, 32768 / std::max<int64_t>(per_out, 1)), [&](int64_t lo, int64_t hi) {
        for (int64_t o = lo; o < hi; ++o) out[o] = Op::fin(fold(o, 0, per_out), p.count, shift ? shift[o] : Acc(0));
      });
      return;
    }
    std::vector<Acc> partial(static_cast<size_t>(p.outputs * pieces));
    pool.parallel_for(p.outputs * pieces, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t t = lo; t < hi; ++t) {
        const int64_t o = t / pieces, k = t % pieces;
        partial[static_cast<size_t>(t)] = fold(o, per_out * k / pieces, per_out * (k + 1) / pieces);
      }
    });
    for (int64_t o = 0; o < p.outputs; ++o) {
      Acc acc = Op::init();
      for (int64_t k = 0; k < pieces; ++k) acc = Op::comb(acc, partial[static_cast<size_t>(o * pieces + k)]);
      out[o] = Op::fin(acc, p.count, shift ? shift[o] : Acc(0));
    }
    return;
  }
  // Innermost group kept: accumulate vectors of `inner` outputs, kChunk columns at a time.
  constexpr int64_t kChunk = 512;
  const int64_t rows = p.outputs / inner;
  const int64_t chunks = (inner + kChunk - 1) / kChunk;
  pool.parallel_for(rows * chunks, std::max<int64_t>(1, 32768 / std::max<int64_t>(nred * std::min(inner, kChunk), 1)),
                    [&](int64_t lo, int64_t hi) {
                      Acc acc[kChunk];
                      Acc s[kChunk];
                      for (int64_t t = lo; t < hi; ++t) {
                        const int64_t row = t / chunks, j0 = (t % chunks) * kChunk;
                        const int64_t w = std::min(kChunk, inner - j0);
                        const int64_t obase = row * inner + j0;
                        for (int64_t j = 0; j < w; ++j) {
                          acc[j] = Op::init();
                          s[j] = shift ? shift[obase + j] : Acc(0);
                        }
                        for (int64_t r = 0; r < nred; ++r) {
                          const T* px = x + kept[row] + red[r] + j0;
                          for (int64_t j = 0; j < w; ++j) acc[j] = Op::comb(acc[j], Op::map(px[j], s[j]));
                        }
                        for (int64_t j = 0; j < w; ++j) out[obase + j] = Op::fin(acc[j], p.count, s[j]);
                      }
                    });
}

// y[i] = f(x[i], o) for every input element i, o being the output it reduces into.
template <typename T, typename F>
void apply_reduced(ThreadPool& pool, const ReducePlan& p, const T* x, T* y, const F& f) {
  const int64_t inner = p.inner;
  const int64_t nred = static_cast<int64_t>(p.reduced_offsets.size());
  const int64_t* red = p.reduced_offsets.data();
  const int64_t* kept = p.kept_offsets.data();
  if (p.outputs == 0) return;
  if (p.inner_reduced) {
    pool.parallel_for(p.outputs, std::max<int64_t>(1, 32768 / std::max<int64_t>(nred * inner, 1)), [&](int64_t lo, int64_t hi) {
      for (int64_t o = lo; o < hi; ++o)
        for (int64_t r = 0; r < nred; ++r) {
          const int64_t base = kept[o] + red[r];
          for (int64_t i = 0; i < inner; ++i) y[base + i] = f(x[base + i], o);
        }
    });
    return;
  }
  const int64_t rows = p.outputs / inner;
  pool.parallel_for(rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(nred * inner, 1)), [&](int64_t lo, int64_t hi) {
    for (int64_t row = lo; row < hi; ++row)
      for (int64_t r = 0; r < nred; ++r) {
        const int64_t base = kept[row] + red[r];
        for (int64_t j = 0; j < inner; ++j) y[base + j] = f(x[base + j], row * inner + j);
      }
  });
}

}  // namespace mpq::rt::cpu::math
