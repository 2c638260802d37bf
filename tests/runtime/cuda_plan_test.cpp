// Host-side plans of the CUDA backend (lib/runtime/cuda/): cuBLASLt GEMM plans (operand swap for
// row-major data, precisions, INT8 layout/alignment rules and their fallbacks, workspace), cuDNN
// convolution plans (output shapes against the naive reference, 1-D/3-D, groups, math types,
// asymmetric-padding fallback), shape plans, and the status-to-error translation. No GPU needed.
#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"
#include "runtime/cpu/reference.h"
#include "runtime/cuda/plan_conv.h"
#include "runtime/cuda/plan_gemm.h"
#include "runtime/cuda/plan_shape.h"
#include "runtime/cuda/status.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::rt::cuda_plan;

TEST_CASE("GEMM plans swap operands for row-major data", "[cuda_plan]") {
  GemmRequest r;
  r.m = 5;
  r.n = 7;
  r.k = 3;
  const GemmPlan p = plan_gemm(r);
  REQUIRE(p.use_cublaslt);
  CHECK(p.fallback_reason.empty());
  // cuBLASLt computes C^T[N, M] = B^T[N, K] * A^T[K, M] in column-major.
  CHECK(p.m == 7);
  CHECK(p.n == 5);
  CHECK(p.k == 3);
  CHECK_FALSE(p.op_a_transposed);
  CHECK_FALSE(p.op_b_transposed);
  CHECK(p.a.rows == 7);  // mpq's B [3, 7] row-major = column-major [7, 3]
  CHECK(p.a.cols == 3);
  CHECK(p.a.ld == 7);
  CHECK(p.b.rows == 3);  // mpq's A [5, 3] = column-major [3, 5]
  CHECK(p.b.cols == 5);
  CHECK(p.b.ld == 3);
  CHECK(p.c.rows == 7);
  CHECK(p.c.cols == 5);
  CHECK(p.c.ld == 7);
  CHECK(p.compute == LtCompute::F32);
  CHECK(p.workspace_bytes == (size_t{32} << 20));

  SECTION("transposes follow the operands") {
    r.trans_a = true;  // A stored [K, M]
    r.trans_b = true;  // B stored [N, K]
    const GemmPlan t = plan_gemm(r);
    CHECK(t.op_a_transposed);
    CHECK(t.op_b_transposed);
    CHECK(t.a.rows == 3);  // B [7, 3] row-major = column-major [3, 7]
    CHECK(t.a.ld == 3);
    CHECK(t.b.rows == 5);  // A [3, 5] = column-major [5, 3]
    CHECK(t.b.ld == 5);
  }
  SECTION("batched, with leading dimensions") {
    r.batch = 4;
    r.lda = 8;
    r.ldc = 9;
    const GemmPlan b = plan_gemm(r);
    CHECK(b.b.ld == 8);
    CHECK(b.b.batch_stride == 5 * 8);
    CHECK(b.c.batch_stride == 5 * 9);
    CHECK(b.a.batch == 4);
  }
  SECTION("older GPUs get 4 MiB of workspace") {
    r.sm = 80;
    CHECK(plan_gemm(r).workspace_bytes == (size_t{4} << 20));
  }
  SECTION("inconsistent requests are errors") {
    r.lda = 2;  // A is [5, 3]: rows need 3
    CHECK_THROWS_AS(plan_gemm(r), Error);
    r.lda = 0;
    r.k = -1;
    CHECK_THROWS_AS(plan_gemm(r), Error);
  }
}

TEST_CASE("GEMM plan precisions", "[cuda_plan]") {
  GemmRequest r;
  r.m = 16;
  r.n = 32;
  r.k = 64;
  r.precision = GemmPrecision::TF32;
  CHECK(plan_gemm(r).compute == LtCompute::F32_FAST_TF32);
  for (GemmPrecision pr : {GemmPrecision::FP16, GemmPrecision::BF16}) {
    r.precision = pr;
    r.fp32_output = false;
    const GemmPlan p = plan_gemm(r);
    const LtType t = pr == GemmPrecision::FP16 ? LtType::F16 : LtType::BF16;
    CHECK(p.use_cublaslt);
    CHECK(p.compute == LtCompute::F32);  // FP32 accumulation
    CHECK(p.scale_type == LtType::F32);
    CHECK(p.a.type == t);
    CHECK(p.b.type == t);
    CHECK(p.c.type == t);
    r.fp32_output = true;
    CHECK(plan_gemm(r).c.type == LtType::F32);
  }
  SECTION("odd addresses lower the alignment preference; 1-byte-aligned halves fall back") {
    r.precision = GemmPrecision::FP16;
    r.a_addr = 0x1000 + 8;
    const GemmPlan p = plan_gemm(r);
    CHECK(p.align_b == 8);  // mpq's A is cuBLASLt's B
    CHECK(p.align_a == 64);  // ldb = 32 halves = 64 bytes
    r.a_addr = 0x1001;
    const GemmPlan q = plan_gemm(r);
    CHECK_FALSE(q.use_cublaslt);
    CHECK(q.fallback_reason.find("aligned") != std::string::npos);
  }
}

