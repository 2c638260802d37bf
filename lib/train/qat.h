#pragma once
// Quantization-aware fine-tuning of an ONNX model (`mpq qat-finetune`):
//   1. prepare the FP32 model as `mpq quantize` does (fold constants, fold BatchNormalization into
//      the Conv/Gemm before it) and calibrate it (or read a calibration table);
//   2. insert fake quantizers where the QDQ export puts Q/DQ (passes/insert_fake_quant), with the
//      post-training scales as the starting point;
//   3. train weights, biases and (LSQ) step sizes: by default label-free, distilling the FP32
//      model's outputs (KL of softmax outputs for classifiers, MSE otherwise), or with labels (ce),
//      or both; FP32 or mixed precision with dynamic loss scaling; checkpoints that a resumed run
//      continues from bit-identically;
//   4. export the standard INT8 (or 4-bit-weight) QDQ model with the learned weights and scales
//      (strip the fake quantizers, insert_qdq with the learned scales): the same placement and
//      format as `mpq quantize`, computing in mpq exactly what the fine-tuned model computed.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "calib/range_methods.h"
#include "ir/graph.h"
#include "passes/insert_qdq.h"
#include "runtime/kernel.h"
#include "train/amp.h"

namespace mpq::train {

struct QatProgress {
  int64_t epoch = 0, epochs = 0;  // 1-based epoch of this step
  int64_t step = 0, steps = 0;    // steps done, total
  double loss = 0.0, lr = 0.0, loss_scale = 1.0;
  double samples_per_second = 0.0, eta_seconds = 0.0;
  bool skipped = false;
};

struct QatOptions {
  std::filesystem::path model;
  std::filesystem::path data;
  std::filesystem::path eval_data;   // optional: before/after metrics
  std::filesystem::path calib_table; // optional: initial ranges from `mpq calibrate`
  calib::RangeMethod method = calib::RangeMethod::Entropy;
  double percentile = 99.999;
  int64_t calib_samples = 512;       // rows of --data to calibrate on
  std::string loss = "distill";      // distill | ce | distill+ce
  double temperature = 1.0;
  int64_t epochs = 1;
  int64_t steps = -1;                // > 0: overrides epochs
  int64_t batch_size = 64;
  double lr = 1e-4;
  std::string optimizer = "adamw";   // adamw | sgd
  double weight_decay = 0.0;
  double momentum = 0.9;             // sgd
  int64_t warmup = -1;               // < 0: 5% of the steps, at most 100
  double max_grad_norm = 0.0;        // > 0: clip by global norm
  passes::QdqOptions quant;          // weight bits, per channel, activation type, exclusions
  bool learn_scales = true;
  int64_t freeze_ranges_after = -1;  // >= 0: step sizes stop training after this many steps
  Amp amp = Amp::Off;
  // CUDA: the student's forward and backward and the teacher's runs on the GPU (AutogradOptions::
  // device), with parameters, gradients and optimizer state in device memory; the loss on the host.
  // FP32 only.
  rt::BackendKind device = rt::BackendKind::CPU;
  int threads = 0;
  uint64_t seed = 0;
  std::filesystem::path checkpoint_dir;
  int64_t checkpoint_every = 0;      // 0: only at the end (and when interrupted)
  bool resume = false;
  int64_t max_bad_steps = 50;        // consecutive non-finite steps before giving up
  std::string command;               // provenance for metadata_props
  std::function<void(const QatProgress&)> progress;
  std::function<void(const std::string&)> log;
  std::function<bool()> stop_requested;  // polled between steps (SIGINT)
};

struct QatMetrics {
  int64_t rows = 0;
  double accuracy = -1.0;   // top-1 against labels (-1 without labels)
  double agreement = -1.0;  // top-1 agreement with the FP32 model
  double rel_l2 = -1.0;     // relative L2 of the outputs against the FP32 model
};

struct QatResult {
  ir::Model exported;        // undefined graph when interrupted
  bool interrupted = false;
  int64_t steps_done = 0, total_steps = 0, start_step = 0;
  double seconds = 0.0, seconds_per_epoch = 0.0;
  double first_loss = 0.0, final_loss = 0.0;
  std::vector<double> losses;  // every step of this run (from start_step on)
  std::vector<double> step_ms; // each step's wall time (batch, teacher, student step), likewise
  int64_t skipped_steps = 0;
  double final_loss_scale = 1.0;
  passes::QdqReport report;
  std::string calibration_method;
  int64_t trainable_parameters = 0, trainable_scales = 0;
  bool has_eval = false;
  QatMetrics fp32, before, after;  // on eval_data
  size_t peak_step_bytes = 0;
  std::vector<std::string> notes;
};

QatResult qat_finetune(const QatOptions& options);

// Top-1 accuracy / agreement and relative L2 of `model` against `reference` on a data folder
// (batched by `batch_size` rows where the models allow it).
QatMetrics evaluate_against(const ir::Model& model, const ir::Model& reference, const std::filesystem::path& data,
                            int64_t batch_size, int threads);

}  // namespace mpq::train
