#pragma once
// Shared by autograd_cuda_test (host kernel table, host memory) and gpu_autograd_test (GPU
// launchers, cuDNN / cuBLASLt, device memory): the training engine's device mode against its CPU
// engine on whole models, and a few trainer steps with the update on the device.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "calib/calibrator.h"
#include "ir/onnx_io.h"
#include "node_cases.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "passes/insert_fake_quant.h"
#include "passes/pass.h"
#include "test_util.h"
#include "train/autograd.h"
#include "train/checkpoint.h"
#include "train/grad_scaler.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace mpq::test {


// A device-mode engine's options on `table` and `mem` (one thread; eval mode unless `training`).
inline train::AutogradOptions device_options(const mpq::cuda::OpsTable& table, rt::gpu::DeviceMemoryBackend& mem,
                                             bool training = false) {
  train::AutogradOptions o;
  o.threads = 1;
  o.training = training;
  o.device = rt::BackendKind::CUDA;
  o.cuda_ops = &table;
  o.cuda_memory = &mem;
  return o;
}

// The model as qat-finetune trains it: constants folded, BatchNorm fused, FakeQuant inserted from
// a min/max calibration on the model's shipped feeds.
inline ir::Model fake_quant_student(const std::string& stem) {
  ir::Model m = ir::load_model(test::source_dir() / "tests/models" / (stem + ".onnx"));
  passes::FoldConstants fold;
  passes::run_pass(fold, m);
  passes::FuseConvBn fuse;
  passes::run_pass(fuse, m);
  data::FeedSource src = data::FeedSource::open(test::source_dir() / "tests/models" / (stem + "_data"), m);
  calib::CalibOptions co;
  co.method = calib::RangeMethod::MinMax;
  const calib::CalibrationTable table = calib::calibrate(m, src, co);
  passes::QdqOptions o;
  passes::insert_fake_quant(m, table, o);
  return m;
}

