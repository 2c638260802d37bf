// mpq::GeluMlp (passes/fuse_gelu_mlp): a transformer's feed-forward block, Y = (Gelu(X W1 + b1)) W2 +
// b2, for small constant W1 [K, H] and W2 [H, N], in one kernel. With the attribute layer_norm = 1
// X is first normalised over its K values (inputs 5 and 6: LayerNormalization's scale and bias,
// the attribute epsilon); with residual = 1 the block's own input is added to Y (N == K): the
// pre-norm block Y = X + MLP(LayerNorm(X)) as one node.
//
// Why: run as three nodes, each product and the Gelu is a parallel loop of its own. At batch 1 (16-17
// tokens) each is a few microseconds, and splitting one over two threads meant the other core
// fetching what this one just wrote (a product's rows, then Gelu's input) at every node: slower than
// one thread (docs/runtime.md, twenty-ninth session). Here each thread takes a band of rows through
// all three steps, its hidden rows staying in its own cache: one fork and join, and only X's rows
// in and Y's rows out cross between cores.
//
// Bits: each step is the unfused node's arithmetic on the same rows. The products are small_gemm's
// rows (gemm_small.h: a row's sums do not depend on which rows are computed with it) onto rows
// holding the bias (beta = 1), as mpq::MatMulBias computes them; Gelu is the Gelu kernel's loop
// (unary.h, gelu_range). So the fused node gives the unfused graph's bits, on any thread count.
// The pass fuses only where small_gemm applies; where it then does not at run time (a
// DeterministicBlas scope) the steps run whole on OpenBLAS, whose sums can differ from what the
// unfused nodes would take there for a large product (oneDNN's matmul from 256K multiply-adds).
#include <algorithm>
#include <vector>

#include "core/dispatch.h"
#include "runtime/cpu/common.h"
#include "runtime/cpu/conv_common.h"
#include "runtime/cpu/gemm_small.h"
#include "runtime/cpu/norm.h"
#include "runtime/cpu/register_all.h"
#include "runtime/cpu/unary.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace mpq::rt::cpu {

namespace {

// Rows of the hidden layer computed at a time: 16 x H values (8 KiB for the shipped transformers'
// H of 128) stay in L1 between the two products.
constexpr int64_t kRowsPerBlock = 16;
// A thread takes a band of rows from this many multiply-adds (both products): the ViT's block at
// batch 1, 17 x (64 x 128 + 128 x 64), splits in two.
constexpr int64_t kMinMacsPerBand = 128 * 1024;

// Rows per band: the rows cut evenly into as many bands as there are threads, or fewer where a
// band would hold under kMinMacsPerBand (17 rows at 16 per band would leave one row to the second
// thread).
int64_t rows_per_band(int64_t rows, int64_t macs_per_row, int threads) {
  const int64_t bands = std::clamp<int64_t>(rows * macs_per_row / kMinMacsPerBand, 1, threads);
  return (rows + bands - 1) / bands;
}

void fill_bias_rows(float* y, int64_t rows, int64_t n, const float* bias, bool per_column) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = y + r * n;
    if (per_column)
      std::copy(bias, bias + n, row);
    else
      std::fill(row, row + n, bias[0]);
  }
}

