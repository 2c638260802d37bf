// The training engine itself (train/autograd.h): gradients of parameters through fan-out against
// float64 finite differences, no gradient work off the path to the loss, a clear error for an op
// without a backward, memory released after last use, mixed precision as PyTorch's autocast and
// GradScaler do it (real FP16 rounding: underflow without scaling, skipped overflow steps), and
// bit-identical training at any thread count.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "runtime/executor.h"
#include "test_util.h"
#include "train/autograd.h"
#include "train/trainer.h"

using namespace mpq;
using namespace mpq::train;

namespace {

// x [4, 6] -> MatMul W1 [6, 5] -> (+ b1 [5]) -> h; out = MatMul(h, W2 [5, 3]) + MatMul(h, W3 [5, 3]) * 0.5
// (h fans out to two consumers, W1 reaches the loss through both).
ir::Model mlp(DType type) {
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph& g = *m.graph;
  ir::Value* x = g.add_value("x", ir::ValueType::tensor(type, Shape{4, 6}));
  g.add_input(x);
  auto init = [&](const std::string& name, Shape s, uint32_t seed) {
    return g.add_initializer(name, test::random_tensor(s, seed, -0.8f, 0.8f).cast_to(type));
  };
  ir::Value* w1 = init("W1", {6, 5}, 1);
  ir::Value* b1 = init("b1", {5}, 2);
  ir::Value* w2 = init("W2", {5, 3}, 3);
  ir::Value* w3 = init("W3", {5, 3}, 4);
  ir::Value* half = g.add_initializer("half", Tensor::scalar<float>(0.5f).cast_to(type));
  ir::Value* a = g.add_node_with_new_outputs("MatMul", {x, w1}, 1, "a")->output(0);
  ir::Value* h = g.add_node_with_new_outputs("Add", {a, b1}, 1, "h")->output(0);
  ir::Value* y2 = g.add_node_with_new_outputs("MatMul", {h, w2}, 1, "y2")->output(0);
  ir::Value* y3 = g.add_node_with_new_outputs("MatMul", {h, w3}, 1, "y3")->output(0);
  ir::Value* y3h = g.add_node_with_new_outputs("Mul", {y3, half}, 1, "y3h")->output(0);
  ir::Value* out = g.add_value("out");
  g.add_node("Add", {y2, y3h}, {out});
  g.add_output(out);
  return m;
}

rt::Feeds feed(DType type, uint32_t seed = 9) { return {{"x", test::random_tensor({4, 6}, seed).cast_to(type)}}; }

LossOutput mse_to(const Tensor& target, const std::vector<Tensor>& outs) {
  LossResult r = mse(outs[0], target);
  return {r.value, {r.grad}};
}

}  // namespace

TEST_CASE("Parameter gradients through fan-out match float64 finite differences", "[train][autograd]") {
  const ir::Model m = mlp(DType::Float64);
  AutogradOptions o;
  o.threads = 3;
  Autograd engine(m, o);
  std::vector<std::string> names;
  for (const Parameter& p : engine.parameters()) names.push_back(p.name);
  // The scalar 0.5 is a constant, not a parameter.
  CHECK(names == std::vector<std::string>{"W1", "b1", "W2", "W3"});
  const Tensor r = test::random_tensor({4, 3}, 77).cast_to(DType::Float64);
  auto loss = [&](const std::vector<Tensor>& outs) {
    double l = 0;
    for (int64_t i = 0; i < outs[0].numel(); ++i) l += outs[0].data<double>()[i] * r.data<double>()[i];
    return l;
  };
  const rt::Feeds f = feed(DType::Float64);
  engine.forward(f);
  engine.backward({r});
  for (Parameter& p : engine.parameters()) {
    INFO(p.name);
    const Tensor analytic = p.grad.clone();
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      double* w = p.value.data<double>() + i;
      const double keep = *w;
      *w = keep + 1e-6;
      const double lp = loss(engine.forward(f));
      *w = keep - 1e-6;
      const double lm = loss(engine.forward(f));
      *w = keep;
      CHECK(analytic.data<double>()[i] == Approx((lp - lm) / 2e-6).epsilon(1e-7).margin(1e-9));
    }
  }
  // A second backward accumulates until zero_grad.
  engine.forward(f);
  engine.backward({r});
  const Tensor twice = engine.parameters()[0].grad.clone();
  engine.zero_grad();
  engine.forward(f);
  engine.backward({r});
  CHECK(test::max_abs_diff(twice, engine.parameters()[0].grad) > 0);
  for (int64_t i = 0; i < twice.numel(); ++i)
    CHECK(twice.data<double>()[i] == Approx(2 * engine.parameters()[0].grad.data<double>()[i]));
}

