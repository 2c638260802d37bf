#include "train/grads/grad_util.h"

#include <algorithm>
#include <vector>

#include "runtime/cpu/unary.h"
#include "runtime/low_precision.h"

namespace mpq::train::grad_util {

namespace {
bool is_low(DType t) { return t == DType::Float16 || t == DType::BFloat16; }
constexpr int64_t kGrain = 16384;

// acc[j] += p[j] in double. Each element is one IEEE addition whatever the vector width, so the
// AVX-512 build gives the bits of the baseline one.
template <typename T>
void accumulate_row(double* __restrict acc, const T* __restrict p, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(p[j]);
}
#if defined(__x86_64__) && defined(__GNUC__)
template <typename T>
__attribute__((target("avx512f"))) void accumulate_row_avx512(double* __restrict acc, const T* __restrict p, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(p[j]);
}
#endif
// With the element-wise kernels' ISA choice (runtime/cpu/unary.h: the CPU's, or the one a test forces).
template <typename T>
void accumulate(double* acc, const T* p, int64_t n, rt::cpu::UnaryIsa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (isa == rt::cpu::UnaryIsa::Avx512) return accumulate_row_avx512(acc, p, n);
#endif
  accumulate_row(acc, p, n);
}
}  // namespace

Tensor convert(const Tensor& t, DType to) {
  if (!t.defined() || t.dtype() == to || to == DType::Undefined) return t;
  if (to == DType::Float32 && is_low(t.dtype())) return rt::widen_to_float32(t);
  if (is_low(to)) {
    if (t.dtype() == DType::Float32) return rt::narrow_from_float32(t, to);
    return rt::narrow_from_float32(convert(t, DType::Float32), to);
  }
  if (is_low(t.dtype())) return rt::widen_to_float32(t).cast_to(to);
  return t.cast_to(to);
}

Tensor add(rt::ThreadPool& pool, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype())
    fail_internal("gradient sum of {}{} and {}{}", dtype_name(a.dtype()), shape_str(a.shape()), dtype_name(b.dtype()),
                  shape_str(b.shape()));
  if (is_low(a.dtype())) return convert(add(pool, convert(a, DType::Float32), convert(b, DType::Float32)), a.dtype());
  Tensor out(a.dtype(), a.shape());
  visit_float(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    pool.parallel_for(a.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) po[i] = pa[i] + pb[i];
    });
  });
  return out;
}

void add_into(rt::ThreadPool& pool, Tensor& acc, const Tensor& g) {
  if (acc.shape() != g.shape() || acc.dtype() != g.dtype())
    fail_internal("gradient accumulation of {}{} into {}{}", dtype_name(g.dtype()), shape_str(g.shape()),
                  dtype_name(acc.dtype()), shape_str(acc.shape()));
  visit_float(acc.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* pa = acc.data<T>();
    const T* pg = g.data<T>();
    pool.parallel_for(acc.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) pa[i] += pg[i];
    });
  });
}

Tensor negate(rt::ThreadPool& pool, const Tensor& g) {
  Tensor out(g.dtype(), g.shape());
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = g.data<T>();
    T* po = out.data<T>();
    pool.parallel_for(g.numel(), kGrain, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) po[i] = -pg[i];
    });
  });
  return out;
}

