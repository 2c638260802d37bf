#pragma once
// Mixed precision on the CUDA path of the training engine (AutogradOptions::device == CUDA with
// amp fp16/bf16), with the CPU engine's semantics (train/amp.h, runtime/low_precision.h): autocast
// converts a node's inputs to the type it runs in; a node with FP16/BF16 inputs computes in FP32
// inside (its inputs widened, the FP32 device kernels, its float outputs rounded back to the low
// type), so underflow and overflow happen where the CPU engine and a GPU show them. Activations
// and the values kept for the backward are stored in the low type; parameters stay FP32 masters.
// The conversions are runtime/cuda/device_convert.h's, shared with the CUDA graph runner.
#include "runtime/cuda/device_convert.h"

namespace mpq::train::gpu {

using rt::gpu::convert_on_device;
using rt::gpu::widen_on_device;

}  // namespace mpq::train::gpu
