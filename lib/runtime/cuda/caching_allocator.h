#pragma once
// Caching allocator for device memory. cudaMalloc/cudaFree synchronize the device and cost tens of
// microseconds, so freed blocks are kept and handed out again. Plain device memory only (the
// backend is cudaMalloc in the plugin; managed memory is never used: its page migration would
// make timings and OOM behaviour unpredictable). Host logic only, unit-tested with a fake backend
// (tests/runtime/cuda_allocator_test.cpp), and on an H100's memory by the gpu_* tests.
//
// Blocks are cached per stream: a block freed on stream S is reused only for work on S, whose
// queue order guarantees the earlier kernels using it are finished before new ones start. Moving
// a block to another stream would need an event; not done (one stream per executor).
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace mpq::rt::gpu {

enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };

// Device memory operations: cudaMalloc/cudaFree/cudaMemcpyAsync/cudaStreamSynchronize in the
// plugin (runtime/cuda/plugin_backend.h), a fake in the host tests.
struct DeviceMemoryBackend {
  virtual ~DeviceMemoryBackend() = default;
  // 0 on success, else the cudaError_t code.
  virtual int allocate(void** ptr, size_t bytes) = 0;
  virtual int release(void* ptr) = 0;
  // Asynchronous on `stream`; host buffers should be pinned for real overlap.
  virtual int copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) = 0;
  virtual int synchronize(void* stream) = 0;
  // The library's text for a code (cudaGetErrorString); may be empty.
  virtual std::string error_text(int code) { return code ? "" : "no error"; }
  // Page-locked host memory for staging copies (cudaMallocHost), so that host<->device copies are
  // real DMA that overlaps with work; backends without it return cudaErrorNotSupported (801) and
  // copies go through pageable memory.
  virtual int allocate_pinned(void** ptr, size_t) {
    *ptr = nullptr;
    return 801;
  }
  virtual int release_pinned(void*) { return 0; }
};

struct AllocatorStats {
  size_t in_use = 0;       // bytes of live blocks (rounded sizes)
  size_t cached = 0;       // bytes of free blocks kept
  size_t peak_in_use = 0;
  size_t backend_allocations = 0;
  size_t cache_hits = 0;
  size_t oom_retries = 0;  // backend failures answered by releasing the cache and retrying
};

class CachingAllocator {
 public:
  explicit CachingAllocator(DeviceMemoryBackend& backend, size_t max_cached_bytes = size_t{4} << 30);
  // Returns every cached block to the backend. Blocks still in use are leaked, not freed: a tensor
  // outliving its allocator is a bug elsewhere, and freeing under it would be worse.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // At least `bytes` (0 gives a valid minimal block), 256-byte aligned as cudaMalloc returns. On
  // failure, releases the cache and retries once, then throws an mpq::Error naming the node and
  // op: node 'conv1' (Conv): cudaMalloc of 1048576 bytes failed: cudaErrorMemoryAllocation (2)...
  void* allocate(size_t bytes, void* stream, const std::string& node, const std::string& op);
  // Returns a block from allocate(); Internal error on a pointer it does not own.
  void deallocate(void* ptr);
  // Frees every cached block (e.g. before a large allocation elsewhere, or on OOM).
  void release_cached();
  AllocatorStats stats() const;

  // Size classes: multiples of 512 bytes up to 1 MiB, of 2 MiB above (fewer distinct sizes, so
  // reuse is likely across batches of slightly different shapes).
  static size_t round_size(size_t bytes);

 private:
  struct Block {
    size_t size;
    void* stream;
  };
  void release_cached_locked();
  void trim_locked();

  DeviceMemoryBackend& backend_;
  size_t max_cached_;
  mutable std::mutex mu_;
  // Free blocks ordered by (stream, size) for best-fit lookup.
  std::multimap<std::pair<void*, size_t>, void*> free_;
  std::unordered_map<void*, Block> live_;
  AllocatorStats stats_;
};

}  // namespace mpq::rt::gpu
