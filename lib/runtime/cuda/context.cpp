#include "runtime/cuda/context.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "kernels/ops_table.h"
#include "runtime/cuda_loader.h"

namespace mpq::rt::gpu {

bool FallbackLog::note(const std::string& op, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!seen_.insert(op).second) return false;
  spdlog::warn("{} has no CUDA kernel ({}): it runs on the CPU, with its inputs and outputs copied", op, reason);
  return true;
}

std::set<std::string> FallbackLog::ops() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seen_;
}

bool CudaContext::emulating() {
  const char* e = std::getenv("MPQ_CUDA_EMULATE");
  return e && std::string(e) == "host";
}

CudaContext::CudaContext() {
  std::string why;
  api_ = cuda_plugin(&why);
  if (!api_) fail_input("--device cuda: {}", why);
  if (emulating()) {
    if (!api_->host_ops) fail_input("--device cuda: the CUDA plugin has no host kernel table to emulate with");
    static std::once_flag once;
    std::call_once(once, [] {
      spdlog::warn("MPQ_CUDA_EMULATE=host: the CUDA path runs its kernel bodies on the CPU (for testing; no GPU is used)");
    });
    ops_ = api_->host_ops;
    backend_ = std::make_unique<HostEmulationBackend>();
    allocator_ = std::make_unique<CachingAllocator>(*backend_);
    staging_ = std::make_unique<PinnedStaging>(*backend_);  // no pinned memory here: pageable copies
    return;
  }
  if (!api_->ops) fail_input("--device cuda: the CUDA plugin has no kernel table");
  ops_ = api_->ops;
  const int code = api_->stream_create(&stream_);
  if (code != 0)
    fail_input("--device cuda: cannot create a CUDA stream: {} ({})", api_->error_string ? api_->error_string(code) : "",
               code);
  backend_ = std::make_unique<PluginMemoryBackend>(*api_);
  allocator_ = std::make_unique<CachingAllocator>(*backend_);
  staging_ = std::make_unique<PinnedStaging>(*backend_);
}

CudaContext::~CudaContext() {
  staging_.reset();
  allocator_.reset();  // returns the cached blocks before the stream goes
  if (stream_) {
    if (ops_ && ops_->release_stream) ops_->release_stream(stream_);  // cuDNN's handle bound to it
    api_->stream_destroy(stream_);
  }
}

}  // namespace mpq::rt::gpu
