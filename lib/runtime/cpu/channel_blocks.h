#pragma once
// The channel-blocked activation layout oneDNN's direct convolutions run on (nChw8c on AVX2,
// nChw16c on AVX-512): a [N, C, H, W] tensor stored as [N, C/b, H, W, b], so that b channels of one
// pixel sit in one vector register. passes/block_conv_layout keeps tensors that flow from one
// oneDNN convolution to the next in this layout, so neither reorders them; these functions convert
// where a kernel has to see plain NCHW after all (mpq's own convolution kernels as the fallback).
// C must be a multiple of b, or the layout channels-last (kChannelsLast below: one block of all C
// channels), so both layouts hold the same number of elements and the tensor keeps its NCHW shape.
// Not a public API.
#include <cstdint>

namespace mpq::rt {
class ThreadPool;
}

namespace mpq::rt::cpu {

// Channels-last (NHWC): the blocked layout with a single block of all C channels, [N, 1, S, C]. It
// fits any channel count; passes/block_conv_layout keeps tensors in it where a chain of
// convolutions has channel counts that are not multiples of 8 or 16 (MobileNets' 24, 72, 120).
inline constexpr int64_t kChannelsLast = -1;

// The layouts a tensor may carry: 0 (plain NCHW), 8 or 16 (channel blocks), kChannelsLast.
bool valid_channel_block(int64_t block);
// Whether a tensor with `channels` channels can be held in `block`'s layout.
inline bool fits_channel_block(int64_t block, int64_t channels) {
  return block == 0 || block == kChannelsLast || (block > 0 && channels % block == 0);
}

// dst[n, c / b, s, c % b] = src[n, c, s] for the `spatial` positions s (H * W).
void to_channel_blocks(ThreadPool& pool, const float* src, float* dst, int64_t n, int64_t c, int64_t spatial,
                       int64_t block);
// The inverse: src in [N, C/b, S, b] back to dst in [N, C, S].
void from_channel_blocks(ThreadPool& pool, const float* src, float* dst, int64_t n, int64_t c, int64_t spatial,
                         int64_t block);

// Channels-last src [N, S, C] to plain dst [N, C, S] on the calling thread, in 16 x 16 tiles
// transposed in AVX-512 registers where the CPU has it (the rest, and CPUs without, element by
// element): the output of an int8 convolution for a reader that takes NCHW, where oneDNN's reorder
// took about 1 ns per value (U-Net INT8: 18 us of a run on one thread). A copy: the same bits.
void channels_last_to_plain(const float* src, float* dst, int64_t n, int64_t c, int64_t spatial);

}  // namespace mpq::rt::cpu