TEST_CASE("Shape arithmetic is left alone; an op without a backward on the path is an error", "[train][autograd]") {
  // y = Reshape(MatMul(x, W), Shape(x) * [1, 0] - [0, 1]): the integer branch has no backward
  // kernels and needs none (Mul and Sub have backwards, but integers carry no gradient).
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph& g = *m.graph;
  ir::Value* x = g.add_value("x", ir::ValueType::tensor(DType::Float32, Shape{2, 3}));
  g.add_input(x);
  ir::Value* w = g.add_initializer("W", test::random_tensor({3, 4}, 5));
  ir::Value* xw = g.add_node_with_new_outputs("MatMul", {x, w}, 1, "xw")->output(0);
  ir::Value* shape = g.add_node_with_new_outputs("Shape", {x}, 1, "shape")->output(0);
  // [2, 3] * [1, 0] - [0, 1] = [2, -1]
  ir::Value* keep_batch = g.add_node_with_new_outputs("Mul", {shape, g.add_initializer("mask", Tensor::from<int64_t>({2}, {1, 0}))}, 1, "kb")->output(0);
  ir::Value* target = g.add_node_with_new_outputs("Sub", {keep_batch, g.add_initializer("one", Tensor::from<int64_t>({2}, {0, 1}))}, 1, "target")->output(0);
  ir::Value* y = g.add_value("y");
  g.add_node("Reshape", {xw, target}, {y}, "reshape");
  g.add_output(y);
  // Without Reshape's backward (another family) this model cannot train; with a gradient-free
  // consumer of x only it can: check the error names the node.
  const GradRegistry& grads = GradRegistry::global();
  if (!grads.find("", "Reshape", 17, rt::BackendKind::CPU)) {
    CHECK_THROWS_WITH(Autograd(m), Catch::Contains("reshape") && Catch::Contains("no backward"));
  } else {
    Autograd engine(m);
    engine.forward({{"x", test::random_tensor({2, 3}, 6)}});
    engine.backward({test::random_tensor({2, 4}, 7)});
    CHECK(engine.parameters().size() == 1);
  }
  // LpNormalization has a forward kernel but no backward: a clear error naming the node.
  ir::Model n;
  n.set_opset("", 17);
  ir::Graph& h = *n.graph;
  ir::Value* a = h.add_value("a", ir::ValueType::tensor(DType::Float32, Shape{2, 3}));
  h.add_input(a);
  ir::Value* b = h.add_node_with_new_outputs("MatMul", {a, h.add_initializer("W", test::random_tensor({3, 3}, 8))}, 1, "b")->output(0);
  ir::Value* c = h.add_value("c");
  h.add_node("LpNormalization", {b}, {c}, "lpnorm");
  h.add_output(c);
  CHECK_THROWS_WITH(Autograd(n), Catch::Contains("lpnorm") && Catch::Contains("no backward"));
  try {
    Autograd bad(n);
  } catch (const Error& e) {
    CHECK(e.exit_code() == 2);
  }
}

