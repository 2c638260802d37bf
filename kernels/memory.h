#pragma once
// Fills the memory/stream entries of the plugin's CudaApi (kernels/memory.cu).
#include "kernels/cuda_api.h"

namespace mpq::cuda {
void fill_memory_api(CudaApi& api);
}
