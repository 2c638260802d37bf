#include "runtime/cuda/device_tensor.h"

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

}  // namespace mpq::rt::gpu