void gelu_mlp_kernel(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  const Tensor& w1 = ctx.input(1);
  const Tensor& b1 = ctx.input(2);
  const Tensor& w2 = ctx.input(3);
  const Tensor& b2 = ctx.input(4);
  for (const Tensor* t : {&x, &w1, &b1, &w2, &b2})
    if (t->dtype() != DType::Float32) ctx.fail("needs float32 inputs, got {}", dtype_name(t->dtype()));
  if (x.rank() == 0 || w1.rank() != 2 || w2.rank() != 2)
    ctx.fail("needs X of rank >= 1 and 2-D W1 and W2, got {}, {} and {}", shape_str(x.shape()), shape_str(w1.shape()),
             shape_str(w2.shape()));
  const int64_t K = x.dim(-1), H = w1.dim(1), N = w2.dim(1);
  if (w1.dim(0) != K || w2.dim(0) != H)
    ctx.fail("X {}, W1 {} and W2 {} do not chain", shape_str(x.shape()), shape_str(w1.shape()), shape_str(w2.shape()));
  if ((b1.numel() != H && b1.numel() != 1) || (b2.numel() != N && b2.numel() != 1))
    ctx.fail("biases {} and {} must have {} and {} values (or one)", shape_str(b1.shape()), shape_str(b2.shape()), H, N);
  const std::string approximate = ctx.node().attr_string("approximate", "none");
  if (approximate != "none" && approximate != "tanh")
    ctx.fail("Gelu approximate must be 'none' or 'tanh', got '{}'", approximate);
  const bool tanh = approximate == "tanh";
  const bool layer_norm = ctx.node().attr_int("layer_norm", 0) != 0;
  const bool residual = ctx.node().attr_int("residual", 0) != 0;
  const double epsilon = ctx.node().attr_float("epsilon", 1e-5f);  // as LayerNormalization reads it
  const float* ln_scale = nullptr;
  const float* ln_bias = nullptr;
  if (layer_norm) {
    if (!ctx.has_input(5) || !ctx.has_input(6)) ctx.fail("layer_norm = 1 needs the scale and bias as inputs 5 and 6");
    // The folded LayerNormalization's axis, kept so that a rank other than the one the pass saw fails
    // here instead of normalising over other values.
    const int64_t axis = ctx.node().attr_int("axis", -1);
    if (axis != -1 && axis != x.rank() - 1)
      ctx.fail("the layer norm's axis {} is not the last of X {}", axis, shape_str(x.shape()));
    const Tensor& s = ctx.input(5);
    const Tensor& b = ctx.input(6);
    if (s.dtype() != DType::Float32 || b.dtype() != DType::Float32 || s.numel() != K || b.numel() != K)
      ctx.fail("the layer norm's scale {} and bias {} must be float32 with {} values", shape_str(s.shape()),
               shape_str(b.shape()), K);
    ln_scale = s.data<float>();
    ln_bias = b.data<float>();
  }
  if (residual && N != K) ctx.fail("residual = 1 needs as many outputs as inputs per row, got {} and {}", N, K);
  Shape yshape(x.shape().begin(), x.shape().end() - 1);
  yshape.push_back(N);
  Tensor& y = ctx.alloc_output(0, DType::Float32, yshape);
  const int64_t M = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  if (M == 0 || N == 0) return;
  const float* xp = x.data<float>();
  const float* w1p = w1.data<float>();
  const float* w2p = w2.data<float>();
  const float* b1p = b1.data<float>();
  const float* b2p = b2.data<float>();
  float* yp = y.data<float>();
  const bool b1_columns = b1.numel() == H, b2_columns = b2.numel() == N;
  const bool small = K > 0 && H > 0 && small_gemm_applies(false, false, K, H) && small_gemm_applies(false, false, H, N);
  // Rows [r0, r0 + rows) through every step, with `normalized` (rows x K, where layer_norm) and
  // `hidden` (rows x H) as scratch, and `product(m, n, k, a, b, c)` for C[m, n] += A[m, k] B[k, n].
  auto run_rows = [&](int64_t r0, int64_t rows, float* normalized, float* hidden, const auto& product) {
    const float* in = xp + r0 * K;
    if (layer_norm) {
      layernorm_rows_float(in, normalized, ln_scale, ln_bias, K, epsilon, rows);
      in = normalized;
    }
    float* yr = yp + r0 * N;
    fill_bias_rows(hidden, rows, H, b1p, b1_columns);
    product(rows, H, K, in, w1p, hidden);
    gelu_range(tanh, hidden, hidden, rows * H);
    fill_bias_rows(yr, rows, N, b2p, b2_columns);
    product(rows, N, H, hidden, w2p, yr);
    // The residual Add of the unfused graph, x + y: IEEE addition is commutative, so either
    // operand order gives these bits (but for which payload a sum of two NaNs keeps). Y is a
    // buffer of its own (alloc_output: new memory or a Concat's slice, never X's), so X's rows are
    // still X's here.
    if (residual) {
      const float* xr = xp + r0 * K;
      for (int64_t i = 0; i < rows * N; ++i) yr[i] = xr[i] + yr[i];
    }
  };
  if (!small) {
    // As the unfused nodes would without mpq's kernel, on OpenBLAS (whose sums depend on the rows
    // it is given together, so it runs whole).
    std::vector<float> normalized(layer_norm ? static_cast<size_t>(M * K) : 0);
    std::vector<float> hidden(static_cast<size_t>(M * H));
    run_rows(0, M, normalized.data(), hidden.data(),
             [&](int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
               if (k > 0 && n > 0) blas_gemm_rows(ctx.pool(), false, false, m, n, k, 1.0f, a, k, b, n, 1.0f, c, n);
             });
    return;
  }
  const SmallGemmIsa isa = small_gemm_isa();
  auto small_product = [isa](int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c) {
    small_gemm_rows_on(isa, false, 0, m, n, k, 1.0f, a, k, b, n, 1.0f, c, n);
  };
  const int64_t band = rows_per_band(M, K * H + H * N, ctx.pool().size());
  ctx.pool().parallel_for(M, band, [&](int64_t lo, int64_t hi) {
    thread_local std::vector<float> hidden, normalized;
    hidden.resize(static_cast<size_t>(kRowsPerBlock * H));
    if (layer_norm) normalized.resize(static_cast<size_t>(kRowsPerBlock * K));
    for (int64_t r0 = lo; r0 < hi; r0 += kRowsPerBlock)
      run_rows(r0, std::min(kRowsPerBlock, hi - r0), normalized.data(), hidden.data(), small_product);
  });
}

}  // namespace

void register_mlp(OpRegistry& r) { r.add_fn("mpq", "GeluMlp", 1, 1, BackendKind::CPU, gelu_mlp_kernel); }

}  // namespace mpq::rt::cpu
