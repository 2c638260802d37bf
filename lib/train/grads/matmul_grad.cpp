// Backward of Gemm and MatMul through BLAS (sgemm for float32, dgemm for float64).
//
// All GEMMs go through rt::cpu::blas_gemm_rows, which the engine's DeterministicBlas scope turns into
// fixed row blocks on the kernel pool, so the gradients do not depend on the thread count.
//
// MatMul: dA = dY B^T and dB = A^T dY per batch entry. An operand that batch broadcasting shared
// between entries (a 2-D weight under a 3-D activation, the usual Linear layer) receives the sum
// over the entries it served: for a shared 2-D B that is one GEMM whose inner dimension runs over
// every row of A; otherwise the entries are added in batch order, so the result does not depend on
// the thread count. 1-D operands are promoted and demoted as in the forward.
#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "runtime/cpu/conv_common.h"
#include "train/grads/grad_util.h"
#include "train/grads/register_all_grads.h"

namespace mpq::train::grads {

namespace {

using grad_util::visit_float;
using rt::cpu::blas_gemm;

void gemm_grad(GradContext& ctx) {
  const ir::Node& n = ctx.node();
  const bool ta = n.attr_int("transA", 0) != 0, tb = n.attr_int("transB", 0) != 0;
  const double alpha = n.attr_float("alpha", 1.0f), beta = n.attr_float("beta", 1.0f);
  const Tensor& g = ctx.grad_output(0);
  const Shape& as = ctx.input_shape(0);
  const Shape& bs = ctx.input_shape(1);
  const int64_t M = ta ? as[1] : as[0], K = ta ? as[0] : as[1];
  const int64_t N = tb ? bs[0] : bs[1];
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* gp = g.data<T>();
    const T al = static_cast<T>(alpha);
    if (ctx.needs_grad(0)) {
      const Tensor& b = ctx.input(1);
      Tensor ga(g.dtype(), as);
      if (!ta) rt::cpu::blas_gemm_rows(ctx.pool(), false, !tb, M, K, N, al, gp, N, b.data<T>(), bs[1], T(0), ga.data<T>(), K);
      else rt::cpu::blas_gemm_rows(ctx.pool(), tb, true, K, M, N, al, b.data<T>(), bs[1], gp, N, T(0), ga.data<T>(), M);
      ctx.set_grad(0, std::move(ga));
    }
    if (ctx.needs_grad(1)) {
      const Tensor& a = ctx.input(0);
      Tensor gb(g.dtype(), bs);
      if (!tb) rt::cpu::blas_gemm_rows(ctx.pool(), !ta, false, K, N, M, al, a.data<T>(), as[1], gp, N, T(0), gb.data<T>(), N);
      else rt::cpu::blas_gemm_rows(ctx.pool(), true, ta, N, K, M, al, gp, N, a.data<T>(), as[1], T(0), gb.data<T>(), K);
      ctx.set_grad(1, std::move(gb));
    }
    if (ctx.has_input(2) && ctx.needs_grad(2)) {
      Tensor gc = grad_util::reduce_to_shape(ctx.pool(), g, ctx.input_shape(2));
      if (gc.same_buffer(g)) gc = gc.clone();
      T* p = gc.data<T>();
      for (int64_t i = 0; i < gc.numel(); ++i) p[i] *= static_cast<T>(beta);
      ctx.set_grad(2, std::move(gc));
    }
  });
}

struct MatMulGeometry {
  Shape as, bs;  // promoted to rank >= 2
  int64_t M = 0, K = 0, N = 0;
  int64_t nb = 1, nba = 1, nbb = 1;
  std::vector<int64_t> aidx, bidx;  // per output batch entry: batch entry of A and of B
};

MatMulGeometry matmul_geometry(const Shape& a, const Shape& b) {
  MatMulGeometry m;
  m.as = a;
  m.bs = b;
  if (m.as.size() == 1) m.as.insert(m.as.begin(), 1);
  if (m.bs.size() == 1) m.bs.push_back(1);
  m.M = m.as[m.as.size() - 2];
  m.K = m.as.back();
  m.N = m.bs.back();
  const size_t brank = std::max(m.as.size(), m.bs.size()) - 2;
  Shape abatch(brank, 1), bbatch(brank, 1), batch(brank, 1);
  for (size_t i = 0; i + 2 < m.as.size(); ++i) abatch[brank - (m.as.size() - 2) + i] = m.as[i];
  for (size_t i = 0; i + 2 < m.bs.size(); ++i) bbatch[brank - (m.bs.size() - 2) + i] = m.bs[i];
  for (size_t i = 0; i < brank; ++i) batch[i] = std::max(abatch[i], bbatch[i]);
  m.nb = shape_numel(batch);
  m.nba = shape_numel(abatch);
  m.nbb = shape_numel(bbatch);
  std::vector<int64_t> idx(brank, 0);
  for (int64_t t = 0; t < m.nb; ++t) {
    int64_t ao = 0, bo = 0;
    for (size_t d = 0; d < brank; ++d) {
      ao = ao * abatch[d] + (abatch[d] == 1 ? 0 : idx[d]);
      bo = bo * bbatch[d] + (bbatch[d] == 1 ? 0 : idx[d]);
    }
    m.aidx.push_back(ao);
    m.bidx.push_back(bo);
    for (size_t d = brank; d-- > 0;) {
      if (++idx[d] < batch[d]) break;
      idx[d] = 0;
    }
  }
  return m;
}

