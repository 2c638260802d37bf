#pragma once
// Every status returned by the CUDA runtime, cuBLASLt or cuDNN becomes an mpq::Error that names
// the node and op being run, the library call and the status. No CUDA headers here: the plugin
// passes the raw code and the library's own text; status names are tabulated for the codes mpq
// reports most (tests/cuda/lt_descriptors_test.cpp checks the table against the real headers).
#include <string>

namespace mpq::rt::cuda_plan {

enum class CudaLibrary { Runtime, CublasLt, Cudnn };

// "CUBLAS_STATUS_NOT_SUPPORTED", "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
// "cudaErrorMemoryAllocation"... or "<library> status <code>" when not tabulated.
std::string status_name(CudaLibrary lib, int code);

// Throws (Unsupported for *_NOT_SUPPORTED and cudaErrorNoKernelImageForDevice-type codes, which
// a CPU fallback can absorb; Internal otherwise):
//   node 'conv1' (Conv): cudnnConvolutionForward failed: CUDNN_STATUS_BAD_PARAM (2000): <text>
[[noreturn]] void fail_cuda_status(CudaLibrary lib, int code, const std::string& call, const std::string& library_text,
                                   const std::string& node, const std::string& op);

// Convenience: nothing when code is 0 (success in all three libraries).
inline void check_cuda_status(CudaLibrary lib, int code, const std::string& call, const std::string& library_text,
                              const std::string& node, const std::string& op) {
  if (code != 0) fail_cuda_status(lib, code, call, library_text, node, op);
}

}  // namespace mpq::rt::cuda_plan
