#include "runtime/cpu/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/dispatch.h"

namespace mpq::rt::cpu {

namespace {

std::vector<double> to_doubles(const Tensor& t) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  visit_arith(t.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(p[i]);
  });
  return v;
}

Tensor from_doubles(DType dtype, const Shape& shape, const std::vector<double>& v) {
  Tensor t(dtype, shape);
  visit_arith(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = t.data<T>();
    for (size_t i = 0; i < v.size(); ++i) p[i] = static_cast<T>(v[i]);
  });
  return t;
}

void check_float(const Tensor& t, const char* what) {
  if (t.dtype() != DType::Float32 && t.dtype() != DType::Float64)
    fail_input("{}: {} must be float32 or float64, got {}", what, "tensor", dtype_name(t.dtype()));
}

std::vector<int64_t> or_fill(const std::vector<int64_t>& v, size_t n, int64_t fill) {
  return v.empty() ? std::vector<int64_t>(n, fill) : v;
}

// Advances a multi-index over `dims` in row-major order; false once it wraps around.
bool next_index(std::vector<int64_t>& idx, const std::vector<int64_t>& dims) {
  for (size_t d = dims.size(); d-- > 0;) {
    if (++idx[d] < dims[d]) return true;
    idx[d] = 0;
  }
  return false;
}

int64_t row_major_offset(const std::vector<int64_t>& idx, const std::vector<int64_t>& dims) {
  int64_t off = 0;
  for (size_t d = 0; d < dims.size(); ++d) off = off * dims[d] + idx[d];
  return off;
}

struct Resolved {
  size_t k;
  std::vector<int64_t> strides, dilations, pads;
};

Resolved resolve(const WindowGeometry& g, size_t k) {
  Resolved r{k, or_fill(g.strides, k, 1), or_fill(g.dilations, k, 1), or_fill(g.pads, 2 * k, 0)};
  if (r.strides.size() != k || r.dilations.size() != k || r.pads.size() != 2 * k)
    fail_input("reference: geometry has the wrong number of values for {} spatial dimensions", k);
  return r;
}

}  // namespace

Tensor conv_ref(const Tensor& x, const Tensor& w, const Tensor* bias, const WindowGeometry& g) {
  check_float(x, "conv_ref");
  if (x.rank() < 3 || w.rank() != x.rank()) fail_input("conv_ref: X {} and W {} ranks", shape_str(x.shape()), shape_str(w.shape()));
  const size_t k = static_cast<size_t>(x.rank() - 2);
  Resolved r = resolve(g, k);
  const int64_t N = x.dim(0), C = x.dim(1), M = w.dim(0), G = g.group;
  if (G <= 0 || C % G != 0 || M % G != 0 || w.dim(1) != C / G)
    fail_input("conv_ref: X {} W {} group {} do not match", shape_str(x.shape()), shape_str(w.shape()), G);
  std::vector<int64_t> in(k), ker(k), out(k);
  for (size_t d = 0; d < k; ++d) {
    in[d] = x.dim(static_cast<int>(d) + 2);
    ker[d] = w.dim(static_cast<int>(d) + 2);
    out[d] = (in[d] + r.pads[d] + r.pads[k + d] - (ker[d] - 1) * r.dilations[d] - 1) / r.strides[d] + 1;
    if (out[d] <= 0) fail_input("conv_ref: empty output");
  }
  Shape yshape{N, M};
  yshape.insert(yshape.end(), out.begin(), out.end());
  std::vector<double> X = to_doubles(x), W = to_doubles(w), B;
  if (bias) B = to_doubles(*bias);
  std::vector<double> Y(static_cast<size_t>(shape_numel(yshape)));
  const int64_t in_size = shape_numel(in), out_size = shape_numel(out), ker_size = shape_numel(ker);
  const int64_t Cg = C / G, Mg = M / G;
  std::vector<int64_t> oi(k, 0), ki(k, 0), ii(k, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m) {
      const int64_t grp = m / Mg;
      std::fill(oi.begin(), oi.end(), 0);
      for (int64_t o = 0; o < out_size; ++o, next_index(oi, out)) {
        double acc = bias ? B[static_cast<size_t>(m)] : 0.0;
        for (int64_t c = 0; c < Cg; ++c) {
          const int64_t xc = grp * Cg + c;
          std::fill(ki.begin(), ki.end(), 0);
          for (int64_t kk = 0; kk < ker_size; ++kk, next_index(ki, ker)) {
            bool inside = true;
            for (size_t d = 0; d < k; ++d) {
              ii[d] = oi[d] * r.strides[d] + ki[d] * r.dilations[d] - r.pads[d];
              if (ii[d] < 0 || ii[d] >= in[d]) inside = false;
            }
            if (!inside) continue;
            double xv = X[static_cast<size_t>((n * C + xc) * in_size + row_major_offset(ii, in))];
            double wv = W[static_cast<size_t>((m * Cg + c) * ker_size + kk)];
            acc += xv * wv;
          }
        }
        Y[static_cast<size_t>((n * M + m) * out_size + o)] = acc;
      }
    }
  return from_doubles(x.dtype(), yshape, Y);
}

