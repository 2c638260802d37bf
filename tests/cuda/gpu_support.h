#pragma once
// Device buffers and the "is there a GPU" check for the tests that launch kernels (gpu_*_test.cpp).
// Those tests SKIP, with the reason, when no usable device is present: ctest reports them as
// skipped (SKIP_REGULAR_EXPRESSION in tests/CMakeLists.txt) and Catch2 prints the WARN line.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "runtime/cuda/caching_allocator.h"

namespace mpq::test {

// Empty when a CUDA device can run kernels, else why not.
inline std::string gpu_unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return cudaGetErrorString(e);
  }
  return count > 0 ? std::string() : std::string("no CUDA device");
}

#define MPQ_REQUIRE_GPU()                                                                  \
  do {                                                                                     \
    const std::string _why = ::mpq::test::gpu_unavailable_reason();                       \
    if (!_why.empty()) {                                                                   \
      WARN("SKIPPED: no usable CUDA device (" << _why << "); this test runs on a GPU only"); \
      return;                                                                              \
    }                                                                                      \
  } while (0)

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

template <typename T>
class DeviceBuf {
 public:
  explicit DeviceBuf(size_t n) : n_(n) { cuda_check(cudaMalloc(&p_, (n ? n : 1) * sizeof(T)), "cudaMalloc"); }
  explicit DeviceBuf(const std::vector<T>& v) : DeviceBuf(v.size()) { upload(v); }
  ~DeviceBuf() { cudaFree(p_); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
  T* get() const { return p_; }
  void upload(const std::vector<T>& v) {
    cuda_check(cudaMemcpy(p_, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    cuda_check(cudaDeviceSynchronize(), "kernel");
    cuda_check(cudaMemcpy(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return v;
  }

 private:
  T* p_ = nullptr;
  size_t n_;
};


// Real device memory for the GPU runner tests.
struct CudaMemory : rt::gpu::DeviceMemoryBackend {
  int allocate(void** p, size_t bytes) override { return static_cast<int>(cudaMalloc(p, bytes)); }
  int release(void* p) override { return static_cast<int>(cudaFree(p)); }
  int copy(void* dst, const void* src, size_t bytes, rt::gpu::CopyKind kind, void* stream) override {
    const cudaMemcpyKind k = kind == rt::gpu::CopyKind::HostToDevice ? cudaMemcpyHostToDevice
                             : kind == rt::gpu::CopyKind::DeviceToHost ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
    return static_cast<int>(cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)));
  }
  int synchronize(void* stream) override { return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(stream))); }
  std::string error_text(int code) override { return cudaGetErrorString(static_cast<cudaError_t>(code)); }
};

}  // namespace mpq::test