TEST_CASE("Activations are released after their last use", "[train][autograd]") {
  // A chain of 24 Adds saves nothing for the backward; a chain of 24 Muls saves every input.
  auto chain = [](const char* op) {
    ir::Model m;
    m.set_opset("", 17);
    ir::Graph& g = *m.graph;
    ir::Value* v = g.add_value("x", ir::ValueType::tensor(DType::Float32, Shape{256, 256}));
    g.add_input(v);
    for (int i = 0; i < 24; ++i) {
      ir::Value* p = g.add_initializer("p" + std::to_string(i), test::random_tensor({256}, 10 + i, 0.9f, 1.1f));
      v = g.add_node_with_new_outputs(op, {v, p}, 1, "v" + std::to_string(i))->output(0);
    }
    g.add_output(v);
    return m;
  };
  const int64_t act = 256 * 256 * 4;
  size_t peak[2];
  int k = 0;
  for (const char* op : {"Add", "Mul"}) {
    const ir::Model m = chain(op);
    Autograd engine(m);
    engine.forward({{"x", test::random_tensor({256, 256}, 1)}});
    engine.backward({test::random_tensor({256, 256}, 2)});
    peak[k++] = engine.memory().peak_step_bytes;
    CHECK(engine.memory().persistent_bytes == 24 * 256 * 4 * 2);
  }
  INFO("peak bytes: Add chain " << peak[0] << ", Mul chain " << peak[1]);
  CHECK(peak[0] <= static_cast<size_t>(6 * act));
  CHECK(peak[1] >= static_cast<size_t>(24 * act));
}

TEST_CASE("Autocast follows the precision policy and keeps FP32 master weights", "[train][amp]") {
  const ir::Model m = mlp(DType::Float32);
  AutogradOptions o;
  o.amp = Amp::Fp16;
  Autograd engine(m, o);
  const std::vector<Tensor> outs = engine.forward(feed(DType::Float32));
  // MatMul runs in FP16; Add of an FP16 activation and an FP32 bias vector takes the widest type;
  // the final Add of FP16 (y2) and FP16 (y3 * 0.5: the scalar does not promote) stays FP16.
  CHECK(outs[0].dtype() == DType::Float16);
  engine.backward({Tensor::zeros(DType::Float32, {4, 3})});
  for (const Parameter& p : engine.parameters()) {
    CHECK(p.value.dtype() == DType::Float32);
    CHECK(p.grad.dtype() == DType::Float32);
  }
  AutocastDecision d;
  ir::Model probe;
  ir::Node* pow = probe.graph->add_node("Pow", {}, {}, "p");
  const Tensor h = Tensor::zeros(DType::Float16, {3}), f = Tensor::zeros(DType::Float32, {3});
  d = autocast(*pow, {&h, &f}, Amp::Fp16);
  CHECK(d.compute == DType::Float32);  // exp/log/pow stay in FP32
  CHECK(d.cast_input == std::vector<char>{1, 0});
  ir::Node* add = probe.graph->add_node("Add", {}, {}, "a");
  d = autocast(*add, {&h, &f}, Amp::Fp16);
  CHECK(d.compute == DType::Float32);  // widest wins
  const Tensor s = Tensor::scalar<float>(2.0f);
  d = autocast(*add, {&h, &s}, Amp::Fp16);
  CHECK(d.compute == DType::Float16);  // single-element constants do not promote
  CHECK(d.cast_input == std::vector<char>{0, 0});
  ir::Node* gemm = probe.graph->add_node("Gemm", {}, {}, "g");
  d = autocast(*gemm, {&f, &f, &f}, Amp::Bf16);
  CHECK(d.compute == DType::BFloat16);
  CHECK(d.cast_input == std::vector<char>{1, 1, 1});
  CHECK(autocast(*gemm, {&f, &f}, Amp::Off).compute == DType::Undefined);
}

