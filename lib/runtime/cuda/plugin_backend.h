#pragma once
// DeviceMemoryBackend over the CUDA plugin's function table (kernels/cuda_api.h, version 2):
// what the caching allocator and device tensors use on a real GPU.
#include <cstdlib>
#include <cstring>

#include "kernels/cuda_api.h"
#include "runtime/cuda/caching_allocator.h"

namespace mpq::rt::gpu {

class PluginMemoryBackend : public DeviceMemoryBackend {
 public:
  explicit PluginMemoryBackend(const cuda::CudaApi& api) : api_(api) {}
  int allocate(void** ptr, size_t bytes) override { return api_.device_malloc(ptr, bytes); }
  int release(void* ptr) override { return api_.device_free(ptr); }
  int copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) override {
    return api_.memcpy_async(dst, src, bytes, kind == CopyKind::HostToDevice ? 0 : (kind == CopyKind::DeviceToHost ? 1 : 2),
                             stream);
  }
  int synchronize(void* stream) override { return api_.stream_synchronize(stream); }
  std::string error_text(int code) override { return api_.error_string ? api_.error_string(code) : std::string(); }
  int allocate_pinned(void** ptr, size_t bytes) override { return api_.host_malloc_pinned(ptr, bytes); }
  int release_pinned(void* ptr) override { return api_.host_free_pinned(ptr); }

 private:
  const cuda::CudaApi& api_;
};

// Host memory posing as device memory, for MPQ_CUDA_EMULATE=host (the plugin's host kernel table
// reads and writes plain pointers). 256-byte aligned like cudaMalloc; copies are memcpy.
class HostEmulationBackend : public DeviceMemoryBackend {
 public:
  int allocate(void** ptr, size_t bytes) override {
    *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
    return *ptr ? 0 : 2;  // cudaErrorMemoryAllocation
  }
  int release(void* ptr) override {
    std::free(ptr);
    return 0;
  }
  int copy(void* dst, const void* src, size_t bytes, CopyKind, void*) override {
    if (bytes) std::memcpy(dst, src, bytes);
    return 0;
  }
  int synchronize(void*) override { return 0; }
  std::string error_text(int code) override { return code ? "host allocation failed" : "no error"; }
};

}  // namespace mpq::rt::gpu