Tensor reduce_to_shape(rt::ThreadPool& pool, const Tensor& g, const Shape& shape) {
  if (g.shape() == shape) return g;
  const Shape& gs = g.shape();
  if (shape.size() > gs.size()) fail_internal("reduce_to_shape: {} is not broadcast to {}", shape_str(shape), shape_str(gs));
  const size_t r = gs.size(), lead = r - shape.size();
  // Collapse g's dimensions into runs that are all kept or all reduced.
  struct Group {
    int64_t size;
    bool reduced;
  };
  std::vector<Group> groups;
  for (size_t d = 0; d < r; ++d) {
    const int64_t t = d < lead ? 1 : shape[d - lead];
    if (t != gs[d] && t != 1)
      fail_internal("reduce_to_shape: {} is not broadcast to {}", shape_str(shape), shape_str(gs));
    if (gs[d] == 1) continue;
    const bool reduced = t == 1;
    if (!groups.empty() && groups.back().reduced == reduced) groups.back().size *= gs[d];
    else groups.push_back({gs[d], reduced});
  }
  std::vector<int64_t> stride(groups.size());
  int64_t st = 1;
  for (size_t k = groups.size(); k-- > 0;) {
    stride[k] = st;
    st *= groups[k].size;
  }
  std::vector<size_t> kept, red;
  for (size_t k = 0; k < groups.size(); ++k) (groups[k].reduced ? red : kept).push_back(k);
  int64_t red_count = 1;
  for (size_t k : red) red_count *= groups[k].size;

  Tensor out(g.dtype(), shape);
  const int64_t n_out = out.numel();
  if (n_out > 0 && !red.empty() && !groups.back().reduced && groups.back().size >= 8) {
    // The innermost run is kept (a bias or scale gradient: [rows, C] -> [C]): sum whole rows into
    // a block of double accumulators, contiguous reads instead of one strided column per output.
    // Each output still adds its terms in the reduced index's order, so the bits are those of the
    // general loop below, at any thread count and block width.
    const int64_t inner = groups.back().size, outer = n_out / inner;
    // Blocks as wide as the row (up to 512) on one thread; on several, narrower ones (16 or more,
    // a cache line) so that every thread has two blocks or more.
    const int64_t want = pool.size() > 1 ? 2 * int64_t{pool.size()} : 1;
    const int64_t per_outer = std::max<int64_t>(1, (want + outer - 1) / outer);
    const int64_t width = std::min<int64_t>(512, std::max<int64_t>(16, ((inner + per_outer - 1) / per_outer + 15) / 16 * 16));
    const int64_t blocks = (inner + width - 1) / width;
    const size_t outer_groups = kept.size() - 1;
    visit_float(g.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* pg = g.data<T>();
      T* po = out.data<T>();
      const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(red_count * width, 1));
      const rt::cpu::UnaryIsa isa = rt::cpu::unary_isa();
      pool.parallel_for(outer * blocks, grain, [&](int64_t lo, int64_t hi) {
        std::vector<double> acc(static_cast<size_t>(width));
        std::vector<int64_t> idx(red.size());
        for (int64_t t = lo; t < hi; ++t) {
          const int64_t o = t / blocks, j0 = t % blocks * width, w = std::min(width, inner - j0);
          int64_t base = j0, rem = o;
          for (size_t q = outer_groups; q-- > 0;) {
            const size_t k = kept[q];
            base += (rem % groups[k].size) * stride[k];
            rem /= groups[k].size;
          }
          std::fill(acc.begin(), acc.begin() + w, 0.0);
          std::fill(idx.begin(), idx.end(), 0);
          for (int64_t c = 0; c < red_count; ++c) {
            int64_t off = base;
            for (size_t q = 0; q < red.size(); ++q) off += idx[q] * stride[red[q]];
            accumulate(acc.data(), pg + off, w, isa);
            for (size_t q = red.size(); q-- > 0;) {
              if (++idx[q] < groups[red[q]].size) break;
              idx[q] = 0;
            }
          }
          T* dst = po + o * inner + j0;
          for (int64_t j = 0; j < w; ++j) dst[j] = static_cast<T>(acc[static_cast<size_t>(j)]);
        }
      });
    });
    return out;
  }
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = g.data<T>();
    T* po = out.data<T>();
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(red_count, 1));
    pool.parallel_for(n_out, grain, [&](int64_t lo, int64_t hi) {
      std::vector<int64_t> idx(red.size());
      for (int64_t o = lo; o < hi; ++o) {
        int64_t base = 0, rem = o;
        for (size_t q = kept.size(); q-- > 0;) {
          const size_t k = kept[q];
          base += (rem % groups[k].size) * stride[k];
          rem /= groups[k].size;
        }
        double acc = 0.0;
        if (red.size() == 1) {
          const int64_t n = groups[red[0]].size, s = stride[red[0]];
          const T* p = pg + base;
          for (int64_t i = 0; i < n; ++i) acc += static_cast<double>(p[i * s]);
        } else {
          std::fill(idx.begin(), idx.end(), 0);
          for (int64_t c = 0; c < red_count; ++c) {
            int64_t off = base;
            for (size_t q = 0; q < red.size(); ++q) off += idx[q] * stride[red[q]];
            acc += static_cast<double>(pg[off]);
            for (size_t q = red.size(); q-- > 0;) {
              if (++idx[q] < groups[red[q]].size) break;
              idx[q] = 0;
            }
          }
        }
        po[o] = static_cast<T>(acc);
      }
    });
  });
  return out;
}

}  // namespace mpq::train::grad_util