// `grad_tol`: rel-L2 bound on every parameter gradient. FP32 graphs agree to float rounding. A
// FakeQuant student amplifies a convolution summed in another order (the device's direct body vs
// the CPU's GEMM): a value that lands on the other side of a rounding boundary changes by a whole
// step, and the step-size gradient of its quantizer by dY there. On mobilenetv3's student that
// moves one activation step size's gradient by 13% and the rest by 0.02-3%. With the CPU's own
// forward convolutions (a table declining them: `conv_forward_declined`) the same students agree
// closely, which is what shows the device backward itself is right. `out_tol`: rel-L2 bound on the
// outputs and running statistics. `table` and `mem`: the host harness or the GPU's.
// `amp`: both engines train in mixed precision (FP16/BF16 values where autocast puts them).
inline void compare_engines(const ir::Model& model, bool training, uint32_t seed, const mpq::cuda::OpsTable& table,
                            rt::gpu::DeviceMemoryBackend& mem, double grad_tol = 1e-4, bool conv_forward_declined = false,
                            double out_tol = 1e-5, train::Amp amp = train::Amp::Off) {
  const rt::Feeds feeds = test::random_feeds(model, seed);
  train::AutogradOptions co;
  co.threads = 1;
  co.training = training;
  co.amp = amp;
  train::Autograd cpu(model, co);
  train::AutogradOptions go = co;
  go.device = rt::BackendKind::CUDA;
  go.cuda_ops = &table;
  go.cuda_memory = &mem;
  train::Autograd dev(model, go);
  REQUIRE(dev.parameters().size() == cpu.parameters().size());
  REQUIRE_FALSE(cpu.parameters().empty());

  const std::vector<Tensor> out_c = cpu.forward(feeds), out_d = dev.forward(feeds);
  REQUIRE(out_c.size() == out_d.size());
  std::vector<Tensor> dy;
  for (size_t j = 0; j < out_c.size(); ++j) {
    INFO("output " << j);
    CHECK(out_d[j].dtype() == out_c[j].dtype());
    CHECK(rel_l2(out_d[j], out_c[j]) < out_tol);
    dy.push_back(test::random_tensor(out_c[j].shape(), seed + 100 + static_cast<uint32_t>(j)));
  }
  cpu.backward(dy);
  dev.backward(dy);
  for (size_t k = 0; k < cpu.parameters().size(); ++k) {
    const train::Parameter& pc = cpu.parameters()[k];
    const train::Parameter& pd = dev.parameters()[k];
    INFO("parameter " << pc.name);
    REQUIRE(pd.name == pc.name);
    double norm = 0;
    for (int64_t i = 0; i < pc.grad.numel(); ++i) norm += pc.grad.get_double(i) * pc.grad.get_double(i);
    if (norm > 0) {
      CHECK(rel_l2(pd.grad, pc.grad) < grad_tol);
    } else {
      double got = 0;
      for (int64_t i = 0; i < pd.grad.numel(); ++i) got += std::fabs(pd.grad.get_double(i));
      CHECK(got == 0.0);
    }
  }
  // The heavy ops really ran on the device, forward and backward (a node that fell back would
  // still give the right numbers, so this is checked on its own). With `table` declining the
  // convolution forward, Conv's forward is expected on the CPU, its backward still on the device.
  const std::set<std::string> fell_back = dev.device_fallbacks();
  std::set<std::string> ops_in_model;
  for (const auto& n : model.graph->nodes()) ops_in_model.insert(n->op_type);
  for (const char* op : {"Conv", "Gemm", "MatMul", "Add", "Mul", "Relu", "HardSwish", "GlobalAveragePool", "Softmax", "FakeQuant",
                         "FakeQuantBias", "LayerNormalization", "BatchNormalization"}) {
    if (!ops_in_model.count(op)) continue;
    INFO("op " << op);
    CHECK_FALSE(fell_back.count(std::string(op) + " (backward)"));
    if (!(conv_forward_declined && std::string(op) == "Conv")) CHECK_FALSE(fell_back.count(op));
  }
  if (conv_forward_declined && ops_in_model.count("Conv")) CHECK(fell_back.count("Conv"));
  REQUIRE(dev.state().size() == cpu.state().size());
  for (size_t k = 0; k < cpu.state().size(); ++k) {
    INFO("running state " << cpu.state()[k].name);
    CHECK(rel_l2(dev.state()[k].value, cpu.state()[k].value) < out_tol);
  }
}


// Device memory (host or GPU) that counts the bytes copied to the host, to show what stays on the
// device between steps.
struct CountingMemory : DeviceMemoryBackend {
  DeviceMemoryBackend& inner;
  size_t to_host = 0;
  explicit CountingMemory(DeviceMemoryBackend& m) : inner(m) {}
  int allocate(void** p, size_t bytes) override { return inner.allocate(p, bytes); }
  int release(void* p) override { return inner.release(p); }
  int copy(void* dst, const void* src, size_t bytes, CopyKind kind, void* stream) override {
    if (kind == CopyKind::DeviceToHost) to_host += bytes;
    return inner.copy(dst, src, bytes, kind, stream);
  }
  int synchronize(void* stream) override { return inner.synchronize(stream); }
  std::string error_text(int code) override { return inner.error_text(code); }
};

using MakeOptimizer = std::function<std::unique_ptr<train::Optimizer>(std::vector<train::ParamGroup>)>;

struct Run {
  std::vector<double> losses, norms;
  std::vector<Tensor> weights;
  train::Checkpoint state;  // parameters and optimizer state after the last step
  size_t param_bytes = 0;
  size_t to_host_after_first = 0;  // bytes downloaded in the steps after the first
  size_t graph_to_host = 0;        // the same number of forwards and backwards alone (outputs, CPU fallbacks)
};

inline constexpr double kMaxGradNorm = 0.2;

