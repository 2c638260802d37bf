#pragma once
// Tensors in device memory: a Tensor whose device() is Device::CUDA and whose buffer goes back to
// the caching allocator when the last reference dies. Copies between host and device are always
// explicit (to_device / to_host); nothing converts implicitly. The allocator and backend must
// outlive the tensors (the executor owns all three). Tested on the host with a fake backend
// (tests/runtime/cuda_allocator_test.cpp), and on an H100 by the gpu_* tests.
#include <string>
#include <vector>

#include "core/tensor.h"
#include "runtime/cuda/caching_allocator.h"

namespace mpq::rt::gpu {

// Uninitialized device tensor (numeric dtypes only; strings stay on the host).
Tensor device_empty(CachingAllocator& alloc, DType dtype, Shape shape, void* stream, const std::string& node,
                    const std::string& op);

// Host -> device copy on `stream` (asynchronous: `host` must stay alive until the stream syncs).
Tensor to_device(const Tensor& host, CachingAllocator& alloc, DeviceMemoryBackend& be, void* stream,
                 const std::string& node, const std::string& op);

// Device -> host copy; synchronizes `stream` so the result is ready on return.
Tensor to_host(const Tensor& device, DeviceMemoryBackend& be, void* stream, const std::string& node,
               const std::string& op);

// One page-locked host buffer for a run's input and output copies (grows to the largest run; one
// per executor). Falls back to pageable copies where the backend has no pinned memory.
class PinnedStaging {
 public:
  explicit PinnedStaging(DeviceMemoryBackend& be) : be_(be) {}
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  // At least `bytes` of pinned memory, or null when the backend has none. When it grows, `stream`
  // is synchronized first, so no queued copy still reads the buffer that is released.
  void* reserve(size_t bytes, void* stream);

 private:
  DeviceMemoryBackend& be_;
  void* ptr_ = nullptr;
  size_t size_ = 0;
  bool unsupported_ = false;
};

// Host -> device copies of `hosts` through `staging` (one memcpy into pinned memory each, then
// asynchronous DMA); with no staging or no pinned memory, plain to_device. The staging buffer is
// not reused before the stream passes these copies (the next run's to_host_all synchronizes).
std::vector<Tensor> to_device_all(const std::vector<const Tensor*>& hosts, PinnedStaging* staging, CachingAllocator& alloc,
                                  DeviceMemoryBackend& be, void* stream, const std::vector<std::string>& names);

// Device -> host copies of `devs` into fresh host tensors: every copy enqueued into pinned staging,
// one stream synchronization, then memcpy out; without staging, to_host one by one.
std::vector<Tensor> to_host_all(const std::vector<Tensor>& devs, PinnedStaging* staging, DeviceMemoryBackend& be, void* stream,
                                const std::vector<std::string>& names);

}  // namespace mpq::rt::gpu