TEST_CASE("FP16 gradients underflow without loss scaling and train with it", "[train][amp]") {
  // Loss = 1e-8 * MSE: dL/dout is around 3e-9, below FP16's smallest subnormal (6e-8), so in FP16 it
  // flushes to zero unless it is scaled (x 2^16 gives about 2e-4).
  const ir::Model m = mlp(DType::Float32);
  const Tensor target = test::random_tensor({4, 3}, 31, -2, 2);
  auto tiny_mse = [&](const std::vector<Tensor>& outs) {
    LossOutput l = mse_to(target, outs);
    l.value *= 1e-8;
    float* g = l.output_grads[0].data<float>();
    for (int64_t i = 0; i < 12; ++i) g[i] *= 1e-8f;
    return l;
  };
  auto train = [&](bool scaling, double* first, double* last) {
    AutogradOptions o;
    o.amp = Amp::Fp16;
    Autograd engine(m, o);
    auto opt = make_sgd({ParamGroup{"all", {0, 1, 2, 3}, 1.0, 0.0, false}}, {0.0, 0.0, false});
    GradScalerOptions so;
    so.enabled = scaling;
    GradScaler scaler(so);
    Trainer trainer(engine, *opt, scaler, LrSchedule{2e7, 0, 100, 2e7});
    const Tensor w0 = engine.parameters()[0].value.clone();
    for (int s = 0; s < 20; ++s) {
      const StepResult r = trainer.step(feed(DType::Float32), tiny_mse);
      if (s == 0) *first = r.loss;
      *last = r.loss;
      CHECK_FALSE(r.skipped);
    }
    return test::max_abs_diff(w0, engine.parameters()[0].value);
  };
  double f0, l0, f1, l1;
  CHECK(train(false, &f0, &l0) == 0.0);  // every FP16 gradient was zero: nothing moved
  CHECK(l0 == Approx(f0));
  CHECK(train(true, &f1, &l1) > 0.0);
  CHECK(l1 < 0.5 * f1);  // the scaled run learns
}

TEST_CASE("An overflowing FP16 step is skipped and the scale halves", "[train][amp]") {
  const ir::Model m = mlp(DType::Float32);
  AutogradOptions o;
  o.amp = Amp::Fp16;
  Autograd engine(m, o);
  auto opt = make_adamw({ParamGroup{"all", {0, 1, 2, 3}, 1.0, 0.01, false}});
  GradScalerOptions so;
  so.init_scale = 16777216.0;  // 2^24: gradients of order 1 overflow FP16's 65504
  GradScaler scaler(so);
  Trainer trainer(engine, *opt, scaler, LrSchedule{1e-2, 0, 100});
  const Tensor target = test::random_tensor({4, 3}, 32, -2, 2);
  const Tensor w0 = engine.parameters()[0].value.clone();
  const StepResult r = trainer.step(feed(DType::Float32), [&](const std::vector<Tensor>& outs) { return mse_to(target, outs); });
  CHECK(r.skipped);
  CHECK(r.loss_scale == 16777216.0);
  CHECK(scaler.scale() == 8388608.0);
  CHECK(test::max_abs_diff(w0, engine.parameters()[0].value) == 0.0);
  CHECK(opt->steps() == 0);
  // The scale keeps halving until the gradients fit, then steps go through.
  int skipped = 1;
  for (int s = 0; s < 12; ++s)
    skipped += trainer.step(feed(DType::Float32), [&](const std::vector<Tensor>& outs) { return mse_to(target, outs); }).skipped;
  CHECK(skipped < 13);
  CHECK(opt->steps() == 13 - skipped);
  CHECK(test::max_abs_diff(w0, engine.parameters()[0].value) > 0.0);
}