TEST_CASE("INT8 GEMM plans check cuBLASLt's layout and alignment rules", "[cuda_plan]") {
  GemmRequest r;
  r.m = 6;
  r.n = 32;
  r.k = 64;
  r.precision = GemmPrecision::INT8;
  r.trans_b = true;  // weights [N, K]: the TN form
  const GemmPlan ok = plan_gemm(r);
  REQUIRE(ok.use_cublaslt);
  CHECK(ok.compute == LtCompute::I32);
  CHECK(ok.scale_type == LtType::I32);
  CHECK(ok.a.type == LtType::I8);
  CHECK(ok.c.type == LtType::I32);
  CHECK(ok.op_a_transposed);
  CHECK_FALSE(ok.op_b_transposed);
  auto reason = [&](GemmRequest q) {
    const GemmPlan p = plan_gemm(q);
    CHECK_FALSE(p.use_cublaslt);
    return p.fallback_reason;
  };
  GemmRequest q = r;
  q.trans_b = false;
  CHECK(reason(q).find("TN") != std::string::npos);
  q = r;
  q.trans_a = true;
  CHECK(reason(q).find("TN") != std::string::npos);
  q = r;
  q.k = 30;
  CHECK(reason(q).find("multiples of 4") != std::string::npos);
  q = r;
  q.n = 30;
  CHECK(reason(q).find("multiples of 4") != std::string::npos);
  q = r;
  q.ldc = 34;
  CHECK(reason(q).find("leading dimensions") != std::string::npos);
  q = r;
  q.b_addr = 0x2002;
  CHECK(reason(q).find("4-byte") != std::string::npos);
  q = r;
  q.m = 7;  // M (cuBLASLt's n) has no rule of its own
  CHECK(plan_gemm(q).use_cublaslt);
}

TEST_CASE("convolution plans: shapes agree with the naive reference", "[cuda_plan]") {
  struct Case {
    Shape x, w;
    std::vector<int64_t> strides, dilations, pads;
    int64_t group;
  };
  const Case cases[] = {{{2, 4, 9, 11}, {6, 4, 3, 3}, {2, 1}, {}, {1, 1, 1, 1}, 1},
                        {{1, 6, 8, 7}, {6, 1, 3, 2}, {1, 2}, {2, 1}, {2, 0, 2, 0}, 6},
                        {{3, 4, 17}, {8, 2, 5}, {3}, {2}, {2, 2}, 2},
                        {{1, 2, 5, 6, 7}, {4, 2, 3, 3, 3}, {1, 2, 1}, {}, {1, 0, 1, 1, 0, 1}, 1}};
  for (const Case& c : cases) {
    INFO("x " << shape_str(c.x) << " w " << shape_str(c.w));
    rt::cpu::WindowGeometry g;
    g.strides = c.strides;
    g.dilations = c.dilations;
    g.pads = c.pads;
    g.group = c.group;
    const Tensor want = rt::cpu::conv_ref(test::random_tensor(c.x, 1), test::random_tensor(c.w, 2), nullptr, g);
    ConvRequest r{c.x, c.w, c.strides, c.dilations, c.pads, c.group};
    const ConvPlan p = plan_conv(r);
    CHECK(p.y_shape == want.shape());
    REQUIRE(p.use_cudnn);
    CHECK(p.group == c.group);
    CHECK(p.x.dims.size() == std::max<size_t>(4, c.x.size()));
    CHECK(p.x.strides.back() == 1);
    CHECK(p.math == ConvMath::Fma);  // FP32 without --tf32: no tensor cores
    if (c.x.size() == 3) {           // 1-D: H = 1 inserted
      CHECK(p.x.dims[2] == 1);
      CHECK(p.y.dims[3] == want.dim(2));
      CHECK(p.pads[0] == 0);
      CHECK(p.strides[1] == c.strides[0]);
    }
  }
}

