#pragma once
// Data movement bodies: Gather, Slice, Concat, Transpose. One thread per output element (Concat:
// per element of one input; the launcher runs one launch per input). Backward: Gather's and
// Slice's below; Transpose's is the inverse permutation and Concat's a Slice of dY, both through
// GatherViewBody (plan_shape.h). Shapes are resolved on the
// host into the index structs below.
#include "kernels/hd.h"

namespace mpq::cuda {

// Gather along an axis: X viewed as [outer, axis_len, inner], `count` indices (negative ones count
// from the end); Y is [outer, count, inner]. An index out of range writes 0 and sets *bad, which
// the host turns into an error naming the node (the CPU kernel rejects it up front).
struct GatherBody {
  const float* x;
  const int64_t* indices;
  float* y;
  int64_t outer, axis_len, inner, count;
  int* bad;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = outer * count * inner;
    for (int64_t i = t.global(); i < total; i += t.stride()) {
      const int64_t j = i % inner, k = (i / inner) % count, o = i / (inner * count);
      int64_t idx = indices[k];
      if (idx < 0) idx += axis_len;
      if (idx < 0 || idx >= axis_len) {
        y[i] = 0.0f;
        *bad = 1;
        continue;
      }
      y[i] = x[(o * axis_len + idx) * inner + j];
    }
  }
};

MPQ_HD inline int64_t view_source(const StridedView& v, int64_t i) {
  int64_t off = v.base;
  for (int d = v.rank - 1; d >= 0; --d) {
    off += (i % v.dims[d]) * v.in_step[d];
    i /= v.dims[d];
  }
  return off;
}

// Slice and Transpose: y[i] = x[view_source(view, i)].
struct GatherViewBody {
  StridedView view;
  const float* x;
  float* y;
  int64_t n;
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) y[i] = x[view_source(view, i)];
  }
};

// Copies input [outer, part, inner] into Y [outer, total, inner] starting at `offset` along the
// concatenation axis.
struct ConcatPartBody {
  const float* x;
  float* y;
  int64_t outer, part, inner, total, offset;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t n = outer * part * inner;
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      const int64_t o = i / (part * inner), r = i % (part * inner);
      y[o * total * inner + offset * inner + r] = x[i];
    }
  }
};

// ---- backward bodies: one thread per element of dX, gathering (no atomics)

// Gather's backward: dX [outer, axis_len, inner] gets, for every index k that names its row
// (negative ones counted from the end, out-of-range ones skipped: the forward flagged them), the
// dY row k, summed in k order. Each element reads every index: O(count) per element.
struct GatherGradBody {
  const int64_t* indices;
  const float* dy;
  float* dx;
  int64_t outer, axis_len, inner, count;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = outer * axis_len * inner;
    for (int64_t i = t.global(); i < total; i += t.stride()) {
      const int64_t j = i % inner, a = (i / inner) % axis_len, o = i / (inner * axis_len);
      double s = 0.0;
      for (int64_t k = 0; k < count; ++k) {
        const int64_t idx = indices[k] < 0 ? indices[k] + axis_len : indices[k];
        if (idx == a) s += dy[(o * count + k) * inner + j];
      }
      dx[i] = static_cast<float>(s);
    }
  }
};

// The same from an inverse index built on the host: row a of dX sums the dY rows
// positions[offsets[a] .. offsets[a + 1]) (the index positions that name a, increasing, so the sum
// runs in k order as above). O(count + axis_len) per inner element instead of O(axis_len x count):
// an embedding table's backward.
struct GatherGradIndexedBody {
  const int64_t* offsets;    // axis_len + 1
  const int64_t* positions;  // count
  const float* dy;
  float* dx;
  int64_t outer, axis_len, inner, count;
  MPQ_HD void operator()(const Thread& t) const {
    const int64_t total = outer * axis_len * inner;
    for (int64_t i = t.global(); i < total; i += t.stride()) {
      const int64_t j = i % inner, a = (i / inner) % axis_len, o = i / (inner * axis_len);
      double s = 0.0;
      for (int64_t p = offsets[a]; p < offsets[a + 1]; ++p) s += dy[(o * count + positions[p]) * inner + j];
      dx[i] = static_cast<float>(s);
    }
  }
};

// Slice's backward: dX is dY where the slice read the input element and 0 elsewhere.
struct SliceGradBody {
  SliceGeom g;
  const float* dy;
  float* dx;
  int64_t n;  // elements of dX
  MPQ_HD void operator()(const Thread& t) const {
    for (int64_t i = t.global(); i < n; i += t.stride()) {
      int64_t rem = i, out = 0, stride = 1;
      bool read = true;
      for (int d = g.rank - 1; d >= 0 && read; --d) {
        const int64_t c = rem % g.in_dims[d];
        rem /= g.in_dims[d];
        const int64_t off = c - g.begin[d];
        const int64_t k = off / g.step[d];
        read = off % g.step[d] == 0 && k >= 0 && k < g.out_dims[d];
        out += k * stride;
        stride *= g.out_dims[d];
      }
      dx[i] = read ? dy[out] : 0.0f;
    }
  }
};

}  // namespace mpq::cuda
