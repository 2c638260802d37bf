#include "runtime/cuda/device_tensor.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "runtime/cuda/status.h"

namespace mpq::rt::gpu {

Tensor device_empty(CachingAllocator& alloc, DType dtype, Shape shape, void* stream, const std::string& node,
                    const std::string& op) {
  if (dtype == DType::String || dtype == DType::Undefined)
    fail_unsupported("node '{}' ({}): {} tensors cannot live on the GPU", node, op, dtype_name(dtype));
  const size_t bytes = dtype_storage_bytes(dtype, shape_numel(shape));
  void* p = alloc.allocate(bytes, stream, node, op);
  std::shared_ptr<void> data(p, [&alloc](void* q) { alloc.deallocate(q); });
  return Tensor::wrap(dtype, std::move(shape), std::move(data), Device::CUDA);
}

Tensor to_device(const Tensor& host, CachingAllocator& alloc, DeviceMemoryBackend& be, void* stream,
                 const std::string& node, const std::string& op) {
  if (!host.is_host()) fail_internal("to_device: node '{}' ({}): tensor is already on {}", node, op, device_name(host.device()));
  Tensor d = device_empty(alloc, host.dtype(), host.shape(), stream, node, op);
  const int code = be.copy(d.raw_data(), host.raw_data(), host.nbytes(), CopyKind::HostToDevice, stream);
  cuda_plan::check_cuda_status(cuda_plan::CudaLibrary::Runtime, code, "cudaMemcpyAsync(host to device)",
                               be.error_text(code), node, op);
  return d;
}

Tensor to_host(const Tensor& device, DeviceMemoryBackend& be, void* stream, const std::string& node,
               const std::string& op) {
  if (device.device() != Device::CUDA) fail_internal("to_host: node '{}' ({}): tensor is not on the GPU", node, op);
  Tensor h(device.dtype(), device.shape());
  int code = be.copy(h.raw_data(), device.raw_data(), device.nbytes(), CopyKind::DeviceToHost, stream);
  cuda_plan::check_cuda_status(cuda_plan::CudaLibrary::Runtime, code, "cudaMemcpyAsync(device to host)",
                               be.error_text(code), node, op);
  code = be.synchronize(stream);
  cuda_plan::check_cuda_status(cuda_plan::CudaLibrary::Runtime, code, "cudaStreamSynchronize", be.error_text(code), node, op);
  return h;
}

namespace {
size_t round_up(size_t n) { return (n + 255) / 256 * 256; }
}  // namespace

PinnedStaging::~PinnedStaging() {
  if (ptr_) be_.release_pinned(ptr_);
}

void* PinnedStaging::reserve(size_t bytes, void* stream) {
  if (unsupported_) return nullptr;
  if (bytes <= size_ && ptr_) return ptr_;
  if (ptr_) {
    const int code = be_.synchronize(stream);
    cuda_plan::check_cuda_status(cuda_plan::CudaLibrary::Runtime, code, "cudaStreamSynchronize", be_.error_text(code), "",
                                 "staging");
    be_.release_pinned(ptr_);
  }
  ptr_ = nullptr;
  size_ = 0;
  const size_t want = std::max(bytes, size_t{1} << 20);
  if (be_.allocate_pinned(&ptr_, want) != 0 || !ptr_) {
    unsupported_ = true;  // no pinned memory here: pageable copies from now on
    ptr_ = nullptr;
    return nullptr;
  }
  size_ = want;
  return ptr_;
}

std::vector<Tensor> to_device_all(const std::vector<const Tensor*>& hosts, PinnedStaging* staging, CachingAllocator& alloc,
                                  DeviceMemoryBackend& be, void* stream, const std::vector<std::string>& names) {
  size_t total = 0;
  for (const Tensor* h : hosts) total += round_up(h->nbytes());
  char* pinned = staging && total ? static_cast<char*>(staging->reserve(total, stream)) : nullptr;
  if (pinned) {
    // A run that failed half-way may have left copies from the buffer in flight.
    const int code = be.synchronize(stream);
    cuda_plan::check_cuda_status(cuda_plan::CudaLibrary::Runtime, code, "cudaStreamSynchronize", be.error_text(code),
                                 names.empty() ? "" : names[0], "Input");
  }
  std::vector<Tensor> out;
  size_t offset = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    const Tensor& h = *hosts[i];
    if (!pinned) {
      out.push_back(to_device(h, alloc, be, stream, names[i], "Input"));
      continue;
    }
    char* slot = pinned + offset;
    offset += round_up(h.nbytes());
    if (h.nbytes()) std::memcpy(slot, h.raw_data(), h.nbytes());
    const Tensor view = Tensor::wrap(h.dtype(), h.shape(), std::shared_ptr<void>(slot, [](void*) {}), Device::CPU);
    out.push_back(to_device(view, alloc, be, stream, names[i], "Input"));
  }
  return out;
}

std::vector<Tensor> to_host_all(const std::vector<Tensor>& devs, PinnedStaging* staging, DeviceMemoryBackend& be, void* stream,
                                const std::vector<std::string>& names) {
  size_t total = 0;
  for (const Tensor& d : devs) total += round_up(d.nbytes());
  char* pinned = staging && total ? static_cast<char*>(staging->reserve(total, stream)) : nullptr;
  std::vector<Tensor> out;
  if (!pinned) {
    for (size_t i = 0; i < devs.size(); ++i) out.push_back(to_host(devs[i], be, stream, names[i], "Output"));
    return out;
  }
  size_t offset = 0;
  std::vector<size_t> offsets;
  for (size_t i = 0; i < devs.size(); ++i) {
    if (devs[i].device() != Device::CUDA) fail_internal("to_host_all: '{}' is not on the GPU", names[i]);
    offsets.push_back(offset);
    const int code = be.copy(pinned + offset, devs[i].raw_data(), devs[i].nbytes(), CopyKind::DeviceToHost, stream);
    cuda_plan::check_cuda_status(cuda_plan::CudaLibrary::Runtime, code, "cudaMemcpyAsync(device to host)", be.error_text(code),
                                 names[i], "Output");
    offset += round_up(devs[i].nbytes());
  }
  const int code = be.synchronize(stream);
  cuda_plan::check_cuda_status(cuda_plan::CudaLibrary::Runtime, code, "cudaStreamSynchronize", be.error_text(code),
                               names.empty() ? "" : names[0], "Output");
  for (size_t i = 0; i < devs.size(); ++i) {
    Tensor h(devs[i].dtype(), devs[i].shape());
    if (h.nbytes()) std::memcpy(h.raw_data(), pinned + offsets[i], h.nbytes());
    out.push_back(std::move(h));
  }
  return out;
}

}  // namespace mpq::rt::gpu
