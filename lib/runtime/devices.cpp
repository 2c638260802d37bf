#include "runtime/devices.h"

#include "core/error.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/cuda/context.h"
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
    return r.cuda_built && (!r.gpus.empty() || (gpu::CudaContext::emulating() && cuda_plugin(nullptr) != nullptr));
  }();
  return available;
}

BackendKind resolve_device(const std::string& flag) {
  if (flag == "cpu") return BackendKind::CPU;
  // `cuda` runs the executor's CUDA path (runtime/cuda/graph_runner.h); it passed
  // scripts/gpu_check.sh on an H100 twice (docs/gpu.md). `auto` picks it whenever a device (or the
  // host emulation) is usable, else the CPU. FP16/BF16 models run there too, each node in FP32
  // with conversions around it (no FP16 kernels yet).
  if (flag == "auto") return cuda_available() ? BackendKind::CUDA : BackendKind::CPU;
  if (flag == "cuda") {
    if (!cuda_available()) fail_input("--device cuda: CUDA is not usable here: {}", query_devices().cuda_unavailable_reason);
    return BackendKind::CUDA;
  }
  fail_input("--device must be cpu, cuda or auto, got '{}'", flag);
}

int64_t cpu_conv_channel_block() { return cpu::onednn_channel_block(); }
bool cpu_conv_channels_last() { return cpu::onednn_channels_last_direct(); }

}  // namespace mpq::rt
