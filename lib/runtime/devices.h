#pragma once
// What compute devices this build can use: the CPU always, CUDA when built with it and a device
// and a new-enough driver are present.
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernel.h"

namespace mpq::rt {

struct GpuInfo {
  int index = 0;
  std::string name;
  int compute_major = 0;
  int compute_minor = 0;
  size_t memory_bytes = 0;
  int multiprocessors = 0;
};

struct DeviceReport {
  bool cuda_built = false;
  int cuda_runtime_version = 0;  // e.g. 13000
  int cuda_driver_version = 0;   // 0 when no driver
  size_t cublaslt_version = 0;
  std::vector<GpuInfo> gpus;
  std::string cuda_unavailable_reason;  // empty when a GPU is usable
};

DeviceReport query_devices();
bool cuda_available();

// Resolves a --device flag ("cpu", "cuda", "auto"); asking for CUDA where there is none is a
// BadInput error that says why.
BackendKind resolve_device(const std::string& flag);

// The channel block of the CPU's convolution layout (8 or 16; passes/block_conv_layout), or 0 where
// oneDNN is not built in or switched off (MPQ_ONEDNN=0) and convolutions run on plain NCHW.
int64_t cpu_conv_channel_block();
// Whether that layout pass may also keep tensors channels-last (NHWC): oneDNN runs such
// convolutions with its direct kernels on this CPU (runtime/cpu/conv_onednn.h).
bool cpu_conv_channels_last();

}  // namespace mpq::rt
