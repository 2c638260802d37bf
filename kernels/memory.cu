// Device memory, pinned staging and streams for the plugin's CudaApi (version 2): thin wrappers
// returning cudaError_t codes so that the host side (runtime/cuda/plugin_backend.cpp) turns them
// into errors naming the node and op. Never run on a GPU yet.
#include <cuda_runtime.h>

#include "kernels/memory.h"

namespace mpq::cuda {

namespace {
int device_malloc(void** p, size_t bytes) { return static_cast<int>(cudaMalloc(p, bytes)); }
int device_free(void* p) { return static_cast<int>(cudaFree(p)); }
int host_malloc_pinned(void** p, size_t bytes) { return static_cast<int>(cudaMallocHost(p, bytes)); }
int host_free_pinned(void* p) { return static_cast<int>(cudaFreeHost(p)); }
int memcpy_async(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  cudaMemcpyKind k = kind == 0 ? cudaMemcpyHostToDevice : (kind == 1 ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice);
  if (kind < 0 || kind > 2) return static_cast<int>(cudaErrorInvalidValue);
  return static_cast<int>(cudaMemcpyAsync(dst, src, bytes, k, static_cast<cudaStream_t>(stream)));
}
int stream_create(void** s) {
  cudaStream_t st = nullptr;
  const cudaError_t e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  *s = st;
  return static_cast<int>(e);
}
int stream_destroy(void* s) { return static_cast<int>(cudaStreamDestroy(static_cast<cudaStream_t>(s))); }
int stream_synchronize(void* s) { return static_cast<int>(cudaStreamSynchronize(static_cast<cudaStream_t>(s))); }
const char* error_string(int code) { return cudaGetErrorString(static_cast<cudaError_t>(code)); }
}  // namespace

void fill_memory_api(CudaApi& a) {
  a.device_malloc = &device_malloc;
  a.device_free = &device_free;
  a.host_malloc_pinned = &host_malloc_pinned;
  a.host_free_pinned = &host_free_pinned;
  a.memcpy_async = &memcpy_async;
  a.stream_create = &stream_create;
  a.stream_destroy = &stream_destroy;
  a.stream_synchronize = &stream_synchronize;
  a.error_string = &error_string;
}

}  // namespace mpq::cuda
