#pragma once
// Load-time fusion for running a model on mpq's executor, as ONNX Runtime does it: fewer passes
// over memory, the same outputs to float rounding. `mpq run` applies it to the whole graph;
// calibration applies it while keeping observable every tensor the quantizer reads a range for.
#include <set>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "passes/insert_qdq.h"
#include "runtime/kernel.h"

namespace mpq::passes {

// Folds constants and Conv+BatchNormalization (float32 only); on the CPU also fuses Conv with its
// residual Add and activation, LayerNorm, GELU and MatMul+bias, runs a 1x1 Conv before the
// upsampling Resize that feeds it (move_conv_before_resize.h), and keeps tensors between oneDNN
// convolutions channel-blocked. Graph outputs and the values named in `keep` stay observable: no
// fusion hides them (a channel-blocked tensor holds the same values in another order, so its
// min/max and histogram are unchanged). Returns the passes' notes.
std::vector<std::string> fuse_for_inference(ir::Model& model, rt::BackendKind backend,
                                            const std::set<std::string>& keep = {});

// The float tensors whose calibrated ranges QDQ export and fake-quant insertion read for `model`
// under `options` (the shared placement, quant_placement.h), ignoring node and op exclusions so the
// set also covers any narrower choice (an accuracy-budget search). With `qoperator`, also the
// outputs of Conv and MatMul nodes, which QLinearConv / QLinearMatMul need.
std::set<std::string> tensors_to_calibrate(const ir::Model& model, const QdqOptions& options, bool qoperator = false);

}  // namespace mpq::passes
