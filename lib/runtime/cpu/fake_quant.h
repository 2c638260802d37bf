#pragma once
// mpq::FakeQuant(X, scale, zero_point) -> Y: quantize and dequantize in one op, exactly as a
// QuantizeLinear -> DequantizeLinear pair computes it (calib/quant_ref.h, bit for bit), so that a
// fake-quantized model evaluated by mpq agrees with its QDQ export in ONNX Runtime. The
// quantization-aware-training pass (passes/insert_fake_quant) inserts it; its backward (STE with
// the clipping mask, LSQ for the scale) is train/grads/fake_quant_grad.cpp.
//
// Attributes: qmin, qmax (the integer range: [-128, 127] int8 activations, [0, 255] uint8,
// [-127, 127] int8 weights, [-7, 7] 4-bit weights); axis (the channel axis when scale has more than
// one element). scale: float32 scalar or [C]; zero_point: optional int32 scalar or [C] (0 when absent).
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"
#include "runtime/thread_pool.h"

namespace mpq::rt::cpu {

inline constexpr const char* kFakeQuantDomain = "mpq";
inline constexpr const char* kFakeQuantOp = "FakeQuant";
// mpq::FakeQuantBias(B, input_scale, weight_scale) -> B': the int32 bias of the QDQ export,
// quantized with scale = input_scale * weight_scale[c] (a float32 product, as insert_qdq computes
// it) and dequantized; left as is when some channel would overflow int32, as the export then keeps
// the bias in float. Trained through with an identity gradient for B.
inline constexpr const char* kFakeQuantBiasOp = "FakeQuantBias";

struct FakeQuantLayout {
  int32_t qmin = -128, qmax = 127;
  int64_t outer = 1, channels = 1, inner = 1;  // X viewed as [outer, channels, inner]
  std::vector<float> scale;                    // one per channel
  std::vector<int32_t> zero_point;             // one per channel
};

// Resolves a FakeQuant node's attributes and parameters for an input of shape `x` (BadInput naming
// the node on a mismatch: wrong scale length, non-positive scale, range outside int32, ...).
FakeQuantLayout fake_quant_layout(const ir::Node& node, const Shape& x, const Tensor& scale, const Tensor* zero_point);

// The int32 bias a QDQ export stores for `bias` (float32 [C]) given the scales, or false when a
// channel overflows int32 (then the export keeps the float bias). `out` receives the dequantized
// values. One weight scale serves every channel when weight_scales has one element.
bool fake_quantize_bias(const float* bias, int64_t channels, float input_scale, const float* weight_scales,
                        int64_t n_weight_scales, float* out);

// y = fake_quantize(x) over the layout, parallel over channel runs. An AVX-512 build of the loop
// runs where the CPU has it (the same bits as the SSE2 build).
void fake_quantize(ThreadPool& pool, const FakeQuantLayout& l, const float* x, float* y);

// Whether fake_quantize runs its AVX-512 build now; while a ScopedFakeQuantBaseline lives it runs
// the SSE2 build everywhere (tests compare the two).
bool fake_quant_avx512();
class ScopedFakeQuantBaseline {
 public:
  ScopedFakeQuantBaseline();
  ~ScopedFakeQuantBaseline();
  ScopedFakeQuantBaseline(const ScopedFakeQuantBaseline&) = delete;
  ScopedFakeQuantBaseline& operator=(const ScopedFakeQuantBaseline&) = delete;

 private:
  bool previous_;
};

}  // namespace mpq::rt::cpu
