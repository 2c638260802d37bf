#include "runtime/devices.h"

#include "core/error.h"
#include "runtime/cuda_loader.h"

namespace mpq::rt {

DeviceReport query_devices() {
  DeviceReport r;
#ifdef MPQ_HAVE_CUDA
  r.cuda_built = true;
#endif
  std::string why;
  const cuda::CudaApi* api = cuda_plugin(&why);
  if (!api) {
    r.cuda_unavailable_reason = why;
    return r;
  }
  cuda::ProbeResult p = api->probe();
  r.cuda_runtime_version = p.runtime_version;
  r.cuda_driver_version = p.driver_version;
  r.cublaslt_version = p.cublaslt_version;
  for (const auto& d : p.devices)
    r.gpus.push_back(GpuInfo{d.index, d.name, d.major, d.minor, d.total_memory, d.multiprocessors});
  r.cuda_unavailable_reason = p.error;
  if (r.gpus.empty() && r.cuda_unavailable_reason.empty()) r.cuda_unavailable_reason = "no CUDA device";
  return r;
}

bool cuda_available() {
  static const bool available = [] {
    DeviceReport r = query_devices();
    return r.cuda_built && !r.gpus.empty();
  }();
  return available;
}

BackendKind resolve_device(const std::string& flag) {
  if (flag == "cpu") return BackendKind::CPU;
  // The CUDA plugin probes devices, but the executor has no CUDA kernels yet: `auto` stays on the
  // CPU, and `cuda` is refused up front rather than failing after the model is loaded.
  constexpr bool kCudaExecutorReady = false;
  if (flag == "auto") return kCudaExecutorReady && cuda_available() ? BackendKind::CUDA : BackendKind::CPU;
  if (flag == "cuda") {
    if (!cuda_available()) fail_input("--device cuda: CUDA is not usable here: {}", query_devices().cuda_unavailable_reason);
    if (!kCudaExecutorReady)
      fail_input("--device cuda: the executor's CUDA backend is not implemented yet in this version of mpq; use --device cpu");
    return BackendKind::CUDA;
  }
  fail_input("--device must be cpu, cuda or auto, got '{}'", flag);
}

}  // namespace mpq::rt
