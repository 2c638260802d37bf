#pragma once
// What one executor needs to run on a GPU: the plugin, one stream of its own, the device memory
// backend and a caching allocator on that stream, and the log of ops that fell back to the CPU.
// Owned by an Executor with BackendKind::CUDA.
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "kernels/cuda_api.h"
#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/device_tensor.h"
#include "runtime/cuda/plugin_backend.h"

namespace mpq::rt::gpu {

// Ops without a CUDA kernel run on the CPU with their inputs copied over and outputs copied back;
// that is logged once per op type (not per node or per run), with the reason.
class FallbackLog {
 public:
  // True the first time `op` is noted (and then it logs a warning).
  bool note(const std::string& op, const std::string& reason);
  std::set<std::string> ops() const;

 private:
  mutable std::mutex mu_;
  std::set<std::string> seen_;
};

class CudaContext {
 public:
  // Throws mpq::Error (BadInput: "--device cuda: ...") when the plugin is missing or the stream
  // cannot be created (no device, driver too old).
  CudaContext();
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  void* stream() const { return stream_; }
  // The plugin's GPU kernel table (launchers, cuBLASLt, cuDNN), or its host table when emulating.
  const cuda::OpsTable& ops() const { return *ops_; }
  // MPQ_CUDA_EMULATE=host: the CUDA path runs on the CPU (host kernel table, host memory), for
  // testing every command's `--device cuda` on machines without a GPU.
  static bool emulating();
  CachingAllocator& allocator() { return *allocator_; }
  DeviceMemoryBackend& backend() { return *backend_; }
  FallbackLog& fallbacks() { return fallbacks_; }
  PinnedStaging& staging() { return *staging_; }

 private:
  const cuda::CudaApi* api_ = nullptr;
  const cuda::OpsTable* ops_ = nullptr;
  void* stream_ = nullptr;
  std::unique_ptr<DeviceMemoryBackend> backend_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::unique_ptr<PinnedStaging> staging_;
  FallbackLog fallbacks_;
};

}  // namespace mpq::rt::gpu