TEST_CASE("Training is bit-identical at any thread count, in FP32 and under AMP", "[train][determinism]") {
  const ir::Model m = mlp(DType::Float32);
  const Tensor target = test::random_tensor({4, 3}, 33, -2, 2);
  for (Amp amp : {Amp::Off, Amp::Fp16, Amp::Bf16}) {
    std::vector<std::vector<Tensor>> finals;
    for (int threads : {1, 2, 3}) {
      AutogradOptions o;
      o.threads = threads;
      o.amp = amp;
      Autograd engine(m, o);
      auto opt = make_adamw({ParamGroup{"all", {0, 1, 2, 3}, 1.0, 0.01, false}});
      GradScaler scaler(GradScalerOptions{65536.0, 2.0, 0.5, 2000, amp == Amp::Fp16});
      Trainer trainer(engine, *opt, scaler, LrSchedule{1e-2, 2, 10}, 1.0);
      for (int s = 0; s < 6; ++s)
        trainer.step(feed(DType::Float32, 40 + s), [&](const std::vector<Tensor>& outs) { return mse_to(target, outs); });
      std::vector<Tensor> w;
      for (const Parameter& p : engine.parameters()) w.push_back(p.value.clone());
      finals.push_back(w);
    }
    INFO("amp " << amp_name(amp));
    for (size_t t = 1; t < finals.size(); ++t)
      for (size_t k = 0; k < finals[0].size(); ++k)
        CHECK(std::memcmp(finals[0][k].raw_data(), finals[t][k].raw_data(), finals[0][k].nbytes()) == 0);
  }
}

TEST_CASE("write_back stores trained values into the model", "[train][autograd]") {
  ir::Model m = mlp(DType::Float32);
  Autograd engine(m);
  engine.parameters()[0].value.data<float>()[0] = 123.0f;
  ir::Model copy = m.clone();
  engine.write_back(copy);
  CHECK(copy.graph->find("W1")->initializer().data<float>()[0] == 123.0f);
  CHECK(m.graph->find("W1")->initializer().data<float>()[0] != 123.0f);
}

TEST_CASE("Large GEMMs (inner dimensions past OpenBLAS's blocking) train bit-identically at any thread count",
          "[train][determinism]") {
  // OpenBLAS rounds a long inner dimension differently on one thread and on several, and differently
  // again for other row splits: the engine's DeterministicBlas scope must hide both.
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph& g = *m.graph;
  ir::Value* x = g.add_value("x", ir::ValueType::tensor(DType::Float32, Shape{200, 700}));
  g.add_input(x);
  ir::Value* w1 = g.add_initializer("W1", test::random_tensor({700, 300}, 1, -0.05f, 0.05f));
  ir::Value* b1 = g.add_initializer("b1", test::random_tensor({300}, 2));
  ir::Value* w2 = g.add_initializer("W2", test::random_tensor({300, 520}, 3, -0.05f, 0.05f));
  ir::Value* h = g.add_node_with_new_outputs("Gemm", {x, w1, b1}, 1, "h")->output(0);
  ir::Value* y = g.add_value("y");
  g.add_node("MatMul", {h, w2}, {y});
  g.add_output(y);
  const Tensor target = test::random_tensor({200, 520}, 4);
  std::vector<std::vector<Tensor>> finals;
  for (int threads : {1, 2, 3}) {
    AutogradOptions o;
    o.threads = threads;
    Autograd engine(m, o);
    auto opt = make_sgd({ParamGroup{"all", {0, 1, 2}, 1.0, 0.0, false}});
    GradScaler scaler(GradScalerOptions{65536.0, 2.0, 0.5, 2000, false});
    Trainer trainer(engine, *opt, scaler, LrSchedule{1e-2, 0, 3});
    for (int s = 0; s < 3; ++s)
      trainer.step({{"x", test::random_tensor({200, 700}, 50 + s)}}, [&](const std::vector<Tensor>& outs) { return mse_to(target, outs); });
    std::vector<Tensor> w;
    for (const Parameter& p : engine.parameters()) w.push_back(p.value.clone());
    finals.push_back(w);
  }
  for (size_t t = 1; t < finals.size(); ++t)
    for (size_t k = 0; k < finals[0].size(); ++k)
      CHECK(std::memcmp(finals[0][k].raw_data(), finals[t][k].raw_data(), finals[0][k].nbytes()) == 0);
}
