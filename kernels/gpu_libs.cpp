// The GPU side of kernels/lib_ops.h: cuBLASLt GEMM and cuDNN convolution forward and backward (data,
// filter; deterministic algorithms only; written after the H100 run, not yet run on a GPU), with the
// descriptors of kernels/lib_descriptors.h built once per distinct plan and the algorithm chosen
// once (cuBLASLt's heuristic, cuDNN's v7 heuristic within the plan's workspace budget). When the
// library has no algorithm for a problem, FP32 problems run the direct bodies of
// kernels/bodies/linalg.cuh on the device (gpu_linalg.cu) so the node stays on the GPU; other types
// report NOT_SUPPORTED and the runner moves the node to the CPU. g++ with the CUDA headers; part of
// mpq_cuda_gpu_ops (the plugin and the gpu_* tests); run on an H100 by scripts/gpu_check.sh (docs/gpu.md).
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include "kernels/lib_descriptors.h"
#include "kernels/lib_ops.h"

namespace mpq::cuda {

static_assert(kCublasStatusNotSupported == CUBLAS_STATUS_NOT_SUPPORTED, "kernels/lib_ops.h out of date");
static_assert(kCudnnStatusNotSupported == CUDNN_STATUS_NOT_SUPPORTED, "kernels/lib_ops.h out of date");

namespace gpu {

namespace {

using rt::cuda_plan::ConvDirection;
using rt::cuda_plan::ConvPlan;
using rt::cuda_plan::GemmPlan;
using rt::cuda_plan::LtLayout;
using rt::cuda_plan::LtType;

// Everything a plan hands to the library, as a cache key.
std::string layout_key(const LtLayout& l) {
  std::ostringstream s;
  s << static_cast<int>(l.type) << ',' << l.rows << ',' << l.cols << ',' << l.ld << ',' << l.batch << ',' << l.batch_stride;
  return s.str();
}
std::string gemm_key(const GemmPlan& p) {
  std::ostringstream s;
  s << static_cast<int>(p.compute) << ';' << static_cast<int>(p.scale_type) << ';' << p.op_a_transposed << p.op_b_transposed
    << ';' << layout_key(p.a) << ';' << layout_key(p.b) << ';' << layout_key(p.c) << ';' << p.align_a << ',' << p.align_b
    << ',' << p.align_c << ';' << p.workspace_bytes;
  return s.str();
}
std::string ints_key(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += std::to_string(x) + ',';
  return s;
}
std::string conv_key(const ConvPlan& p) {
  return ints_key(p.x.dims) + ';' + ints_key(p.x.strides) + ';' + ints_key(p.w.dims) + ';' + ints_key(p.y.dims) + ';' +
         ints_key(p.y.strides) + ';' + ints_key(p.pads) + ';' + ints_key(p.strides) + ';' + ints_key(p.dilations) + ';' +
         std::to_string(p.group) + ';' + std::to_string(static_cast<int>(p.type)) + ';' +
         std::to_string(static_cast<int>(p.math)) + ';' + std::to_string(p.workspace_limit);
}

struct LtEntry {
  std::unique_ptr<LtGemmDescriptors> desc;
  bool have_algo = false;
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

struct LtState {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  int create_status = 0;
  std::map<std::string, std::unique_ptr<LtEntry>> plans;
};

// Process-lifetime state, deliberately never destroyed: destroying library handles from a static
// destructor can run after the CUDA runtime has shut down.
LtState& lt_state() {
  static LtState* s = new LtState;
  return *s;
}

// One plan in one direction: its own descriptors (the chosen algorithm's math type is set on the
// convolution descriptor, and the three directions may choose differently).
struct ConvEntry {
  std::unique_ptr<CudnnConvDescriptors> desc;
  bool searched = false;
  int search_status = 0;
  bool have_algo = false;
  int algo = 0;  // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t of the entry's direction
  size_t workspace = 0;
};
struct DnnState {
  std::mutex mu;
  std::map<void*, cudnnHandle_t> handles;  // one per stream, released with it (release_stream)
  std::map<std::string, std::unique_ptr<ConvEntry>> plans;
};

DnnState& dnn_state() {
  static DnnState* s = new DnnState;
  return *s;
}

// Caller holds the lock. The handle is bound to `stream` once (one handle per stream).
LibStatus dnn_handle(DnnState& s, void* stream, cudnnHandle_t* out) {
  auto it = s.handles.find(stream);
  if (it == s.handles.end()) {
    cudnnHandle_t h = nullptr;
    if (const int st = cudnnCreate(&h)) return LibStatus{2, st, "cudnnCreate"};
    if (const int st = cudnnSetStream(h, static_cast<cudaStream_t>(stream))) {
      cudnnDestroy(h);
      return LibStatus{2, st, "cudnnSetStream"};
    }
    it = s.handles.emplace(stream, h).first;
  }
  *out = it->second;
  return {};
}

// The heuristic's list in its order: the first that succeeded within the workspace budget (and,
// for training, is deterministic: the same gradients run after run, as mpq's CPU training).
template <class Perf>
int choose_algo(ConvEntry& e, const Perf* perf, int returned, size_t workspace_limit, bool deterministic_only) {
  for (int i = 0; i < returned; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > workspace_limit) continue;
    if (deterministic_only && perf[i].determinism != CUDNN_DETERMINISTIC) continue;
    // The heuristic's workspace figure holds for the math type it assumed: set that one.
    if (const int st = cudnnSetConvolutionMathType(e.desc->conv, perf[i].mathType)) return st;
    e.have_algo = true;
    e.algo = static_cast<int>(perf[i].algo);
    e.workspace = perf[i].memory;
    break;
  }
  return 0;
}

const char* heuristic_call(ConvDirection d) {
  switch (d) {
    case ConvDirection::Forward: return "cudnnGetConvolutionForwardAlgorithm_v7";
    case ConvDirection::BackwardData: return "cudnnGetConvolutionBackwardDataAlgorithm_v7";
    case ConvDirection::BackwardFilter: return "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
  }
  return "cudnnGetConvolution*Algorithm_v7";
}

// Caller holds the lock: the entry for `p` in direction `d` with its descriptors built and its
// algorithm chosen.
LibStatus conv_entry(DnnState& s, const ConvPlan& p, ConvDirection d, cudnnHandle_t h, ConvEntry** out) {
  std::unique_ptr<ConvEntry>& slot = s.plans[conv_key(p) + ';' + std::to_string(static_cast<int>(d))];
  if (!slot) {
    slot = std::make_unique<ConvEntry>();
    slot->desc = std::make_unique<CudnnConvDescriptors>(p);
  }
  ConvEntry& e = *slot;
  *out = &e;
  if (e.desc->status) return LibStatus{2, e.desc->status, e.desc->failed_call.c_str()};
  if (!e.searched) {
    e.searched = true;
    const CudnnConvDescriptors& c = *e.desc;
    int returned = 0;
    int st = 0;
    if (d == ConvDirection::Forward) {
      cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      st = cudnnGetConvolutionForwardAlgorithm_v7(h, c.x, c.w, c.conv, c.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf);
      if (st == 0) st = choose_algo(e, perf, returned, p.workspace_limit, false);
    } else if (d == ConvDirection::BackwardData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      st = cudnnGetConvolutionBackwardDataAlgorithm_v7(h, c.w, c.y, c.conv, c.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                       &returned, perf);
      if (st == 0) st = choose_algo(e, perf, returned, p.workspace_limit, true);
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      st = cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, c.x, c.y, c.conv, c.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                                                         &returned, perf);
      if (st == 0) st = choose_algo(e, perf, returned, p.workspace_limit, true);
    }
    e.search_status = st;
  }
  if (e.search_status) return LibStatus{2, e.search_status, heuristic_call(d)};
  return {};
}

}  // namespace

LibStatus gemm(const GemmPlan& p, const void* a, const void* b, void* c, void* workspace, size_t workspace_bytes,
               const LaunchCtx& ctx) {
  LtState& s = lt_state();
  LtEntry* e = nullptr;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.handle && s.create_status == 0) s.create_status = static_cast<int>(cublasLtCreate(&s.handle));
    if (s.create_status) return LibStatus{1, s.create_status, "cublasLtCreate"};
    std::unique_ptr<LtEntry>& slot = s.plans[gemm_key(p)];
    if (!slot) {
      slot = std::make_unique<LtEntry>();
      slot->desc = std::make_unique<LtGemmDescriptors>(p);
      if (slot->desc->status == 0) {
        cublasLtMatmulHeuristicResult_t result{};
        int found = 0;
        const LtGemmDescriptors& d = *slot->desc;
        const int st = static_cast<int>(
            cublasLtMatmulAlgoGetHeuristic(s.handle, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &result, &found));
        if (st == 0 && found > 0 && result.state == CUBLAS_STATUS_SUCCESS) {
          slot->have_algo = true;
          slot->algo = result.algo;
          slot->workspace = result.workspaceSize;
        }
      }
    }
    e = slot.get();
  }
  if (e->desc->status) return LibStatus{1, e->desc->status, e->desc->failed_call.c_str()};
  if (!e->have_algo) {
    if (!gemm_is_fp32(p)) return LibStatus{1, CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulAlgoGetHeuristic (no algorithm)"};
    const int st = matmul(matmul_geom(p), static_cast<const float*>(b), static_cast<const float*>(a), static_cast<float*>(c), ctx);
    return st ? LibStatus{0, st, "direct matmul launch"} : LibStatus{};
  }
  if (workspace_bytes < e->workspace) return LibStatus{1, CUBLAS_STATUS_INVALID_VALUE, "cublasLtMatmul (workspace smaller than planned)"};
  const float one_f = 1.0f, zero_f = 0.0f;
  const int32_t one_i = 1, zero_i = 0;
  const bool int_scale = p.scale_type == LtType::I32;
  const void* alpha = int_scale ? static_cast<const void*>(&one_i) : static_cast<const void*>(&one_f);
  const void* beta = int_scale ? static_cast<const void*>(&zero_i) : static_cast<const void*>(&zero_f);
  const LtGemmDescriptors& d = *e->desc;
  // Operand swap (plan_gemm.h): cuBLASLt's A is mpq's B.
  const int st = static_cast<int>(cublasLtMatmul(s.handle, d.op, alpha, b, d.a, a, d.b, beta, c, d.c, c, d.c, &e->algo,
                                                 workspace, workspace_bytes, static_cast<cudaStream_t>(ctx.stream)));
  return st ? LibStatus{1, st, "cublasLtMatmul"} : LibStatus{};
}