// For every output batch entry t: dst[entry(t)] (+)= op(x_t) * op(y_t), with x_t / y_t the
// per-entry matrices; entries sharing a destination are added in order t = 0, 1, ...
template <typename T>
void batched_grad_gemm(rt::ThreadPool& pool, int64_t nb, bool shared_dst, const std::vector<int64_t>& dst_entry,
                       int64_t dst_stride, T* dst, int64_t m, int64_t n, int64_t k,
                       const std::function<void(int64_t t, T* out, T beta)>& one) {
  if (!shared_dst) {
    auto run = [&](int64_t t) { one(t, dst + dst_entry[static_cast<size_t>(t)] * dst_stride, T(0)); };
    if (rt::cpu::blas_runs_single_threaded(m, n, k) && nb > 1) {
      pool.parallel_for(nb, rt::cpu::independent_gemm_grain(m, n, k), [&](int64_t lo, int64_t hi) {
        for (int64_t t = lo; t < hi; ++t) run(t);
      });
    } else {
      for (int64_t t = 0; t < nb; ++t) run(t);
    }
    return;
  }
  std::vector<char> touched(static_cast<size_t>(nb), 0);
  for (int64_t t = 0; t < nb; ++t) {
    const int64_t e = dst_entry[static_cast<size_t>(t)];
    one(t, dst + e * dst_stride, touched[static_cast<size_t>(e)] ? T(1) : T(0));
    touched[static_cast<size_t>(e)] = 1;
  }
}

void matmul_grad(GradContext& ctx) {
  const Tensor& g = ctx.grad_output(0);
  const MatMulGeometry m = matmul_geometry(ctx.input_shape(0), ctx.input_shape(1));
  const int64_t M = m.M, K = m.K, N = m.N;
  visit_float(g.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* gp = g.data<T>();
    if (ctx.needs_grad(0)) {
      const T* bp = ctx.input(1).data<T>();
      Tensor ga(g.dtype(), ctx.input_shape(0));
      T* gap = ga.data<T>();
      if (K == 0 || M == 0) {
      } else if (N == 0) {
        std::memset(gap, 0, ga.nbytes());
      } else if (m.nbb == 1 && m.nba == m.nb) {
        rt::cpu::blas_gemm_rows(ctx.pool(), false, true, m.nb * M, K, N, T(1), gp, N, bp, N, T(0), gap, K);  // [nb*M, N] x B^T
      } else {
        if (m.nba < m.nb) std::memset(gap, 0, ga.nbytes());
        batched_grad_gemm<T>(ctx.pool(), m.nb, m.nba < m.nb, m.aidx, M * K, gap, M, K, N, [&](int64_t t, T* out, T beta) {
          blas_gemm(false, true, M, K, N, T(1), gp + t * M * N, N, bp + m.bidx[static_cast<size_t>(t)] * K * N, N, beta, out, K);
        });
      }
      ctx.set_grad(0, std::move(ga));
    }
    if (ctx.needs_grad(1)) {
      const T* ap = ctx.input(0).data<T>();
      Tensor gb(g.dtype(), ctx.input_shape(1));
      T* gbp = gb.data<T>();
      if (K == 0 || N == 0) {
      } else if (M == 0) {
        std::memset(gbp, 0, gb.nbytes());
      } else if (m.nbb == 1 && m.nba == m.nb) {
        rt::cpu::blas_gemm_rows(ctx.pool(), true, false, K, N, m.nb * M, T(1), ap, K, gp, N, T(0), gbp, N);  // A^T [K, nb*M] x dY
      } else {
        if (m.nbb < m.nb) std::memset(gbp, 0, gb.nbytes());
        batched_grad_gemm<T>(ctx.pool(), m.nb, m.nbb < m.nb, m.bidx, K * N, gbp, K, N, M, [&](int64_t t, T* out, T beta) {
          blas_gemm(true, false, K, N, M, T(1), ap + m.aidx[static_cast<size_t>(t)] * M * K, K, gp + t * M * N, N, beta, out, N);
        });
      }
      ctx.set_grad(1, std::move(gb));
    }
  });
}

}  // namespace

void register_matmul_grads(GradRegistry& r) {
  GradDef gemm;
  gemm.op_type = "Gemm";
  gemm.fn = gemm_grad;
  gemm.differentiable = bit(0) | bit(1) | bit(2);
  gemm.saved_inputs = bit(0) | bit(1);
  r.add(std::move(gemm));
  GradDef matmul;
  matmul.op_type = "MatMul";
  matmul.fn = matmul_grad;
  matmul.differentiable = bit(0) | bit(1);
  matmul.saved_inputs = bit(0) | bit(1);
  r.add(std::move(matmul));
}

}  // namespace mpq::train::grads
