#pragma once
// Helpers shared by the Catch2 tests.
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"
#include "runtime/cpu/conv_onednn.h"
#include "runtime/executor.h"

namespace mpq::test {

namespace fs = std::filesystem;

fs::path source_dir();    // repository root ($MPQ_SOURCE_DIR overrides)
fs::path testdata_dir();  // ONNX backend test data (libonnx-testdata; $MPQ_TESTDATA overrides)
fs::path mpq_binary();

// A fresh empty folder under the system temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "mpq-test");
  ~TempDir();
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};
// Runs the mpq binary with the given arguments (no shell quoting issues: args are quoted here).
CommandResult run_mpq(const std::vector<std::string>& args);

// Seeded random float tensor in [lo, hi).
Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f);

// Largest |a-b| and relative L2 ||a-b|| / ||b|| of two float tensors of equal shape.
double max_abs_diff(const Tensor& a, const Tensor& b);
double rel_l2(const Tensor& a, const Tensor& b);

// Write a small model (its graph built by the caller) to `path`.
void write_model(const ir::Model& m, const fs::path& path);

// Same shape, type and bytes (a -0 differs from +0, a NaN equals itself).
bool same_bits(const Tensor& a, const Tensor& b);

// QuantizeLinear -> DequantizeLinear of `v` with one scale and an int8 (or uint8) zero point, as a
// QDQ model quantizes an activation; returns the dequantized value. Names start with `name`.
ir::Value* add_qdq(ir::Graph& g, ir::Value* v, const std::string& name, float scale, bool uint8 = false,
                   int zero_point = 0);

// Nodes of type `op` in the graph (subgraphs not counted).
int count_ops(const ir::Graph& g, const std::string& op);
int count_ops(const ir::Model& m, const std::string& op);

// tests/models/<name> (a path below that folder), with shapes inferred.
ir::Model load_test_model(const std::string& name);
// Seeded random feeds for the model's required inputs: float32 uniform in [-1, 1), int64 token ids
// below 50 (an input named attention_mask all ones); dimensions not fixed by the model become 2.
rt::Feeds random_feeds(const ir::Model& m, uint32_t seed);

// Runs a whole model once on a default executor (threads > 0: on that many threads).
std::vector<Tensor> run_model(const ir::Model& m, const rt::Feeds& feeds, int threads = 0);

// Runs one node (named "node_under_test", of `domain` at version 1 when not the default domain)
// through the executor on `threads` threads; undefined tensors in `inputs` are omitted optional
// inputs.
std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs,
                             const std::vector<ir::Attribute>& attrs, size_t n_outputs, int opset, int threads,
                             const std::string& domain = "");

// Switches OpenBLAS's kernel table (runtime/blas_kernels) for a test of which path a product takes:
// to Haswell (AVX2 on an AVX-512 CPU, as an AMD Zen 5 machine's OPENBLAS_CORETYPE holds it, where
// blas_kernels_below_cpu() is true) and to SkylakeX. Puts the process's kernels back when it goes,
// a failed REQUIRE included. Not usable (why() says so) where oneDNN is off, the CPU has no
// AVX-512, or OpenBLAS runs kernels it cannot select back by name (0.3.21 stops short of
// Cooperlake).
class BlasKernelSwitch {
 public:
  BlasKernelSwitch();
  ~BlasKernelSwitch();
  BlasKernelSwitch(const BlasKernelSwitch&) = delete;
  BlasKernelSwitch& operator=(const BlasKernelSwitch&) = delete;
  bool usable() const { return why_.empty(); }
  const std::string& why() const { return why_; }
  bool to(const std::string& kernels);  // whether they now run
  bool restore();                       // whether the process's kernels run again

 private:
  std::string before_, why_;
};

// A float32 [N, C, H, W] tensor in a convolution layout (runtime/cpu/channel_blocks.h: 0 plain,
// 8 or 16 channel blocks, kChannelsLast), and back to plain NCHW; the shape stays NCHW.
Tensor in_channel_layout(const Tensor& plain, int64_t block);
Tensor from_channel_layout(const Tensor& t, int64_t block);

// Scales for an int8 convolution with m output channels (inputs in [-2, 2] quantize within
// [-100, 100]) and a random bias in [-0.2, 0.2] from `seed`.
rt::cpu::Int8ConvScales int8_conv_scales(int64_t m, uint32_t seed);

// A 2-D convolution for onednn_conv_forward: n images of c x h x w into m channels, a square kernel
// k, one stride, padding top, bottom and left = right; a bias and a ReLU epilogue, Z added where
// `residual`; X, Y (and Z) in `layout` (as in_channel_layout); int8 with `q` where it is not null.
struct ConvGeometry {
  int64_t n, c, m, h, w, k, stride, pad_top, pad_bottom, pad_side;
};
rt::cpu::DnnlConvShape relu_conv_shape(const ConvGeometry& g, bool residual, int64_t layout,
                                       const rt::cpu::Int8ConvScales* q);

}  // namespace mpq::test