// `steps` trainer steps of a regression loss on resnet_bn (eval mode),
// two parameter groups (weight decay; a log-space group at half the rate), clipping that bites and
// loss scaling; optionally starting from a checkpoint.
inline Run train_steps(bool on_device, const MakeOptimizer& make, int steps, const mpq::cuda::OpsTable& table,
                       DeviceMemoryBackend& device_memory, const train::Checkpoint* resume = nullptr) {
  const ir::Model model = test::load_test_model("resnet_bn_op17.onnx");
  const rt::Feeds feeds = test::random_feeds(model, 7);
  const std::vector<Tensor> target = train::Autograd(model, {}).forward(feeds);
  CountingMemory mem(device_memory);
  train::AutogradOptions o;
  o.threads = 1;
  o.training = false;
  if (on_device) {
    o.device = rt::BackendKind::CUDA;
    o.cuda_ops = &table;
    o.cuda_memory = &mem;
  }
  train::Autograd engine(model, o);
  REQUIRE((engine.device_update() != nullptr) == on_device);
  std::vector<train::ParamGroup> groups = {train::ParamGroup{"w", {}, 1.0, 0.01, false},
                                           train::ParamGroup{"s", {}, 0.5, 0.0, true}};
  Run run;
  for (size_t k = 0; k < engine.parameters().size(); ++k) {
    groups[k % 3 == 2 ? 1 : 0].params.push_back(k);
    run.param_bytes += engine.parameters()[k].value.nbytes();
  }
  std::unique_ptr<train::Optimizer> opt = make(groups);
  train::GradScaler scaler(train::GradScalerOptions{1024.0, 2.0, 0.5, 2000, true});
  if (resume) {
    for (train::Parameter& p : engine.parameters()) {
      const Tensor& t = resume->get("param/" + p.name);
      std::memcpy(p.value.raw_data(), t.raw_data(), t.nbytes());
    }
    opt->load(*resume, std::as_const(engine).parameters());
  }
  train::Trainer trainer(engine, *opt, scaler, train::LrSchedule{3e-3, 0, 8}, kMaxGradNorm);
  const int64_t start = resume ? resume->meta().at("step").get<int64_t>() : 0;
  trainer.set_steps_done(start);
  for (int s = 0; s < steps; ++s) {
    if (s == 1) mem.to_host = 0;
    const train::StepResult r = trainer.step(feeds, [&](const std::vector<Tensor>& outs) {
      train::LossOutput l;
      for (size_t j = 0; j < outs.size(); ++j) {
        Tensor g(DType::Float32, outs[j].shape());
        for (int64_t i = 0; i < g.numel(); ++i) {
          const double d = outs[j].get_double(i) - target[j].get_double(i) + 0.1;
          l.value += d * d / static_cast<double>(g.numel());
          g.data<float>()[i] = static_cast<float>(2 * d / static_cast<double>(g.numel()));
        }
        l.output_grads.push_back(g);
      }
      return l;
    });
    REQUIRE_FALSE(r.skipped);
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
  }
  run.to_host_after_first = mem.to_host;
  mem.to_host = 0;
  for (int s = 1; s < steps; ++s) {
    const std::vector<Tensor> outs = engine.forward(feeds);
    std::vector<Tensor> dy;
    for (const Tensor& t : outs) dy.push_back(test::random_tensor(t.shape(), 70));
    engine.backward(dy);
    engine.zero_grad();
  }
  run.graph_to_host = mem.to_host;
  for (const train::Parameter& p : std::as_const(engine).parameters()) {
    run.weights.push_back(p.value.clone());
    run.state.put("param/" + p.name, p.value);
  }
  opt->save(run.state, std::as_const(engine).parameters());
  run.state.meta()["step"] = start + steps;
  return run;
}

// `tol`: the losses' and norms' relative bound; weights and optimizer state get 1x and 10x it.
inline void check_same_run(const Run& dev, const Run& cpu, double tol = 1e-5) {
  REQUIRE(dev.losses.size() == cpu.losses.size());
  for (size_t s = 0; s < cpu.losses.size(); ++s) {
    INFO("step " << s);
    CHECK(dev.losses[s] == Approx(cpu.losses[s]).epsilon(tol));
    CHECK(dev.norms[s] == Approx(cpu.norms[s]).epsilon(tol));
  }
  for (size_t k = 0; k < cpu.weights.size(); ++k) CHECK(rel_l2(dev.weights[k], cpu.weights[k]) < tol);
  // Same optimizer state under the same names (downloaded from the device for the checkpoint).
  REQUIRE(dev.state.tensors().size() == cpu.state.tensors().size());
  for (const auto& [name, t] : cpu.state.tensors()) {
    INFO(name);
    REQUIRE(dev.state.has(name));
    CHECK(rel_l2(dev.state.get(name), t) < 10 * tol);
  }
}