Tensor conv_transpose_ref(const Tensor& x, const Tensor& w, const Tensor* bias, const WindowGeometry& g,
                          const std::vector<int64_t>& output_padding) {
  check_float(x, "conv_transpose_ref");
  if (x.rank() < 3 || w.rank() != x.rank())
    fail_input("conv_transpose_ref: X {} and W {} ranks", shape_str(x.shape()), shape_str(w.shape()));
  const size_t k = static_cast<size_t>(x.rank() - 2);
  Resolved r = resolve(g, k);
  std::vector<int64_t> opad = or_fill(output_padding, k, 0);
  const int64_t N = x.dim(0), C = x.dim(1), G = g.group;
  if (G <= 0 || C % G != 0 || w.dim(0) != C)
    fail_input("conv_transpose_ref: X {} W {} group {} do not match", shape_str(x.shape()), shape_str(w.shape()), G);
  const int64_t Mg = w.dim(1), M = Mg * G, Cg = C / G;
  std::vector<int64_t> in(k), ker(k), out(k);
  for (size_t d = 0; d < k; ++d) {
    in[d] = x.dim(static_cast<int>(d) + 2);
    ker[d] = w.dim(static_cast<int>(d) + 2);
    out[d] = r.strides[d] * (in[d] - 1) + opad[d] + (ker[d] - 1) * r.dilations[d] + 1 - r.pads[d] - r.pads[k + d];
    if (out[d] <= 0) fail_input("conv_transpose_ref: empty output");
  }
  Shape yshape{N, M};
  yshape.insert(yshape.end(), out.begin(), out.end());
  std::vector<double> X = to_doubles(x), W = to_doubles(w), B;
  if (bias) B = to_doubles(*bias);
  std::vector<double> Y(static_cast<size_t>(shape_numel(yshape)), 0.0);
  const int64_t in_size = shape_numel(in), out_size = shape_numel(out), ker_size = shape_numel(ker);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t o = 0; o < out_size; ++o)
        Y[static_cast<size_t>((n * M + m) * out_size + o)] = bias ? B[static_cast<size_t>(m)] : 0.0;
  std::vector<int64_t> ii(k, 0), ki(k, 0), oi(k, 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) {
      const int64_t grp = c / Cg;
      std::fill(ii.begin(), ii.end(), 0);
      for (int64_t i = 0; i < in_size; ++i, next_index(ii, in)) {
        const double xv = X[static_cast<size_t>((n * C + c) * in_size + i)];
        for (int64_t mm = 0; mm < Mg; ++mm) {
          const int64_t m = grp * Mg + mm;
          std::fill(ki.begin(), ki.end(), 0);
          for (int64_t kk = 0; kk < ker_size; ++kk, next_index(ki, ker)) {
            bool inside = true;
            for (size_t d = 0; d < k; ++d) {
              oi[d] = ii[d] * r.strides[d] + ki[d] * r.dilations[d] - r.pads[d];
              if (oi[d] < 0 || oi[d] >= out[d]) inside = false;
            }
            if (!inside) continue;
            Y[static_cast<size_t>((n * M + m) * out_size + row_major_offset(oi, out))] +=
                xv * W[static_cast<size_t>((c * Mg + mm) * ker_size + kk)];
          }
        }
      }
    }
  return from_doubles(x.dtype(), yshape, Y);
}

