#pragma once
// Every backward family registers itself here, once, in an explicit list (register_all_grads.cpp).
// Each family's file sits beside the others in train/grads/ and mirrors a forward family of
// runtime/cpu/.
#include "train/grad_registry.h"

namespace mpq::train::grads {

void register_binary_grads(GradRegistry& r);   // binary_grad.cpp: Add, Sub, Mul, Div, Pow, Where, Max, Min
void register_unary_grads(GradRegistry& r);    // unary_grad.cpp: activations, Sqrt, Exp, Log, Erf, Identity, Cast, ...
void register_softmax_grads(GradRegistry& r);  // softmax_grad.cpp: Softmax, LogSoftmax
void register_conv_grads(GradRegistry& r);     // conv_grad.cpp: Conv, ConvTranspose
void register_matmul_grads(GradRegistry& r);   // matmul_grad.cpp: Gemm, MatMul
void register_pool_grads(GradRegistry& r);     // pool_grad.cpp: MaxPool, AveragePool, Global*Pool
void register_norm_grads(GradRegistry& r);     // norm_grad.cpp: BatchNormalization, LayerNormalization
void register_reduce_grads(GradRegistry& r);   // reduce_grad.cpp: ReduceMean, ReduceSum
void register_shape_grads(GradRegistry& r);    // shape_grad.cpp: Reshape, Transpose, Concat, Split, Slice, Pad, ...
void register_tensor_grads(GradRegistry& r);   // tensor_grad.cpp: Gather, GatherElements
void register_resize_grads(GradRegistry& r);   // resize_grad.cpp: Resize
void register_fake_quant_grads(GradRegistry& r);  // fake_quant_grad.cpp: mpq::FakeQuant (STE, LSQ)

}  // namespace mpq::train::grads
