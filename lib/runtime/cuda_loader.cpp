#include "runtime/cuda_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

namespace mpq::rt {

namespace {

struct Loaded {
  const cuda::CudaApi* api = nullptr;
  std::string why;
};

Loaded load() {
  Loaded l;
#ifndef MPQ_HAVE_CUDA
  l.why = "this build of mpq has no CUDA support (configured with MPQ_CUDA=OFF)";
  return l;
#else
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MPQ_CUDA_PLUGIN")) candidates.emplace_back(env);
  std::error_code ec;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) candidates.push_back((exe.parent_path() / "libmpq_cuda.so").string());
  candidates.emplace_back(MPQ_CUDA_PLUGIN_PATH);
  std::string errors;
  for (const std::string& path : candidates) {
    if (!std::filesystem::exists(path, ec)) continue;
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* e = ::dlerror();
      errors += path + ": " + (e ? e : "dlopen failed") + "; ";
      continue;
    }
    using Entry = const cuda::CudaApi* (*)();
    auto entry = reinterpret_cast<Entry>(::dlsym(handle, "mpq_cuda_api"));
    if (!entry) {
      errors += path + ": no mpq_cuda_api symbol; ";
      continue;
    }
    const cuda::CudaApi* api = entry();
    if (!api || api->version != cuda::kCudaApiVersion) {
      errors += path + ": built for another plugin interface version; ";
      continue;
    }
    l.api = api;  // the handle stays open for the life of the process
    return l;
  }
  l.why = errors.empty() ? "the CUDA plugin libmpq_cuda.so was not found beside the mpq binary" : "cannot load the CUDA plugin: " + errors;
  return l;
#endif
}

}  // namespace

const cuda::CudaApi* cuda_plugin(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.api && why) *why = loaded.why;
  return loaded.api;
}

}  // namespace mpq::rt
