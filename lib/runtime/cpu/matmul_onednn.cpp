#include "runtime/cpu/matmul_onednn.h"

#include <algorithm>
#include <atomic>

#include "runtime/blas_kernels.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/conv_onednn.h"

#if MPQ_HAVE_ONEDNN
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>
#include <vector>
#endif

namespace mpq::rt::cpu {

namespace {
std::atomic<uint64_t> g_matmul_count{0};
std::atomic<uint64_t> g_pack_count{0};
std::atomic<uint64_t> g_sgemm_count{0};
}  // namespace

uint64_t onednn_matmul_count() { return g_matmul_count.load(std::memory_order_relaxed); }
uint64_t onednn_matmul_pack_count() { return g_pack_count.load(std::memory_order_relaxed); }
uint64_t onednn_sgemm_count() { return g_sgemm_count.load(std::memory_order_relaxed); }

#if !MPQ_HAVE_ONEDNN

struct OnednnMatmulState::Impl {};
OnednnMatmulState::OnednnMatmulState() = default;
OnednnMatmulState::~OnednnMatmulState() = default;
bool onednn_matmul_bias(ThreadPool&, int64_t, int64_t, int64_t, const float*, const float*, const float*, float*,
                        OnednnMatmulState&) {
  return false;
}
bool onednn_sgemm_below_cpu(int, bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                            int64_t, float, float*, int64_t) {
  return false;
}

#else

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

// Below this many multiply-adds OpenBLAS's call is cheaper (M 16, K 128, N 64: 1.4 us against
// oneDNN's 1.5 us; M 16, K 64, N 192: 2.4 against 2.3).
constexpr double kMinMacs = 256e3;
// The same where OpenBLAS runs kernels without AVX-512 on an AVX-512 CPU (blas_kernels_below_cpu).
// AMD Zen 5 with OPENBLAS_CORETYPE=Haswell, one thread, us per product (8 chained in a model, `mpq
// run --repeat 2000`): M 16, K 64, N 32 (33K) OpenBLAS 0.96, oneDNN 0.99; 16 x 64 x 64 1.54 against
// 1.24; 16 x 64 x 128 2.9 against 1.8; 17 x 64 x 192 5.2 against 2.4 (OpenBLAS's AVX-512 kernels:
// 0.55, 0.78, 1.3, 2.0). The ViT at batch 1 0.097 -> 0.079 ms.
constexpr double kMinMacsBlasBelowCpu = 48e3;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

}  // namespace

struct OnednnMatmulState::Impl {
  bool valid = false;
  int64_t m = 0, k = 0, n = 0;
  int team = 0;
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  memory src, wei, bias, dst, pad;
  std::vector<float> packed;  // W in pd.weights_desc(), 64-byte aligned inside
  std::vector<float> scratch;
  const float* packed_from = nullptr;
};
OnednnMatmulState::OnednnMatmulState() : impl(std::make_unique<Impl>()) {}
OnednnMatmulState::~OnednnMatmulState() = default;

namespace {

float* aligned(std::vector<float>& buf, size_t bytes) {
  const size_t floats = bytes / sizeof(float) + 16;
  if (buf.size() < floats) buf.assign(floats, 0.0f);
  auto addr = reinterpret_cast<uintptr_t>(buf.data());
  return reinterpret_cast<float*>((addr + 63) & ~uintptr_t{63});
}

}  // namespace

bool onednn_sgemm_below_cpu(int threads, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                            int64_t ldc) {
  if (!blas_kernels_below_cpu() || deterministic_blas() || !onednn_enabled() || !onednn_allowed_here()) return false;
  // oneDNN's sgemm runs on the calling thread's OpenMP team: one thread inside a parallel loop
  // (one of the pool's, or one that ran inline on the calling thread).
  const bool inside = omp_in_parallel() || ThreadPool::inside_parallel_loop();
  const int team = inside ? 1 : std::max(threads, 1);
  if (!omp_in_parallel() && omp_get_max_threads() != team) omp_set_num_threads(team);
  if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) != dnnl_success)
    return false;
  g_sgemm_count.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool onednn_matmul_bias(ThreadPool& pool, int64_t m, int64_t k, int64_t n, const float* a, const float* w,
                        const float* bias, float* y, OnednnMatmulState& state) {
  if (!onednn_enabled() || !onednn_allowed_here() || deterministic_blas()) return false;
  const double macs = static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  if (macs < kMinMacs && (macs < kMinMacsBlasBelowCpu || !blas_kernels_below_cpu())) return false;
  OnednnMatmulState::Impl& st = *state.impl;
  const int team = onednn_team_size(macs, pool.size());
  // The team is read when the primitive is created (its work split is fixed then).
  if (omp_get_max_threads() != team) omp_set_num_threads(team);
  dnnl::engine& eng = engine();
  if (!st.valid || st.m != m || st.k != k || st.n != n || st.team != team) {
    st.valid = false;
    const memory::desc a_desc({m, k}, dt::f32, tag::ab), w_any({k, n}, dt::f32, tag::any),
        b_desc({1, n}, dt::f32, tag::ab), y_desc({m, n}, dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    st.pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_desc, w_any, b_desc, y_desc), attr, eng);
    st.prim = dnnl::matmul(st.pd);
    st.src = memory(a_desc, eng, DNNL_MEMORY_NONE);
    // A new M (another batch size) usually keeps B's packed layout: B is packed again only when the
    // layout changed.
    const bool same_layout = st.wei && st.wei.get_desc() == st.pd.weights_desc();
    if (!same_layout) st.packed_from = nullptr;
    st.wei = memory(st.pd.weights_desc(), eng, same_layout ? st.wei.get_data_handle() : DNNL_MEMORY_NONE);
    st.bias = memory(b_desc, eng, DNNL_MEMORY_NONE);
    st.dst = memory(y_desc, eng, DNNL_MEMORY_NONE);
    st.pad = memory(st.pd.scratchpad_desc(), eng, DNNL_MEMORY_NONE);
    st.m = m;
    st.k = k;
    st.n = n;
    st.team = team;
    st.valid = true;
  }
  thread_local dnnl::stream stream(eng);
  if (st.packed_from != w) {
    memory user_w(memory::desc({k, n}, dt::f32, tag::ab), eng, const_cast<float*>(w));
    st.wei.set_data_handle(aligned(st.packed, st.pd.weights_desc().get_size()));
    dnnl::reorder(user_w, st.wei).execute(stream, user_w, st.wei);
    st.packed_from = w;
    g_pack_count.fetch_add(1, std::memory_order_relaxed);
  }
  st.src.set_data_handle(const_cast<float*>(a));
  st.bias.set_data_handle(const_cast<float*>(bias));
  st.dst.set_data_handle(y);
  st.pad.set_data_handle(aligned(st.scratch, st.pd.scratchpad_desc().get_size()));
  st.prim.execute(stream, {{DNNL_ARG_SRC, st.src},
                           {DNNL_ARG_WEIGHTS, st.wei},
                           {DNNL_ARG_BIAS, st.bias},
                           {DNNL_ARG_DST, st.dst},
                           {DNNL_ARG_SCRATCHPAD, st.pad}});
  stream.wait();
  g_matmul_count.fetch_add(1, std::memory_order_relaxed);
  return true;
}

#endif

}  // namespace mpq::rt::cpu
