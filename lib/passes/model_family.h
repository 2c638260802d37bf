#pragma once
// Which kind of network a model is, so `mpq quantize` can pick the defaults that work best for it
// when the user passes no flags (and say which it picked):
//  - transformer: attention or LayerNorm patterns, and more weight values in MatMul/Gemm than in
//    Conv (encoders, ViT); activation ranges vary per input and per token, outlier channels are
//    common: dynamic per-token quantization by default;
//  - cnn: Conv weights dominate: static calibrated ranges, int8 symmetric (TensorRT's convention);
//  - other: neither (MLPs, ...): static.
#include <string>

#include "ir/graph.h"

namespace mpq::passes {

enum class ModelFamily { Transformer, Cnn, Other };

struct FamilyGuess {
  ModelFamily family = ModelFamily::Other;
  std::string why;  // one line: the counts the guess rests on
};

FamilyGuess guess_model_family(const ir::Model& model);
const char* family_name(ModelFamily f);

}  // namespace mpq::passes
