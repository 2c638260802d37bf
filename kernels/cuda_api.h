#pragma once
// The interface between mpq and its CUDA plugin (libmpq_cuda.so, built from kernels/*.cu).
// Plain C++: no CUDA headers, so the rest of mpq compiles with g++ alone and never links CUDA
// libraries; the runtime dlopens the plugin (runtime/cuda_loader.h) and calls through this table.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mpq::cuda {

struct OpsTable;  // kernels/ops_table.h

// Bumped whenever CudaApi or the OpsTable it carries changes (5: unary and unary_grad take alpha
// and beta, for HardSigmoid/HardSwish; 6: the convolution backward entries; 7: the parameter update
// entries and the LayerNorm, Gather, Slice, PRelu and Where backward entries; 8: Resize's backward,
// the indexed Gather backward and BatchNormalization's training forward and backward; 9: the binary
// op PowSlope, Pow's backward; 10: convert_float, mixed precision's storage conversions; 11:
// fake_quant_bias); the loader refuses a plugin built for another version.
inline constexpr int kCudaApiVersion = 11;

struct DeviceInfo {
  int index = 0;
  std::string name;
  int major = 0;
  int minor = 0;
  size_t total_memory = 0;
  int multiprocessors = 0;
};

struct ProbeResult {
  int runtime_version = 0;
  int driver_version = 0;  // 0 when no driver is installed
  std::vector<DeviceInfo> devices;
  std::string error;  // why no device is usable ("no CUDA device", driver too old, ...)
  size_t cublaslt_version = 0;
};

struct CudaApi {
  int version = kCudaApiVersion;
  // Queries the driver and devices; never throws, never aborts when there is no GPU.
  ProbeResult (*probe)() = nullptr;
  // Smoke test of the whole path (allocation, a kernel launch, a cuBLASLt handle): y = a*x + y on
  // the device. Returns an empty string on success, else the CUDA error text.
  std::string (*saxpy_selftest)(float a, const std::vector<float>& x, std::vector<float>& y) = nullptr;

  // Device memory, pinned host staging and streams (version 2). Each returns 0 or the
  // cudaError_t code; error_string gives cudaGetErrorString's text. Device memory is plain
  // cudaMalloc, never managed memory. memcpy_async kinds: 0 host->device, 1 device->host,
  // 2 device->device. Used by runtime/cuda/plugin_backend.h.
  int (*device_malloc)(void** ptr, size_t bytes) = nullptr;
  int (*device_free)(void* ptr) = nullptr;
  int (*host_malloc_pinned)(void** ptr, size_t bytes) = nullptr;
  int (*host_free_pinned)(void* ptr) = nullptr;
  int (*memcpy_async)(void* dst, const void* src, size_t bytes, int kind, void* stream) = nullptr;
  int (*stream_create)(void** stream) = nullptr;
  int (*stream_destroy)(void* stream) = nullptr;
  int (*stream_synchronize)(void* stream) = nullptr;
  const char* (*error_string)(int code) = nullptr;

  // The shared kernel bodies' GPU launchers (version 3; kernels/ops_table.h), for the CUDA node
  // runner (runtime/cuda/node_runner.h).
  const OpsTable* ops = nullptr;

  // The same entry points as the host harness runs them (version 4): nvcc's host compilation of
  // the kernel bodies, host memory, the direct bodies in place of cuBLASLt/cuDNN. Used only when
  // MPQ_CUDA_EMULATE=host, so that the whole `--device cuda` path of every command can be tested
  // on machines without a GPU (runtime/cuda/context.h).
  const OpsTable* host_ops = nullptr;
};

}  // namespace mpq::cuda

// Exported by the plugin.
extern "C" const mpq::cuda::CudaApi* mpq_cuda_api();
