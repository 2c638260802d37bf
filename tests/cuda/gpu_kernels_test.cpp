// The __global__ launchers (kernels/gpu_*.cu) against the host harness running the same bodies:
// results must be identical (same code, same per-thread order; the launchers are compiled with
// --fmad=false so nvcc does not contract a*b+c on the device), except the atomics in the
// histogram, whose counts must still match, and bodies calling transcendental functions (expf,
// erff, ...), whose device versions may differ from glibc's in the last bit. Needs a GPU: skipped with the reason elsewhere.
// Passed on an H100 (docs/gpu.md).
#include <catch2/catch.hpp>

#include <cstring>
#include <limits>
#include <vector>

#include "gpu_support.h"
#include "host_grid.h"
#include "kernels/lib_ops.h"
#include "kernels/ops.h"
#include "runtime/cuda/plan_conv.h"
#include "runtime/cuda/plan_shape.h"
#include "test_util.h"

using namespace mpq;
using test::DeviceBuf;

namespace {

std::vector<float> rnd(size_t n, uint32_t seed, float lo = -2, float hi = 2) {
  const Tensor t = test::random_tensor({static_cast<int64_t>(n)}, seed, lo, hi);
  return std::vector<float>(t.data<float>(), t.data<float>() + n);
}

bool identical(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Device math (expf, erff, fused multiply-adds) may differ from the host's in the last bits.
bool close(const std::vector<float>& got, const std::vector<float>& want, double rtol = 1e-5, double atol = 1e-6) {
  return got.size() == want.size() && test::first_mismatch(got.data(), want.data(), static_cast<int64_t>(got.size()), rtol, atol) == -1;
}

// Runs `op` (a host:: or gpu:: entry point taking (x, y, ctx)) on both sides and compares: bit for
// bit, or within close()'s tolerance when `exact` is false.
template <class Host, class Gpu>
void on_both(bool exact, const std::vector<float>& x, size_t ny, Host host, Gpu gpu) {
  for (const cuda::LaunchCtx& c : test::launches_for(static_cast<int64_t>(ny))) {
    INFO("launch " << test::launch_str(c));
    std::vector<float> want = test::nan_filled(ny);
    REQUIRE(host(x.data(), want.data(), c) == 0);
    DeviceBuf<float> dx(x), dy(test::nan_filled(ny));
    REQUIRE(gpu(dx.get(), dy.get(), c) == 0);
    const std::vector<float> got = dy.download();
    CHECK((exact ? identical(got, want) : close(got, want)));
  }
}
template <class Host, class Gpu>
void same_on_both(const std::vector<float>& x, size_t ny, Host host, Gpu gpu) {
  on_both(true, x, ny, host, gpu);
}
template <class Host, class Gpu>
void close_on_both(const std::vector<float>& x, size_t ny, Host host, Gpu gpu) {
  on_both(false, x, ny, host, gpu);
}

}  // namespace

TEST_CASE("GPU elementwise, reduction and softmax launchers match the host harness", "[cuda][gpu]") {
  MPQ_REQUIRE_GPU();
  const std::vector<float> x = rnd(3 * 7 * 5, 1);
  // erff / expf: CUDA's device math library and glibc may differ in the last bit.
  close_on_both(x, x.size(), [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::unary(cuda::UnaryOp::Gelu, 0, 0, a, y, 105, c); },
               [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::unary(cuda::UnaryOp::Gelu, 0, 0, a, y, 105, c); });
  Shape out;
  const cuda::Broadcast2 bc = rt::cuda_plan::make_broadcast2({3, 7, 5}, {7, 1}, &out);
  const std::vector<float> b = rnd(7, 2, 0.5f, 2);
  DeviceBuf<float> db(b);
  same_on_both(x, x.size(), [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::binary(cuda::BinaryOp::Div, bc, a, b.data(), y, 105, c); },
               [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::binary(cuda::BinaryOp::Div, bc, a, db.get(), y, 105, c); });
  same_on_both(x, 15, [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::reduce(cuda::ReduceOp::Mean, a, y, 3, 7, 5, c); },
               [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::reduce(cuda::ReduceOp::Mean, a, y, 3, 7, 5, c); });
  close_on_both(x, x.size(), [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::softmax(false, a, y, 3, 7, 5, c); },
               [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::softmax(false, a, y, 3, 7, 5, c); });
  // Long rows: the chunked softmax (written after the second H100 run; not yet run on a GPU).
  const std::vector<float> xl = rnd(2 * 1100 * 3, 5, -8, 8);
  for (bool log : {false, true})
    close_on_both(xl, xl.size(), [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::softmax(log, a, y, 2, 1100, 3, c); },
                  [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::softmax(log, a, y, 2, 1100, 3, c); });
  const std::vector<float> g = rnd(5, 3), be = rnd(5, 4);
  DeviceBuf<float> dg(g), dbe(be);
  same_on_both(x, x.size(), [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::layer_norm(a, g.data(), be.data(), y, nullptr, nullptr, 21, 5, 1e-5f, c); },
               [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::layer_norm(a, dg.get(), dbe.get(), y, nullptr, nullptr, 21, 5, 1e-5f, c); });
  // FP16 and BF16 storage (mixed precision), down and back up, bit for bit; values beyond FP16's
  // range (inf) and below its normal range (subnormals) included.
  std::vector<float> wide = rnd(105, 5, -70000.0f, 70000.0f);
  for (size_t i = 0; i < 20; ++i) wide[i] *= 1e-9f;
  for (const auto& [down, up] : {std::pair{cuda::FloatConvert::F32ToF16, cuda::FloatConvert::F16ToF32},
                                 std::pair{cuda::FloatConvert::F32ToBF16, cuda::FloatConvert::BF16ToF32}}) {
    std::vector<uint16_t> low(105);
    DeviceBuf<uint16_t> dlow(low);
    same_on_both(wide, 105, [&](const float* a, float* y, const cuda::LaunchCtx& c) {
          const int r = cuda::host::convert_float(down, a, low.data(), 105, c);
          return r ? r : cuda::host::convert_float(up, low.data(), y, 105, c); },
        [&](const float* a, float* y, const cuda::LaunchCtx& c) {
          const int r = cuda::gpu::convert_float(down, a, dlow.get(), 105, c);
          return r ? r : cuda::gpu::convert_float(up, dlow.get(), y, 105, c); });
  }
}

TEST_CASE("GPU pooling, resize and data-movement launchers match the host harness", "[cuda][gpu]") {
  MPQ_REQUIRE_GPU();
  const std::vector<float> x = rnd(2 * 3 * 9 * 8, 5);
  const cuda::Pool2dGeom pg = rt::cuda_plan::make_pool2d_geom({2, 3, 9, 8}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, true);
  const size_t np = static_cast<size_t>(pg.planes * pg.oh * pg.ow);
  for (bool is_max : {true, false})
    same_on_both(x, np, [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::pool2d(is_max, true, pg, a, y, c); },
                 [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::pool2d(is_max, true, pg, a, y, c); });
  const std::vector<float> pdy = rnd(np, 6);
  DeviceBuf<float> dpdy(pdy);
  for (bool is_max : {true, false})
    close_on_both(x, x.size(), [&](const float* a, float* dx, const cuda::LaunchCtx& c) { return cuda::host::pool2d_grad(is_max, true, pg, a, pdy.data(), dx, c); },
                  [&](const float* a, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::pool2d_grad(is_max, true, pg, a, dpdy.get(), dx, c); });
  cuda::Resize2dGeom rg;
  rg.linear = true;
  rg.planes = 6;
  rg.ih = 9;
  rg.iw = 8;
  rg.oh = 13;
  rg.ow = 5;
  rg.scale_h = 13.0 / 9;
  rg.scale_w = 5.0 / 8;
  same_on_both(x, 6 * 13 * 5, [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::resize2d(rg, a, y, c); },
               [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::resize2d(rg, a, y, c); });
  // Resize backward: dY of the 13x5 output back onto the 9x8 input.
  const std::vector<float> rdy = rnd(6 * 13 * 5, 7);
  close_on_both(rdy, x.size(), [&](const float* d, float* dx, const cuda::LaunchCtx& c) { return cuda::host::resize2d_grad(rg, d, dx, c); },
                [&](const float* d, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::resize2d_grad(rg, d, dx, c); });
  Shape out;
  const cuda::StridedView tv = rt::cuda_plan::make_transpose_view({2, 3, 9, 8}, {3, 1, 0, 2}, &out);
  same_on_both(x, x.size(), [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::strided_copy(tv, a, y, 432, c); },
               [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::strided_copy(tv, a, y, 432, c); });
  const std::vector<int64_t> idx = {-1, 0, 5, 5};
  DeviceBuf<int64_t> didx(idx);
  DeviceBuf<int> dbad(std::vector<int>{0});
  int bad = 0;
  same_on_both(x, 2 * 3 * 4 * 8, [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::gather(a, idx.data(), y, 6, 9, 8, 4, &bad, c); },
               [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::gather(a, didx.get(), y, 6, 9, 8, 4, dbad.get(), c); });
  CHECK(dbad.download()[0] == 0);
  // Backward of Gather (repeated and negative indices) and of a backwards, strided Slice.
  const std::vector<float> gdy = rnd(2 * 3 * 4 * 8, 8);
  close_on_both(gdy, x.size(), [&](const float* d, float* dx, const cuda::LaunchCtx& c) { return cuda::host::gather_grad(idx.data(), d, dx, 6, 9, 8, 4, c); },
                [&](const float* d, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::gather_grad(didx.get(), d, dx, 6, 9, 8, 4, c); });
  // The indexed form for the same indices (row 0: position 1; row 5: positions 2, 3; row 8: 0).
  const std::vector<int64_t> offs = {0, 1, 1, 1, 1, 1, 3, 3, 3, 4}, poss = {1, 2, 3, 0};
  DeviceBuf<int64_t> doffs(offs), dposs(poss);
  close_on_both(gdy, x.size(), [&](const float* d, float* dx, const cuda::LaunchCtx& c) { return cuda::host::gather_grad(idx.data(), d, dx, 6, 9, 8, 4, c); },
                [&](const float* d, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::gather_grad_indexed(doffs.get(), dposs.get(), d, dx, 6, 9, 8, 4, c); });
  const cuda::SliceGeom sg = rt::cuda_plan::make_slice_grad_geom({2, 3, 9, 8}, {-1, 1}, {-100, 8}, {2, 3}, {-2, 3});
  const std::vector<float> sdy = rnd(2 * 3 * 5 * 3, 9);
  same_on_both(sdy, x.size(), [&](const float* d, float* dx, const cuda::LaunchCtx& c) { return cuda::host::slice_grad(sg, d, dx, 432, c); },
               [&](const float* d, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::slice_grad(sg, d, dx, 432, c); });
}

TEST_CASE("GPU quantization and statistics launchers match the host harness", "[cuda][gpu]") {
  MPQ_REQUIRE_GPU();
  std::vector<float> x = rnd(4 * 5 * 33, 6, -3, 3);
  const std::vector<float> scale = {0.01f, 0.02f, 0.005f, 0.03f, 0.011f};
  const std::vector<int32_t> zp = {0, 3, -2, 1, 0};
  DeviceBuf<float> dscale(scale);
  DeviceBuf<int32_t> dzp(zp);
  cuda::QuantLayout hl{4, 5, 33, scale.data(), zp.data(), -128, 127};
  cuda::QuantLayout dl{4, 5, 33, dscale.get(), dzp.get(), -128, 127};
  same_on_both(x, x.size(), [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::host::fake_quant(hl, a, y, c); },
               [&](const float* a, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::fake_quant(dl, a, y, c); });
  // FakeQuantBias over 5 channels (the per-channel scales above as weight scales), then with one
  // channel past int32: the whole bias passes through (not yet run on a GPU).
  const float sx = 0.05f;
  DeviceBuf<float> dsx(std::vector<float>{sx});
  for (float poison : {0.0f, 1e30f}) {
    std::vector<float> bias = rnd(5, 8, -2, 2);
    bias[2] += poison;
    same_on_both(bias, 5, [&](const float* b, float* y, const cuda::LaunchCtx& c) { return cuda::host::fake_quant_bias(b, &sx, scale.data(), 5, 5, y, c); },
                 [&](const float* b, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::fake_quant_bias(b, dsx.get(), dscale.get(), 5, 5, y, c); });
  }
  const cuda::LaunchCtx c{cuda::launch_shape_for(static_cast<int64_t>(x.size()), 128)};
  std::vector<int8_t> hq(x.size());
  REQUIRE(cuda::host::quantize(hl, x.data(), hq.data(), c) == 0);
  DeviceBuf<float> dx(x);
  DeviceBuf<int8_t> dq(x.size());
  REQUIRE(cuda::gpu::quantize(dl, dx.get(), dq.get(), c) == 0);
  CHECK(dq.download() == hq);
  // Backward: dx and the per-element LSQ terms, then the per-channel sum.
  const std::vector<float> dy = rnd(x.size(), 7);
  std::vector<float> hdx(x.size());
  std::vector<double> hterms(x.size());
  REQUIRE(cuda::host::fake_quant_backward(hl, x.data(), dy.data(), hdx.data(), hterms.data(), c) == 0);
  DeviceBuf<float> ddy(dy), ddx(x.size());
  DeviceBuf<double> dterms(x.size());
  REQUIRE(cuda::gpu::fake_quant_backward(dl, dx.get(), ddy.get(), ddx.get(), dterms.get(), c) == 0);
  CHECK(identical(ddx.download(), hdx));
  CHECK(dterms.download() == hterms);
  std::vector<float> hsum(5);
  DeviceBuf<float> dsum(5);
  REQUIRE(cuda::host::channel_sum(4, 5, 33, hterms.data(), nullptr, hsum.data(), {cuda::LaunchShape{2, 3}}) == 0);
  REQUIRE(cuda::gpu::channel_sum(4, 5, 33, dterms.get(), nullptr, dsum.get(), {cuda::LaunchShape{2, 3}}) == 0);
  CHECK(identical(dsum.download(), hsum));
  // Min/max (two passes) and the histogram (device atomics).
  const int64_t threads = c.shape.blocks * c.shape.threads;
  std::vector<cuda::MinMaxPartial> hp(static_cast<size_t>(threads));
  cuda::MinMaxPartial hmm{};
  REQUIRE(cuda::host::min_max(x.data(), static_cast<int64_t>(x.size()), hp.data(), &hmm, c) == 0);
  DeviceBuf<cuda::MinMaxPartial> dp(static_cast<size_t>(threads)), dmm(1);
  REQUIRE(cuda::gpu::min_max(dx.get(), static_cast<int64_t>(x.size()), dp.get(), dmm.get(), c) == 0);
  const cuda::MinMaxPartial got = dmm.download()[0];
  CHECK(got.lo == hmm.lo);
  CHECK(got.hi == hmm.hi);
  CHECK(got.nonfinite == hmm.nonfinite);
  std::vector<unsigned long long> hcounts(256, 0);
  REQUIRE(cuda::host::histogram(x.data(), static_cast<int64_t>(x.size()), 128 / 4.0f, 128, hcounts.data(), c) == 0);
  DeviceBuf<unsigned long long> dcounts(std::vector<unsigned long long>(256, 0));
  REQUIRE(cuda::gpu::histogram(dx.get(), static_cast<int64_t>(x.size()), 128 / 4.0f, 128, dcounts.get(), c) == 0);
  CHECK(dcounts.download() == hcounts);
}


TEST_CASE("GPU direct matmul/convolution and training launchers match the host harness", "[cuda][gpu]") {
  MPQ_REQUIRE_GPU();
  // Column-major 5x4 = (5x6) * (6x4), batch 2, A transposed.
  cuda::MatmulGeom mg;
  mg.m = 5;
  mg.n = 4;
  mg.k = 6;
  mg.trans_a = true;
  mg.lda = 6;
  mg.ldb = 6;
  mg.ldc = 5;
  mg.batch = 2;
  mg.stride_a = 30;
  mg.stride_b = 24;
  mg.stride_c = 20;
  const std::vector<float> a = rnd(60, 61), b = rnd(48, 62);
  DeviceBuf<float> db(b);
  close_on_both(a, 40, [&](const float* x, float* y, const cuda::LaunchCtx& c) { return cuda::host::matmul(mg, x, b.data(), y, c); },
                [&](const float* x, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::matmul(mg, x, db.get(), y, c); });
  cuda::ConvGeom cg;
  cg.n = 2;
  cg.c = 4;
  cg.m = 6;
  cg.group = 2;
  cg.ih = 7;
  cg.iw = 6;
  cg.kh = 3;
  cg.kw = 3;
  cg.oh = 4;
  cg.ow = 4;
  cg.sh = 2;
  cg.ph = 1;
  cg.pw = 1;
  cg.dw = 2;
  cg.ow = 4;
  const std::vector<float> x = rnd(2 * 4 * 7 * 6, 63), w = rnd(6 * 2 * 9, 64);
  DeviceBuf<float> dw(w);
  close_on_both(x, 2 * 6 * 4 * 4, [&](const float* in, float* y, const cuda::LaunchCtx& c) { return cuda::host::conv_direct(cg, in, w.data(), y, c); },
                [&](const float* in, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::conv_direct(cg, in, dw.get(), y, c); });
  // Convolution backward: the direct bodies on both sides (written after the H100 run) ...
  const std::vector<float> cdy = rnd(2 * 6 * 4 * 4, 67);
  DeviceBuf<float> dcdy(cdy), dcx(x);
  close_on_both(w, x.size(), [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::host::conv_grad_data(cg, in, cdy.data(), dx, c); },
                [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::conv_grad_data(cg, in, dcdy.get(), dx, c); });
  close_on_both(x, w.size(), [&](const float* in, float* dwt, const cuda::LaunchCtx& c) { return cuda::host::conv_grad_filter(cg, in, cdy.data(), dwt, c); },
                [&](const float* in, float* dwt, const cuda::LaunchCtx& c) { return cuda::gpu::conv_grad_filter(cg, in, dcdy.get(), dwt, c); });
  close_on_both(cdy, 6, [&](const float* d, float* dbias, const cuda::LaunchCtx& c) { return cuda::host::channel_grad_sum(2, 6, 16, d, dbias, c); },
                [&](const float* d, float* dbias, const cuda::LaunchCtx& c) { return cuda::gpu::channel_grad_sum(2, 6, 16, d, dbias, c); });
  // ... and cuDNN's backward-data / backward-filter (deterministic algorithms) over the same
  // problem as a plan, against the host's direct bodies over that plan (other summation order).
  {
    rt::cuda_plan::ConvRequest cr{{2, 4, 7, 6}, {6, 2, 3, 3}, {2, 1}, {1, 2}, {1, 1, 1, 1}, 2};
    const rt::cuda_plan::ConvPlan cplan = rt::cuda_plan::plan_conv(cr);
    REQUIRE(cplan.use_cudnn);
    const cuda::LaunchCtx lc{};
    for (auto dir : {rt::cuda_plan::ConvDirection::BackwardData, rt::cuda_plan::ConvDirection::BackwardFilter}) {
      const bool data = dir == rt::cuda_plan::ConvDirection::BackwardData;
      INFO((data ? "cudnnConvolutionBackwardData" : "cudnnConvolutionBackwardFilter"));
      size_t ws = 0;
      const cuda::LibStatus wst = cuda::gpu::conv_backward_workspace(cplan, dir, &ws, lc);
      INFO("status " << wst.code << " from " << wst.call);
      REQUIRE(wst.ok());
      DeviceBuf<float> workspace(ws / sizeof(float) + 1);
      const size_t ny = data ? x.size() : w.size();
      std::vector<float> want = test::nan_filled(ny);
      REQUIRE((data ? cuda::host::conv_backward_data(cplan, w.data(), cdy.data(), want.data(), nullptr, 0, lc)
                    : cuda::host::conv_backward_filter(cplan, x.data(), cdy.data(), want.data(), nullptr, 0, lc))
                  .ok());
      DeviceBuf<float> out(test::nan_filled(ny));
      const cuda::LibStatus st =
          data ? cuda::gpu::conv_backward_data(cplan, dw.get(), dcdy.get(), out.get(), workspace.get(), ws, lc)
               : cuda::gpu::conv_backward_filter(cplan, dcx.get(), dcdy.get(), out.get(), workspace.get(), ws, lc);
      INFO("status " << st.code << " from " << st.call);
      REQUIRE(st.ok());
      CHECK(close(out.download(), want, 1e-4, 1e-4));
    }
    cuda::gpu::release_stream(nullptr);  // the default stream's cuDNN handle (leak check)
  }
  // Backward bodies.
  const std::vector<float> v = rnd(105, 65), dyv = rnd(105, 66);
  DeviceBuf<float> dv(v), ddy(dyv);
  close_on_both(v, 105, [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::host::unary_grad(cuda::UnaryOp::Gelu, 0, in, v.data(), dyv.data(), dx, 105, c); },
                [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::unary_grad(cuda::UnaryOp::Gelu, 0, in, dv.get(), ddy.get(), dx, 105, c); });
  close_on_both(v, 105, [&](const float* y, float* dx, const cuda::LaunchCtx& c) { return cuda::host::softmax_grad(false, y, dyv.data(), dx, 3, 7, 5, c); },
                [&](const float* y, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::softmax_grad(false, y, ddy.get(), dx, 3, 7, 5, c); });
  Shape joined;
  const cuda::Broadcast2 bc = rt::cuda_plan::make_broadcast2({3, 1, 5}, {3, 7, 5}, &joined);
  const int64_t in_dims[3] = {3, 1, 5};
  close_on_both(v, 15, [&](const float* d, float* din, const cuda::LaunchCtx& c) { return cuda::host::sum_to_shape(bc, in_dims, d, din, 15, c); },
                [&](const float* d, float* din, const cuda::LaunchCtx& c) { return cuda::gpu::sum_to_shape(bc, in_dims, d, din, 15, c); });
  // LayerNorm backward over 15 rows of 7, from the host forward body's Mean and InvStdDev.
  const std::vector<float> gam = rnd(7, 67);
  std::vector<float> lny(105), lnm(15), lni(15);
  REQUIRE(cuda::host::layer_norm(v.data(), gam.data(), nullptr, lny.data(), lnm.data(), lni.data(), 15, 7, 1e-5f,
                                 cuda::LaunchCtx{cuda::LaunchShape{1, 32}}) == 0);
  DeviceBuf<float> dgam(gam), dlnm(lnm), dlni(lni);
  close_on_both(v, 105, [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::host::layer_norm_grad_x(in, lnm.data(), lni.data(), gam.data(), dyv.data(), dx, 15, 7, c); },
                [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::layer_norm_grad_x(in, dlnm.get(), dlni.get(), dgam.get(), ddy.get(), dx, 15, 7, c); });
  close_on_both(v, 7, [&](const float* in, float* ds, const cuda::LaunchCtx& c) { return cuda::host::layer_norm_grad_params(in, lnm.data(), lni.data(), dyv.data(), ds, nullptr, 15, 7, c); },
                [&](const float* in, float* ds, const cuda::LaunchCtx& c) { return cuda::gpu::layer_norm_grad_params(in, dlnm.get(), dlni.get(), ddy.get(), ds, nullptr, 15, 7, c); });
  close_on_both(v, 7, [&](const float* in, float* db, const cuda::LaunchCtx& c) { return cuda::host::layer_norm_grad_params(in, lnm.data(), lni.data(), dyv.data(), nullptr, db, 15, 7, c); },
                [&](const float* in, float* db, const cuda::LaunchCtx& c) { return cuda::gpu::layer_norm_grad_params(in, dlnm.get(), dlni.get(), ddy.get(), nullptr, db, 15, 7, c); });
  // BatchNorm over [3, 5, 7] (v): batch statistics, then dX in training from the per-feature sums.
  const std::vector<float> bsc = rnd(5, 68);
  std::vector<float> bm(5), bi(5);
  std::vector<double> bsums(10);
  const cuda::LaunchCtx bc1{cuda::LaunchShape{1, 32}};
  REQUIRE(cuda::host::batch_norm_stats(v.data(), nullptr, nullptr, bm.data(), bi.data(), 3, 5, 7, 1e-5f, nullptr, nullptr, 0.9f, bc1) == 0);
  REQUIRE(cuda::host::batch_norm_grad_sums(v.data(), bm.data(), bi.data(), dyv.data(), bsums.data(), nullptr, nullptr, 3, 5, 7, bc1) == 0);
  DeviceBuf<float> dbsc(bsc), dbm(bm), dbi(bi);
  DeviceBuf<double> dbsums(bsums);
  std::vector<float> host_inv(5);
  DeviceBuf<float> gpu_inv(5), dbm_scratch(5);
  DeviceBuf<double> dbsums_scratch(10);
  close_on_both(v, 5, [&](const float* in, float* mean, const cuda::LaunchCtx& c) { return cuda::host::batch_norm_stats(in, nullptr, nullptr, mean, host_inv.data(), 3, 5, 7, 1e-5f, nullptr, nullptr, 0.9f, c); },
                [&](const float* in, float* mean, const cuda::LaunchCtx& c) { return cuda::gpu::batch_norm_stats(in, nullptr, nullptr, mean, gpu_inv.get(), 3, 5, 7, 1e-5f, nullptr, nullptr, 0.9f, c); });
  close_on_both(v, 5, [&](const float* in, float* iv, const cuda::LaunchCtx& c) { std::vector<float> m(5); return cuda::host::batch_norm_stats(in, nullptr, nullptr, m.data(), iv, 3, 5, 7, 1e-5f, nullptr, nullptr, 0.9f, c); },
                [&](const float* in, float* iv, const cuda::LaunchCtx& c) { return cuda::gpu::batch_norm_stats(in, nullptr, nullptr, dbm_scratch.get(), iv, 3, 5, 7, 1e-5f, nullptr, nullptr, 0.9f, c); });
  // The running variance updated in place (starting from run0, copied into the output first), Y,
  // and the per-feature sums' dScale.
  const std::vector<float> run0 = rnd(5, 69, 0.5f, 2.0f);
  // The running mean starts equal on both sides (initcheck on the H100 flagged the GPU's, read by
  // the update, as never written) and is compared after the launches, which update both alike.
  std::vector<float> host_run_mean = rnd(5, 70);
  DeviceBuf<float> gpu_run_mean(host_run_mean);
  close_on_both(run0, 5,
                [&](const float* r, float* var, const cuda::LaunchCtx& c) {
                  std::copy(r, r + 5, var);
                  std::vector<float> m(5), iv(5);
                  return cuda::host::batch_norm_stats(v.data(), nullptr, nullptr, m.data(), iv.data(), 3, 5, 7, 1e-5f, host_run_mean.data(), var, 0.9f, c);
                },
                [&](const float* r, float* var, const cuda::LaunchCtx& c) {
                  test::cuda_check(cudaMemcpy(var, r, 5 * sizeof(float), cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
                  return cuda::gpu::batch_norm_stats(dv.get(), nullptr, nullptr, dbm_scratch.get(), gpu_inv.get(), 3, 5, 7, 1e-5f, gpu_run_mean.get(), var, 0.9f, c);
                });
  CHECK(close(gpu_run_mean.download(), host_run_mean));
  close_on_both(v, 105, [&](const float* in, float* y, const cuda::LaunchCtx& c) { return cuda::host::batch_norm_apply(in, bsc.data(), bsc.data(), bm.data(), bi.data(), y, 3, 5, 7, c); },
                [&](const float* in, float* y, const cuda::LaunchCtx& c) { return cuda::gpu::batch_norm_apply(in, dbsc.get(), dbsc.get(), dbm.get(), dbi.get(), y, 3, 5, 7, c); });
  close_on_both(v, 5, [&](const float* in, float* ds, const cuda::LaunchCtx& c) { std::vector<double> sm(10); return cuda::host::batch_norm_grad_sums(in, bm.data(), bi.data(), dyv.data(), sm.data(), ds, nullptr, 3, 5, 7, c); },
                [&](const float* in, float* ds, const cuda::LaunchCtx& c) { return cuda::gpu::batch_norm_grad_sums(in, dbm.get(), dbi.get(), ddy.get(), dbsums_scratch.get(), ds, nullptr, 3, 5, 7, c); });
  close_on_both(v, 105, [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::host::batch_norm_grad_x(true, in, bm.data(), bi.data(), bsc.data(), dyv.data(), bsums.data(), dx, 3, 5, 7, c); },
                [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::batch_norm_grad_x(true, in, dbm.get(), dbi.get(), dbsc.get(), ddy.get(), dbsums.get(), dx, 3, 5, 7, c); });
  // Clip, reduction, PRelu and Where backward (eighth session; v as [3, 7, 5]).
  same_on_both(v, 105, [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::host::clip_grad(in, dyv.data(), dx, 105, -0.5f, 1.0f, c); },
               [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::clip_grad(in, ddy.get(), dx, 105, -0.5f, 1.0f, c); });
  const cuda::StridedView bview = rt::cuda_plan::make_broadcast_view({3, 1, 5}, {3, 7, 5});
  same_on_both(dyv, 105, [&](const float* d, float* dx, const cuda::LaunchCtx& c) { return cuda::host::broadcast_divide(bview, 7.0f, d, dx, 105, c); },
               [&](const float* d, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::broadcast_divide(bview, 7.0f, d, dx, 105, c); });
  const int64_t edims[3] = {3, 7, 5};
  const bool ereduced[3] = {false, true, false};
  same_on_both(v, 105, [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::host::reduce_extreme_grad(3, edims, ereduced, in, nullptr, dyv.data(), dx, 15, c); },
               [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::reduce_extreme_grad(3, edims, ereduced, in, nullptr, ddy.get(), dx, 15, c); });
  const std::vector<float> slope = rnd(7, 68, 0.1f, 0.5f);
  DeviceBuf<float> dslope(slope);
  const cuda::Broadcast2 pbc = rt::cuda_plan::make_broadcast2({3, 7, 5}, {7, 1}, &joined);
  same_on_both(v, 105, [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::host::prelu_grad(pbc, in, slope.data(), dyv.data(), dx, nullptr, 105, c); },
               [&](const float* in, float* dx, const cuda::LaunchCtx& c) { return cuda::gpu::prelu_grad(pbc, in, dslope.get(), ddy.get(), dx, nullptr, 105, c); });
  same_on_both(v, 105, [&](const float* in, float* t, const cuda::LaunchCtx& c) { return cuda::host::prelu_grad(pbc, in, slope.data(), dyv.data(), nullptr, t, 105, c); },
               [&](const float* in, float* t, const cuda::LaunchCtx& c) { return cuda::gpu::prelu_grad(pbc, in, dslope.get(), ddy.get(), nullptr, t, 105, c); });
  const std::vector<unsigned char> cond = {1, 0, 0, 1, 1, 0, 1};  // [7, 1] as bool bytes
  DeviceBuf<unsigned char> dcond(cond);
  const cuda::Broadcast2 wbc = rt::cuda_plan::make_broadcast2({7, 1}, {3, 7, 5}, &joined);
  same_on_both(dyv, 105, [&](const float* d, float* m, const cuda::LaunchCtx& c) { return cuda::host::where_grad(wbc, reinterpret_cast<const bool*>(cond.data()), d, m, 105, true, c); },
               [&](const float* d, float* m, const cuda::LaunchCtx& c) { return cuda::gpu::where_grad(wbc, reinterpret_cast<const bool*>(dcond.get()), d, m, 105, true, c); });
  // AdamW: one step of the weights in place from zero moments.
  cuda::AdamWStep st;
  st.step_size = 0.01f;
  st.decay = 0.999f;
  const cuda::LaunchCtx c{cuda::LaunchShape{3, 32}};
  std::vector<float> hw = v, hm(105, 0.0f), hv(105, 0.0f);
  REQUIRE(cuda::host::adamw_step(st, hw.data(), dyv.data(), hm.data(), hv.data(), 105, c) == 0);
  DeviceBuf<float> gw(v), gm(std::vector<float>(105, 0.0f)), gv(std::vector<float>(105, 0.0f));
  REQUIRE(cuda::gpu::adamw_step(st, gw.get(), ddy.get(), gm.get(), gv.get(), 105, c) == 0);
  CHECK(close(gw.download(), hw));
  // SGD with Nesterov momentum and weight decay from a non-zero buffer.
  cuda::SgdStep sg;
  sg.rate = 0.05f;
  sg.weight_decay = 0.01f;
  sg.momentum = 0.9f;
  sg.nesterov = true;
  const std::vector<float> b0 = rnd(105, 69, -0.5f, 0.5f);
  std::vector<float> sw = v, sb = b0;
  REQUIRE(cuda::host::sgd_step(sg, sw.data(), dyv.data(), sb.data(), 105, c) == 0);
  DeviceBuf<float> sgd_w(v), sgd_b(b0);
  REQUIRE(cuda::gpu::sgd_step(sg, sgd_w.get(), ddy.get(), sgd_b.get(), 105, c) == 0);
  CHECK(close(sgd_w.download(), sw));
  CHECK(close(sgd_b.download(), sb));
  // Unscale with one non-finite gradient, the norm's partial sums and the divergence check.
  std::vector<float> g = dyv;
  g[77] = std::numeric_limits<float>::infinity();
  DeviceBuf<float> dg(g);
  DeviceBuf<int> dflag(std::vector<int>{0});
  REQUIRE(cuda::gpu::unscale(0.25f, dg.get(), 105, dflag.get(), c) == 0);
  int hflag = 0;
  REQUIRE(cuda::host::unscale(0.25f, g.data(), 105, &hflag, c) == 0);
  CHECK(identical(dg.download(), g));
  CHECK(dflag.download()[0] == 1);
  CHECK(hflag == 1);
  const size_t slots = static_cast<size_t>(c.shape.blocks * c.shape.threads);
  std::vector<double> hp(slots, 0.0);
  REQUIRE(cuda::host::sum_squares(dyv.data(), 105, hp.data(), false, c) == 0);
  REQUIRE(cuda::host::sum_squares(v.data(), 105, hp.data(), true, c) == 0);
  DeviceBuf<double> dp(std::vector<double>(slots, -1.0));
  REQUIRE(cuda::gpu::sum_squares(ddy.get(), 105, dp.get(), false, c) == 0);
  DeviceBuf<float> values(v);
  REQUIRE(cuda::gpu::sum_squares(values.get(), 105, dp.get(), true, c) == 0);
  const std::vector<double> gp = dp.download();
  for (size_t k = 0; k < slots; ++k) CHECK(gp[k] == Approx(hp[k]).epsilon(1e-12));
  double htotal = 0;
  REQUIRE(cuda::host::sum_partials(hp.data(), static_cast<int64_t>(slots), &htotal, c) == 0);
  DeviceBuf<double> dtotal(std::vector<double>{0.0});
  REQUIRE(cuda::gpu::sum_partials(dp.get(), static_cast<int64_t>(slots), dtotal.get(), c) == 0);
  CHECK(dtotal.download()[0] == Approx(htotal).epsilon(1e-12));
  DeviceBuf<int> dbad(std::vector<int>{0, 0});
  REQUIRE(cuda::gpu::check_values(values.get(), 105, false, dbad.get(), c) == 0);    // finite: no flag
  REQUIRE(cuda::gpu::check_values(values.get(), 105, true, dbad.get() + 1, c) == 0);  // some v <= 0: flag
  const std::vector<int> bad = dbad.download();
  CHECK(bad[0] == 0);
  CHECK(bad[1] == 1);
}
