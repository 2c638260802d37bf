#pragma once
// The interface between mpq and its CUDA plugin (libmpq_cuda.so, built from kernels/*.cu).
// Plain C++: no CUDA headers, so the rest of mpq compiles with g++ alone and never links CUDA
// libraries; the runtime dlopens the plugin (runtime/cuda_loader.h) and calls through this table.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mpq::cuda {

// Bumped whenever CudaApi changes; the loader refuses a plugin built for another version.
inline constexpr int kCudaApiVersion = 1;

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
};

}  // namespace mpq::cuda

// Exported by the plugin.
extern "C" const mpq::cuda::CudaApi* mpq_cuda_api();
