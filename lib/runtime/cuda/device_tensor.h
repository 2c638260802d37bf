#pragma once
// Tensors in device memory: a Tensor whose device() is Device::CUDA and whose buffer goes back to
// the caching allocator when the last reference dies. Copies between host and device are always
// explicit (to_device / to_host); nothing converts implicitly. The allocator and backend must
// outlive the tensors (the executor owns all three). Tested on the host with a fake backend
// (tests/runtime/cuda_allocator_test.cpp); NEVER RUN on a GPU yet.
#include <string>

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

}  // namespace mpq::rt::gpu
