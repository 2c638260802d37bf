#include "runtime/cuda/status.h"

#include <utility>

#include "core/error.h"

namespace mpq::rt::cuda_plan {

namespace {

struct Named {
  int code;
  const char* name;
};

// Values from cuda_runtime_api.h / driver_types.h (CUDA 13), cublas_api.h and cudnn_graph.h
// (cuDNN 9); checked against the headers by tests/cuda/lt_descriptors_test.cpp.
constexpr Named kRuntime[] = {{1, "cudaErrorInvalidValue"},
                              {2, "cudaErrorMemoryAllocation"},
                              {3, "cudaErrorInitializationError"},
                              {4, "cudaErrorCudartUnloading"},
                              {9, "cudaErrorInvalidConfiguration"},
                              {35, "cudaErrorInsufficientDriver"},
                              {100, "cudaErrorNoDevice"},
                              {209, "cudaErrorNoKernelImageForDevice"},
                              {222, "cudaErrorUnsupportedPtxVersion"},
                              {400, "cudaErrorInvalidResourceHandle"},
                              {700, "cudaErrorIllegalAddress"},
                              {701, "cudaErrorLaunchOutOfResources"},
                              {702, "cudaErrorLaunchTimeout"},
                              {716, "cudaErrorMisalignedAddress"},
                              {719, "cudaErrorLaunchFailure"}};
constexpr Named kCublas[] = {{1, "CUBLAS_STATUS_NOT_INITIALIZED"}, {3, "CUBLAS_STATUS_ALLOC_FAILED"},
                             {7, "CUBLAS_STATUS_INVALID_VALUE"},   {8, "CUBLAS_STATUS_ARCH_MISMATCH"},
                             {11, "CUBLAS_STATUS_MAPPING_ERROR"},  {13, "CUBLAS_STATUS_EXECUTION_FAILED"},
                             {14, "CUBLAS_STATUS_INTERNAL_ERROR"}, {15, "CUBLAS_STATUS_NOT_SUPPORTED"},
                             {16, "CUBLAS_STATUS_LICENSE_ERROR"}};
constexpr Named kCudnn[] = {{1001, "CUDNN_STATUS_NOT_INITIALIZED"},
                            {1002, "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH"},
                            {1008, "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED"},
                            {2000, "CUDNN_STATUS_BAD_PARAM"},
                            {2002, "CUDNN_STATUS_BAD_PARAM_NULL_POINTER"},
                            {2003, "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER"},
                            {2008, "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH"},
                            {3000, "CUDNN_STATUS_NOT_SUPPORTED"},
                            {3002, "CUDNN_STATUS_NOT_SUPPORTED_SHAPE"},
                            {3003, "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE"},
                            {3004, "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT"},
                            {3007, "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH"},
                            {3011, "CUDNN_STATUS_NOT_SUPPORTED_PADDING"},
                            {4000, "CUDNN_STATUS_INTERNAL_ERROR"},
                            {5000, "CUDNN_STATUS_EXECUTION_FAILED"}};

template <size_t N>
const char* find(const Named (&table)[N], int code) {
  for (const Named& n : table)
    if (n.code == code) return n.name;
  return nullptr;
}

const char* library_name(CudaLibrary lib) {
  switch (lib) {
    case CudaLibrary::Runtime: return "CUDA runtime";
    case CudaLibrary::CublasLt: return "cuBLASLt";
    case CudaLibrary::Cudnn: return "cuDNN";
  }
  return "CUDA";
}

bool is_not_supported(CudaLibrary lib, int code) {
  switch (lib) {
    case CudaLibrary::Runtime: return code == 209 || code == 222 || code == 35;
    case CudaLibrary::CublasLt: return code == 15 || code == 8;
    case CudaLibrary::Cudnn: return code / 1000 == 3;  // the whole CUDNN_STATUS_NOT_SUPPORTED_* family
  }
  return false;
}

}  // namespace

std::string status_name(CudaLibrary lib, int code) {
  const char* n = nullptr;
  switch (lib) {
    case CudaLibrary::Runtime: n = find(kRuntime, code); break;
    case CudaLibrary::CublasLt: n = find(kCublas, code); break;
    case CudaLibrary::Cudnn: n = find(kCudnn, code); break;
  }
  if (code == 0) return lib == CudaLibrary::Runtime ? "cudaSuccess" : (lib == CudaLibrary::Cudnn ? "CUDNN_STATUS_SUCCESS" : "CUBLAS_STATUS_SUCCESS");
  return n ? std::string(n) : fmt::format("{} status {}", library_name(lib), code);
}

void fail_cuda_status(CudaLibrary lib, int code, const std::string& call, const std::string& library_text,
                      const std::string& node, const std::string& op) {
  std::string msg = fmt::format("node '{}' ({}): {} failed: {} ({})", node, op, call, status_name(lib, code), code);
  if (!library_text.empty()) msg += ": " + library_text;
  throw Error(is_not_supported(lib, code) ? ErrorKind::Unsupported : ErrorKind::Internal, std::move(msg));
}

}  // namespace mpq::rt::cuda_plan