Tensor gemm_ref(const Tensor& a, const Tensor& b, const Tensor* c, double alpha, double beta, bool trans_a,
                bool trans_b) {
  if (a.rank() != 2 || b.rank() != 2) fail_input("gemm_ref: A and B must be 2-D");
  const int64_t M = trans_a ? a.dim(1) : a.dim(0), K = trans_a ? a.dim(0) : a.dim(1);
  const int64_t Kb = trans_b ? b.dim(1) : b.dim(0), N = trans_b ? b.dim(0) : b.dim(1);
  if (K != Kb) fail_input("gemm_ref: inner dimensions {} and {} differ", K, Kb);
  std::vector<double> A = to_doubles(a), B = to_doubles(b), Cv;
  int64_t cm = 1, cn = 1;
  if (c) {
    Cv = to_doubles(*c);
    if (c->rank() > 2) fail_input("gemm_ref: C has rank {}", c->rank());
    if (c->rank() == 2) cm = c->dim(0);
    if (c->rank() >= 1) cn = c->dim(-1);
    if ((cm != 1 && cm != M) || (cn != 1 && cn != N)) fail_input("gemm_ref: C does not broadcast");
  }
  std::vector<double> Y(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < K; ++p) {
        double av = trans_a ? A[static_cast<size_t>(p * M + i)] : A[static_cast<size_t>(i * K + p)];
        double bv = trans_b ? B[static_cast<size_t>(j * K + p)] : B[static_cast<size_t>(p * N + j)];
        acc += av * bv;
      }
      double y = alpha * acc;
      if (c) y += beta * Cv[static_cast<size_t>((cm == 1 ? 0 : i) * cn + (cn == 1 ? 0 : j))];
      Y[static_cast<size_t>(i * N + j)] = y;
    }
  return from_doubles(a.dtype(), {M, N}, Y);
}

Tensor matmul_ref(const Tensor& a, const Tensor& b) {
  if (a.rank() == 0 || b.rank() == 0) fail_input("matmul_ref: scalar operand");
  Shape as = a.shape(), bs = b.shape();
  const bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as.insert(as.begin(), 1);
  if (b1) bs.push_back(1);
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  if (bs[bs.size() - 2] != K) fail_input("matmul_ref: inner dimensions {} and {} differ", K, bs[bs.size() - 2]);
  const size_t rank = std::max(as.size(), bs.size());
  Shape batch(rank - 2, 1), abatch(rank - 2, 1), bbatch(rank - 2, 1);
  for (size_t i = 0; i + 2 < as.size(); ++i) abatch[rank - as.size() + i] = as[i];
  for (size_t i = 0; i + 2 < bs.size(); ++i) bbatch[rank - bs.size() + i] = bs[i];
  for (size_t i = 0; i < batch.size(); ++i) {
    if (abatch[i] != bbatch[i] && abatch[i] != 1 && bbatch[i] != 1) fail_input("matmul_ref: batch dims do not broadcast");
    batch[i] = std::max(abatch[i], bbatch[i]);
  }
  const bool integer = !dtype_is_float(a.dtype());
  std::vector<double> A = to_doubles(a), B = to_doubles(b);
  std::vector<int64_t> Ai, Bi;
  if (integer) {
    // Integer products can exceed double's 53-bit mantissa: accumulate in int64 (wrapping).
    Ai.resize(A.size());
    Bi.resize(B.size());
    for (size_t i = 0; i < A.size(); ++i) Ai[i] = a.get_int64(static_cast<int64_t>(i));
    for (size_t i = 0; i < B.size(); ++i) Bi[i] = b.get_int64(static_cast<int64_t>(i));
  }
  const int64_t nb = shape_numel(batch);
  Tensor y(a.dtype(), [&] {
    Shape s = batch;
    if (!a1) s.push_back(M);
    if (!b1) s.push_back(N);
    return s;
  }());
  std::vector<int64_t> bi(batch.size(), 0);
  std::vector<double> Y(static_cast<size_t>(nb * M * N));
  std::vector<int64_t> Yi(integer ? Y.size() : 0);
  for (int64_t t = 0; t < nb; ++t, next_index(bi, batch)) {
    int64_t ao = 0, bo = 0;
    for (size_t d = 0; d < batch.size(); ++d) {
      ao = ao * abatch[d] + (abatch[d] == 1 ? 0 : bi[d]);
      bo = bo * bbatch[d] + (bbatch[d] == 1 ? 0 : bi[d]);
    }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double acc = 0;
        uint64_t iacc = 0;
        for (int64_t p = 0; p < K; ++p) {
          size_t ia = static_cast<size_t>((ao * M + i) * K + p), ib = static_cast<size_t>((bo * K + p) * N + j);
          if (integer)
            iacc += static_cast<uint64_t>(Ai[ia]) * static_cast<uint64_t>(Bi[ib]);
          else
            acc += A[ia] * B[ib];
        }
        size_t iy = static_cast<size_t>((t * M + i) * N + j);
        Y[iy] = acc;
        if (integer) Yi[iy] = static_cast<int64_t>(iacc);
      }
  }
  if (!integer) return from_doubles(a.dtype(), y.shape(), Y);
  visit_arith(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = y.data<T>();
    for (size_t i = 0; i < Yi.size(); ++i) p[i] = static_cast<T>(Yi[i]);
  });
  return y;
}

