#pragma once
// Loads the CUDA plugin (libmpq_cuda.so) on first use. CPU-only runs never load it, so they do not
// pay for the CUDA runtime and cuBLASLt in memory or start-up time.
#include <string>

#include "kernels/cuda_api.h"

namespace mpq::rt {

// The plugin's function table, or nullptr with `why` set (not built with CUDA, plugin missing,
// version mismatch). Looks in $MPQ_CUDA_PLUGIN, beside the running executable, then at the
// build-tree path compiled in.
const cuda::CudaApi* cuda_plugin(std::string* why = nullptr);

}  // namespace mpq::rt