namespace {
// Caller holds s.mu: the stream's handle and the plan's entry (descriptors built, algorithm chosen).
LibStatus conv_lookup(DnnState& s, const ConvPlan& p, ConvDirection d, void* stream, cudnnHandle_t* h, ConvEntry** e) {
  if (LibStatus st = dnn_handle(s, stream, h); !st.ok()) return st;
  return conv_entry(s, p, d, *h, e);
}
}  // namespace

void release_stream(void* stream) {
  DnnState& s = dnn_state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.handles.find(stream);
  if (it == s.handles.end()) return;
  cudnnDestroy(it->second);
  s.handles.erase(it);
}

namespace {

// What each direction's errors are called.
struct ConvCallNames {
  const char* no_algo;          // FP16/BF16 without an algorithm within the budget
  const char* direct;           // the direct body's launch
  const char* small_workspace;  // the caller's workspace is smaller than the entry needs
  const char* call;             // the library call
};

const ConvCallNames& conv_call_names(ConvDirection d) {
  static const ConvCallNames forward{"cudnnGetConvolutionForwardAlgorithm_v7 (no algorithm within the budget)",
                                     "direct convolution launch",
                                     "cudnnConvolutionForward (workspace smaller than planned)", "cudnnConvolutionForward"};
  static const ConvCallNames data{
      "cudnnGetConvolutionBackwardDataAlgorithm_v7 (no deterministic algorithm within the budget)",
      "direct convolution backward-data launch", "cudnnConvolutionBackwardData (workspace smaller than planned)",
      "cudnnConvolutionBackwardData"};
  static const ConvCallNames filter{
      "cudnnGetConvolutionBackwardFilterAlgorithm_v7 (no deterministic algorithm within the budget)",
      "direct convolution backward-filter launch", "cudnnConvolutionBackwardFilter (workspace smaller than planned)",
      "cudnnConvolutionBackwardFilter"};
  return d == ConvDirection::Forward ? forward : (d == ConvDirection::BackwardData ? data : filter);
}

LibStatus conv_workspace_for(const ConvPlan& p, ConvDirection d, size_t* bytes, const LaunchCtx& ctx) {
  DnnState& s = dnn_state();
  std::lock_guard<std::mutex> lock(s.mu);
  cudnnHandle_t h = nullptr;
  ConvEntry* e = nullptr;
  if (LibStatus st = conv_lookup(s, p, d, ctx.stream, &h, &e); !st.ok()) return st;
  *bytes = e->have_algo ? e->workspace : 0;
  return {};
}

// The steps every convolution call shares: the plan's entry for direction `d`, then the direct
// body (FP32 without an algorithm within the budget) or `library(handle, descriptors, algo)` with
// the chosen algorithm. The handle is shared per stream; the lock keeps two host threads from
// interleaving on it.
template <class Direct, class Library>
LibStatus conv_call(const ConvPlan& p, ConvDirection d, size_t workspace_bytes, const LaunchCtx& ctx, Direct direct,
                    Library library) {
  const ConvCallNames& names = conv_call_names(d);
  DnnState& s = dnn_state();
  std::unique_lock<std::mutex> lock(s.mu);
  cudnnHandle_t h = nullptr;
  ConvEntry* e = nullptr;
  if (LibStatus st = conv_lookup(s, p, d, ctx.stream, &h, &e); !st.ok()) return st;
  if (!e->have_algo) {
    lock.unlock();
    if (p.type != rt::cuda_plan::ConvDataType::F32) return LibStatus{2, CUDNN_STATUS_NOT_SUPPORTED, names.no_algo};
    const int st = direct();
    return st ? LibStatus{0, st, names.direct} : LibStatus{};
  }
  if (workspace_bytes < e->workspace) return LibStatus{2, CUDNN_STATUS_BAD_PARAM, names.small_workspace};
  const int st = static_cast<int>(library(h, *e->desc, e->algo));
  return st ? LibStatus{2, st, names.call} : LibStatus{};
}

}  // namespace

