#pragma once
// Gradient checks for backward kernels: one node, float64, central finite differences.
//
// check_gradients builds a one-node model whose float inputs in `wrt` are graph inputs (the rest
// are initializers, so constant inputs are also checked to get no gradient), runs the training
// engine's forward and backward with the loss L = sum_j <R_j, Y_j> for fixed random R_j, and
// compares each input gradient with (L(x + eps e_k) - L(x - eps e_k)) / (2 eps) computed in float64
// over (a seeded sample of) the elements. Then it runs the same node in float32 and checks the
// float32 backward against the float64 one (relative L2), so the float path is covered too.
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"

namespace mpq::test {

struct GradCheckOptions {
  int opset = 17;
  std::vector<size_t> wrt;   // inputs to differentiate; empty: every float input
  size_t n_outputs = 1;
  int threads = 3;
  bool training = true;      // BatchNormalization with batch statistics
  double eps = 1e-6;         // finite-difference step
  double rtol = 1e-6, atol = 1e-9;
  double float32_rel_l2 = 2e-5;  // float32 backward vs float64 backward
  int max_elements = 256;    // elements perturbed per input (a seeded sample when larger)
  uint32_t seed = 7;
  std::vector<size_t> loss_outputs;  // outputs in the loss; empty: every float output
  std::string domain;        // the op's domain ("" for ONNX; "mpq" for mpq's own ops, at version 1)
};

// Runs the check with Catch2 assertions (one INFO line per failing element).
void check_gradients(const std::string& op, const std::vector<Tensor>& inputs, const std::vector<ir::Attribute>& attrs,
                     const GradCheckOptions& options = {});

// Analytic input gradients of the one-node model (float64 or float32 as the inputs are), for the
// loss above; undefined where an input gets none.
std::vector<Tensor> node_gradients(const std::string& op, const std::vector<Tensor>& inputs,
                                   const std::vector<ir::Attribute>& attrs, const GradCheckOptions& options);

}  // namespace mpq::test