TEST_CASE("convolution plans: math types, workspace and fallbacks", "[cuda_plan]") {
  ConvRequest r{{1, 8, 10, 10}, {16, 8, 3, 3}, {}, {}, {1, 1, 1, 1}, 1};
  r.type = ConvDataType::F16;
  ConvPlan p = plan_conv(r);
  CHECK(p.math == ConvMath::TensorOp);
  CHECK(p.compute == ConvDataType::F32);
  CHECK(p.workspace_limit == (size_t{256} << 20));
  r.type = ConvDataType::F32;
  r.allow_tf32 = true;
  r.free_device_bytes = size_t{1} << 30;
  p = plan_conv(r);
  CHECK(p.math == ConvMath::TensorOp);
  CHECK(p.workspace_limit == (size_t{256} << 20));
  r.free_device_bytes = size_t{80} << 30;
  CHECK(plan_conv(r).workspace_limit == (size_t{1} << 30));
  r.pads = {0, 1, 1, 1};
  p = plan_conv(r);
  CHECK_FALSE(p.use_cudnn);
  CHECK(p.fallback_reason.find("asymmetric") != std::string::npos);
  CHECK(p.y_shape == Shape{1, 16, 9, 10});
  r.pads = {};
  r.group = 3;
  CHECK_THROWS_AS(plan_conv(r), Error);
}

TEST_CASE("shape plans", "[cuda_plan]") {
  Shape out;
  const cuda::Broadcast2 bc = make_broadcast2({2, 1, 5}, {3, 1}, &out);
  CHECK(out == Shape{2, 3, 5});
  CHECK(bc.a_stride[1] == 0);
  CHECK(bc.a_stride[2] == 1);
  CHECK(bc.b_stride[0] == 0);
  CHECK(bc.b_stride[1] == 1);
  CHECK(bc.b_stride[2] == 0);
  CHECK_THROWS_AS(make_broadcast2(Shape(9, 1), {1}, &out), Error);  // rank 9 > kMaxRank
  const cuda::StridedView t = make_transpose_view({2, 3, 4}, {}, &out);
  CHECK(out == Shape{4, 3, 2});
  CHECK(t.in_step[0] == 1);
  CHECK(t.in_step[2] == 12);
  CHECK_THROWS_AS(make_transpose_view({2, 3}, {0, 0}, &out), Error);
  const cuda::StridedView s = make_slice_view({10}, {-1}, {-100}, {}, {-3}, &out);
  CHECK(out == Shape{4});
  CHECK(s.base == 9);
  CHECK(s.in_step[0] == -3);
  CHECK_THROWS_AS(make_slice_view({10}, {0}, {5}, {}, {0}, &out), Error);
  const AxisView v = axis_view({2, 3, 4, 5}, -2);
  CHECK(v.outer == 6);
  CHECK(v.n == 4);
  CHECK(v.inner == 5);
}

TEST_CASE("library statuses become errors naming the node and op", "[cuda_plan]") {
  try {
    fail_cuda_status(CudaLibrary::Cudnn, 2000, "cudnnConvolutionForward", "CUDNN_STATUS_BAD_PARAM", "conv1", "Conv");
    FAIL("no throw");
  } catch (const Error& e) {
    const std::string m = e.what();
    CHECK(m.find("node 'conv1' (Conv)") != std::string::npos);
    CHECK(m.find("cudnnConvolutionForward failed: CUDNN_STATUS_BAD_PARAM (2000)") != std::string::npos);
    CHECK(e.kind() == ErrorKind::Internal);
  }
  try {
    fail_cuda_status(CudaLibrary::CublasLt, 15, "cublasLtMatmul", "", "fc", "Gemm");
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "node 'fc' (Gemm): cublasLtMatmul failed: CUBLAS_STATUS_NOT_SUPPORTED (15)");
    CHECK(e.kind() == ErrorKind::Unsupported);  // a CPU fallback can take it
  }
  CHECK(status_name(CudaLibrary::Runtime, 2) == "cudaErrorMemoryAllocation");
  CHECK(status_name(CudaLibrary::Cudnn, 3011) == "CUDNN_STATUS_NOT_SUPPORTED_PADDING");
  CHECK(status_name(CudaLibrary::Cudnn, 3999) == "cuDNN status 3999");
  CHECK_NOTHROW(check_cuda_status(CudaLibrary::Runtime, 0, "cudaMemcpyAsync", "", "n", "Add"));
  CHECK_THROWS_AS(check_cuda_status(CudaLibrary::Runtime, 700, "cudaStreamSynchronize", "", "n", "Add"), Error);
}