int64_t pool_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t dilation, int64_t pad_begin,
                         int64_t pad_end, bool ceil_mode) {
  const int64_t span = in + pad_begin + pad_end - (kernel - 1) * dilation - 1;
  if (span < 0) return 0;
  int64_t out = (ceil_mode ? (span + stride - 1) / stride : span / stride) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad_begin) --out;
  return out;
}

namespace {

enum class PoolKind { Max, Avg };

Tensor pool_ref(const Tensor& x, const WindowGeometry& g, PoolKind kind, bool count_include_pad, Tensor* indices,
                int storage_order) {
  check_float(x, "pool_ref");
  if (x.rank() < 3) fail_input("pool_ref: X must have rank >= 3");
  const size_t k = static_cast<size_t>(x.rank() - 2);
  if (g.kernel.size() != k) fail_input("pool_ref: kernel has {} values for {} spatial dims", g.kernel.size(), k);
  Resolved r = resolve(g, k);
  const int64_t N = x.dim(0), C = x.dim(1);
  std::vector<int64_t> in(k), out(k);
  for (size_t d = 0; d < k; ++d) {
    in[d] = x.dim(static_cast<int>(d) + 2);
    out[d] = pool_output_size(in[d], g.kernel[d], r.strides[d], r.dilations[d], r.pads[d], r.pads[k + d], g.ceil_mode);
    if (out[d] <= 0) fail_input("pool_ref: empty output");
  }
  Shape yshape{N, C};
  yshape.insert(yshape.end(), out.begin(), out.end());
  std::vector<double> X = to_doubles(x);
  std::vector<double> Y(static_cast<size_t>(shape_numel(yshape)));
  std::vector<int64_t> I(Y.size());
  const int64_t in_size = shape_numel(in), out_size = shape_numel(out), ker_size = shape_numel(g.kernel);
  std::vector<int64_t> oi(k), ki(k), ii(k);
  for (int64_t nc = 0; nc < N * C; ++nc) {
    std::fill(oi.begin(), oi.end(), 0);
    for (int64_t o = 0; o < out_size; ++o, next_index(oi, out)) {
      double best = -std::numeric_limits<double>::infinity(), sum = 0;
      int64_t best_i = -1, count = 0, padded_count = 0;
      std::fill(ki.begin(), ki.end(), 0);
      for (int64_t kk = 0; kk < ker_size; ++kk, next_index(ki, g.kernel)) {
        bool inside = true, in_padded = true;
        for (size_t d = 0; d < k; ++d) {
          ii[d] = oi[d] * r.strides[d] + ki[d] * r.dilations[d] - r.pads[d];
          if (ii[d] < 0 || ii[d] >= in[d]) inside = false;
          if (ii[d] < -r.pads[d] || ii[d] >= in[d] + r.pads[k + d]) in_padded = false;
        }
        if (in_padded) ++padded_count;
        if (!inside) continue;
        ++count;
        const int64_t flat = row_major_offset(ii, in);
        const double v = X[static_cast<size_t>(nc * in_size + flat)];
        sum += v;
        if (v > best || best_i < 0) {
          best = v;
          if (storage_order == 0) {
            best_i = nc * in_size + flat;
          } else {
            int64_t col = 0;
            for (size_t d = k; d-- > 0;) col = col * in[d] + ii[d];
            best_i = nc * in_size + col;
          }
        }
      }
      const size_t iy = static_cast<size_t>(nc * out_size + o);
      if (kind == PoolKind::Max) {
        Y[iy] = best;
        I[iy] = best_i;
      } else {
        const int64_t div = count_include_pad ? padded_count : count;
        Y[iy] = div > 0 ? sum / static_cast<double>(div) : 0.0;
      }
    }
  }
  if (indices) *indices = Tensor::from<int64_t>(yshape, I);
  return from_doubles(x.dtype(), yshape, Y);
}

}  // namespace

Tensor max_pool_ref(const Tensor& x, const WindowGeometry& g, Tensor* indices, int storage_order) {
  return pool_ref(x, g, PoolKind::Max, false, indices, storage_order);
}

Tensor avg_pool_ref(const Tensor& x, const WindowGeometry& g, bool count_include_pad) {
  return pool_ref(x, g, PoolKind::Avg, count_include_pad, nullptr, 0);
}

}  // namespace mpq::rt::cpu
