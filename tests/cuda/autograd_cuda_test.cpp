// The training engine's device mode (AutogradOptions::device = CUDA) on the host kernel table and
// host memory posing as device memory, against the CPU engine on the same model and batch: the
// outputs, every parameter's gradient and the running statistics, for whole test models (FP32 and
// with mpq FakeQuant inserted as QAT does), in eval and training mode, then a few optimizer steps.
// Nodes without a device kernel or backward (BatchNorm's training forward, shape arithmetic) run
// on the CPU with copies, so that path is covered too. Always runs.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "calib/calibrator.h"
#include "ir/onnx_io.h"
#include "node_cases.h"
#include "passes/fold_constants.h"
#include "passes/fuse_conv_bn.h"
#include "passes/insert_fake_quant.h"
#include "passes/pass.h"
#include "train/autograd.h"
#include "train/grad_scaler.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace mpq;
using namespace mpq::test;

namespace {

// The model as qat-finetune trains it: constants folded, BatchNorm fused, FakeQuant inserted from
// a min/max calibration on the model's shipped feeds.
ir::Model fake_quant_student(const std::string& stem) {
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
// forward convolutions (the declining table below) the same students agree to 1e-4, which is what
// shows the device backward itself is right.
void compare_engines(const ir::Model& model, bool training, uint32_t seed, double grad_tol = 1e-4,
                     const mpq::cuda::OpsTable* table = nullptr) {
  const rt::Feeds feeds = test::random_feeds(model, seed);
  train::AutogradOptions co;
  co.threads = 1;
  co.training = training;
  train::Autograd cpu(model, co);
  HostMemory mem;  // outlives the device engine
  train::AutogradOptions go = co;
  go.device = rt::BackendKind::CUDA;
  go.cuda_ops = table ? table : &mpq::cuda::host_ops_table();
  go.cuda_memory = &mem;
  train::Autograd dev(model, go);
  REQUIRE(dev.parameters().size() == cpu.parameters().size());
  REQUIRE_FALSE(cpu.parameters().empty());

  const std::vector<Tensor> out_c = cpu.forward(feeds), out_d = dev.forward(feeds);
  REQUIRE(out_c.size() == out_d.size());
  std::vector<Tensor> dy;
  for (size_t j = 0; j < out_c.size(); ++j) {
    INFO("output " << j);
    CHECK(rel_l2(out_d[j], out_c[j]) < 1e-5);
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
  for (const char* op : {"Conv", "Gemm", "MatMul", "Add", "Mul", "Relu", "HardSwish", "GlobalAveragePool", "Softmax", "FakeQuant"}) {
    if (!ops_in_model.count(op)) continue;
    INFO("op " << op);
    CHECK_FALSE(fell_back.count(std::string(op) + " (backward)"));
    if (!(table && std::string(op) == "Conv")) CHECK_FALSE(fell_back.count(op));
  }
  if (table && ops_in_model.count("Conv")) CHECK(fell_back.count("Conv"));
  REQUIRE(dev.state().size() == cpu.state().size());
  for (size_t k = 0; k < cpu.state().size(); ++k) {
    INFO("running state " << cpu.state()[k].name);
    CHECK(rel_l2(dev.state()[k].value, cpu.state()[k].value) < 1e-5);
  }
}

}  // namespace

TEST_CASE("device-mode autograd matches the CPU engine on whole models", "[cuda][host_bodies][train]") {
  SECTION("FP32 models, eval and training mode (BatchNorm's batch statistics on the CPU with copies)") {
    uint32_t seed = 1;
    for (const char* name : {"resnet_bn_op17.onnx", "mobilenetv3_op17.onnx", "transformer_op17.onnx"})
      for (bool training : {false, true}) {
        INFO(name << (training ? " training" : " eval"));
        compare_engines(test::load_test_model(name), training, seed++);
      }
  }
  SECTION("FakeQuant students (weights, activations and step sizes trained)") {
    uint32_t seed = 20;
    for (const char* stem : {"resnet_bn_op13", "mobilenetv3_op17"}) {
      INFO(stem);
      compare_engines(fake_quant_student(stem), false, seed++, 0.25);
    }
  }
}

TEST_CASE("device-mode autograd with the convolution forward declined: nodes fall back to the CPU, students agree closely",
          "[cuda][host_bodies][train]") {
  // Convolutions whose forward library call declines (NOT_SUPPORTED) run their CPU kernels with
  // copies; their backward stays on the device. With the CPU's own forward sums, no value
  // lands on the other side of a FakeQuant rounding boundary, so students agree as FP32 graphs do.
  mpq::cuda::OpsTable declining = mpq::cuda::host_ops_table();
  declining.conv_forward = [](const rt::cuda_plan::ConvPlan&, const float*, const float*, float*, void*, size_t,
                              const mpq::cuda::LaunchCtx&) {
    return mpq::cuda::LibStatus{2, mpq::cuda::kCudnnStatusNotSupported, "cudnnConvolutionForward"};
  };
  uint32_t seed = 40;
  for (const char* stem : {"resnet_bn_op13", "mobilenetv3_op17"}) {
    INFO(stem);
    compare_engines(fake_quant_student(stem), false, seed++, 1e-4, &declining);
  }
}

TEST_CASE("device-mode autograd refuses what it does not train", "[cuda][host_bodies][train]") {
  ir::Model model = test::load_test_model("resnet_bn_op17.onnx");
  HostMemory mem;
  train::AutogradOptions o;
  o.device = rt::BackendKind::CUDA;
  o.cuda_ops = &mpq::cuda::host_ops_table();
  o.cuda_memory = &mem;
  SECTION("mixed precision") {
    o.amp = train::Amp::Fp16;
    CHECK_THROWS_WITH(train::Autograd(model, o), Catch::Contains("mixed precision on the GPU"));
  }
  SECTION("a model with FP16 values") {
    ir::Value* w = nullptr;
    for (ir::Value* v : model.graph->initializers())
      if (v->initializer().dtype() == DType::Float32 && v->initializer().numel() > 1) {
        w = v;
        break;
      }
    REQUIRE(w);
    model.graph->set_initializer(w, w->initializer().cast_to(DType::Float16));
    CHECK_THROWS_WITH(train::Autograd(model, o), Catch::Contains("FP32 models only") && Catch::Contains(w->name()));
  }
}

TEST_CASE("device-mode training steps follow the CPU engine's", "[cuda][host_bodies][train]") {
  // The parameters live on the host and are uploaded every forward: a device engine that kept a
  // stale copy would fall behind the CPU's losses from the second step on.
  const ir::Model model = test::load_test_model("resnet_bn_op17.onnx");
  const rt::Feeds feeds = test::random_feeds(model, 7);
  std::vector<std::vector<Tensor>> finals;
  std::vector<double> last_loss;
  for (bool on_device : {false, true}) {
    HostMemory mem;
    train::AutogradOptions o;
    o.threads = 1;
    o.training = false;
    if (on_device) {
      o.device = rt::BackendKind::CUDA;
      o.cuda_ops = &mpq::cuda::host_ops_table();
      o.cuda_memory = &mem;
    }
    train::Autograd engine(model, o);
    std::vector<size_t> all;
    for (size_t k = 0; k < engine.parameters().size(); ++k) all.push_back(k);
    auto opt = train::make_adamw({train::ParamGroup{"all", all, 1.0, 0.0, false}});
    train::GradScaler scaler(train::GradScalerOptions{65536.0, 2.0, 0.5, 2000, false});
    train::Trainer trainer(engine, *opt, scaler, train::LrSchedule{1e-3, 0, 4}, 1.0);
    const std::vector<Tensor> target = train::Autograd(model, {}).forward(feeds);
    double loss = 0;
    for (int s = 0; s < 4; ++s) {
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
      loss = r.loss;
    }
    last_loss.push_back(loss);
    std::vector<Tensor> w;
    for (const train::Parameter& p : engine.parameters()) w.push_back(p.value.clone());
    finals.push_back(w);
  }
  CHECK(last_loss[1] == Approx(last_loss[0]).epsilon(1e-5));
  for (size_t k = 0; k < finals[0].size(); ++k) CHECK(rel_l2(finals[1][k], finals[0][k]) < 1e-4);
}
