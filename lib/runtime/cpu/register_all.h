#pragma once
// Every CPU kernel family registers itself here, once, in an explicit list (register_all.cpp).
#include "runtime/kernel.h"

namespace mpq::rt::cpu {

void register_binary(OpRegistry& r);        // binary.cpp: arithmetic, comparison, logic, variadic
void register_unary(OpRegistry& r);         // unary.cpp: activations and math functions
void register_softmax(OpRegistry& r);       // softmax.cpp
void register_conv(OpRegistry& r);          // conv.cpp: Conv, ConvTranspose
void register_matmul(OpRegistry& r);        // matmul.cpp: Gemm, MatMul
void register_mlp(OpRegistry& r);           // mlp.cpp: mpq::GeluMlp (a transformer's feed-forward block)
void register_pool(OpRegistry& r);          // pool.cpp
void register_norm(OpRegistry& r);          // norm.cpp: batch/layer/instance/group norm
void register_reduce(OpRegistry& r);        // reduce.cpp: Reduce*, ArgMax/ArgMin, CumSum
void register_shape_ops(OpRegistry& r);     // shape_ops.cpp: Reshape, Transpose, Concat, Slice, ...
void register_tensor_ops(OpRegistry& r);    // tensor_ops.cpp: Constant, Cast, Gather, Range, ...
void register_resize(OpRegistry& r);        // resize.cpp: Resize, Upsample
void register_quant(OpRegistry& r);         // quant.cpp: Quantize/DequantizeLinear, QLinear*, *Integer
void register_control_flow(OpRegistry& r);  // control_flow.cpp: If, Loop, Scan
void register_rnn(OpRegistry& r);           // rnn.cpp: LSTM, GRU, RNN
void register_fake_quant(OpRegistry& r);    // fake_quant.cpp: mpq::FakeQuant (quantization-aware training)
void register_layout_ops(OpRegistry& r);    // layout_ops.cpp: mpq::GlobalAveragePool, mpq::ScaleChannels

}  // namespace mpq::rt::cpu