// A gradient check of the device-mode engine on `table` and `mem`: its parameter gradients against
// central finite differences of its own forward, L = sum_j <R_j, Y_j>, on a smooth model (the
// transformer: GELU, Softmax, LayerNorm, MatMul) and on resnet_bn in eval mode (ReLU: the
// perturbation is small against the distance to a kink for almost every element). The device
// bodies are FP32, so the differences are taken in FP32 with a step of 2e-3 (x max(1, |w|)) and
// compared with a bound scaled by the gradient's size (when it was set, the worst element on the
// host table used half of it); the CPU backward kernels have their own float64 checks (tests/train). Two seeded
// elements of every parameter.
inline void check_finite_differences(const mpq::cuda::OpsTable& table, rt::gpu::DeviceMemoryBackend& mem) {
  for (const char* name : {"transformer_op17.onnx", "resnet_bn_op17.onnx"}) {
    INFO(name);
    const ir::Model model = test::load_test_model(name);
    const rt::Feeds feeds = test::random_feeds(model, 3);
    train::Autograd dev(model, device_options(table, mem));
    std::vector<Tensor> r;
    auto loss = [&](const std::vector<Tensor>& outs) {
      double l = 0.0;
      for (size_t j = 0; j < outs.size(); ++j)
        for (int64_t i = 0; i < outs[j].numel(); ++i) l += outs[j].get_double(i) * r[j].get_double(i);
      return l;
    };
    const std::vector<Tensor> out = dev.forward(feeds);
    for (size_t j = 0; j < out.size(); ++j) r.push_back(test::random_tensor(out[j].shape(), 50 + static_cast<uint32_t>(j)));
    dev.backward(r);
    std::vector<Tensor> analytic;
    for (const train::Parameter& p : std::as_const(dev).parameters()) analytic.push_back(p.grad.clone());
    int checked = 0;
    uint32_t pick = 12345;
    for (size_t k = 0; k < dev.parameters().size(); ++k) {
      const int64_t n = analytic[k].numel();
      double scale = 0.0;  // RMS of this parameter's gradient
      for (int64_t i = 0; i < n; ++i) scale += analytic[k].get_double(i) * analytic[k].get_double(i);
      scale = std::sqrt(scale / static_cast<double>(std::max<int64_t>(n, 1)));
      for (int s = 0; s < 2 && n > 0; ++s) {
        pick = pick * 1103515245u + 12345u;
        const int64_t i = static_cast<int64_t>((pick >> 8) % static_cast<uint32_t>(n));
        float* w = dev.parameters()[k].value.data<float>();  // marks the device copy stale
        const float w0 = w[i];
        const float h = 2e-3f * std::max(1.0f, std::fabs(w0));
        w[i] = w0 + h;
        const double up = loss(dev.forward(feeds));
        w = dev.parameters()[k].value.data<float>();
        w[i] = w0 - h;
        const double down = loss(dev.forward(feeds));
        w = dev.parameters()[k].value.data<float>();
        w[i] = w0;
        const double fd = (up - down) / (static_cast<double>(w0 + h) - static_cast<double>(w0 - h));
        const double an = analytic[k].get_double(i);
        INFO(dev.parameters()[k].name << "[" << i << "]: analytic " << an << ", finite difference " << fd);
        CHECK(std::fabs(fd - an) <= 0.01 * std::fabs(an) + 0.01 * scale + 5e-4);
        ++checked;
      }
    }
    CHECK(checked >= 20);
    CHECK(dev.device_fallbacks().count("MatMul (backward)") == 0);
  }
}

}  // namespace mpq::test