LibStatus conv_workspace(const ConvPlan& p, size_t* bytes, const LaunchCtx& ctx) {
  return conv_workspace_for(p, ConvDirection::Forward, bytes, ctx);
}

LibStatus conv_backward_workspace(const ConvPlan& p, ConvDirection direction, size_t* bytes, const LaunchCtx& ctx) {
  return conv_workspace_for(p, direction, bytes, ctx);
}

LibStatus conv_forward(const ConvPlan& p, const float* x, const float* w, float* y, void* workspace, size_t workspace_bytes,
                       const LaunchCtx& ctx) {
  const float one = 1.0f, zero = 0.0f;
  return conv_call(
      p, ConvDirection::Forward, workspace_bytes, ctx, [&] { return conv_direct(conv_geom(p), x, w, y, ctx); },
      [&](cudnnHandle_t h, const CudnnConvDescriptors& d, int algo) {
        return cudnnConvolutionForward(h, &one, d.x, x, d.w, w, d.conv, static_cast<cudnnConvolutionFwdAlgo_t>(algo), workspace,
                                       workspace_bytes, &zero, d.y, y);
      });
}

LibStatus conv_backward_data(const ConvPlan& p, const float* w, const float* dy, float* dx, void* workspace,
                             size_t workspace_bytes, const LaunchCtx& ctx) {
  const float one = 1.0f, zero = 0.0f;
  return conv_call(
      p, ConvDirection::BackwardData, workspace_bytes, ctx, [&] { return conv_grad_data(conv_geom(p), w, dy, dx, ctx); },
      [&](cudnnHandle_t h, const CudnnConvDescriptors& d, int algo) {
        return cudnnConvolutionBackwardData(h, &one, d.w, w, d.y, dy, d.conv, static_cast<cudnnConvolutionBwdDataAlgo_t>(algo),
                                            workspace, workspace_bytes, &zero, d.x, dx);
      });
}

LibStatus conv_backward_filter(const ConvPlan& p, const float* x, const float* dy, float* dw, void* workspace,
                               size_t workspace_bytes, const LaunchCtx& ctx) {
  const float one = 1.0f, zero = 0.0f;
  return conv_call(
      p, ConvDirection::BackwardFilter, workspace_bytes, ctx, [&] { return conv_grad_filter(conv_geom(p), x, dy, dw, ctx); },
      [&](cudnnHandle_t h, const CudnnConvDescriptors& d, int algo) {
        return cudnnConvolutionBackwardFilter(h, &one, d.x, x, d.y, dy, d.conv,
                                              static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), workspace, workspace_bytes,
                                              &zero, d.w, dw);
      });
}

}  // namespace gpu
}  // namespace mpq::cuda
