// RNN, GRU and LSTM against a naive per-element reference written from the ONNX equations:
// directions, layouts, sequence_lens, initial states, peepholes, clip, custom activations,
// linear_before_reset, input_forget; plus negative tests for malformed attributes and shapes.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <random>

#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

std::vector<Tensor> run_node(const std::string& op, const std::vector<Tensor>& inputs, size_t num_outputs,
                             std::vector<ir::Attribute> attrs, int opset = 14) {
  return test::run_node(op, inputs, attrs, num_outputs, opset, /*threads=*/0);
}

using Fn = std::function<double(double)>;

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

struct Spec {
  std::string op;  // RNN, GRU, LSTM
  int64_t S = 4, B = 3, I = 5, H = 6;
  std::string direction = "forward";
  int layout = 0;
  bool bias = true, seq_lens = false, init = false, peep = false;
  float clip = 0.0f;
  bool lbr = false, input_forget = false;
  std::vector<std::string> acts;  // per direction list as given to the node (empty: defaults)
  std::vector<float> alphas, betas;
};

int gates_of(const std::string& op) { return op == "RNN" ? 1 : op == "GRU" ? 3 : 4; }

// Activation functions of one direction from the spec, with the same alpha/beta consumption rule.
std::vector<Fn> act_fns(const Spec& s, int dir) {
  std::vector<std::string> names = s.acts;
  const size_t per = s.op == "RNN" ? 1 : s.op == "GRU" ? 2 : 3;
  if (names.empty()) {
    if (s.op == "RNN") names = {"Tanh"};
    if (s.op == "GRU") names = {"Sigmoid", "Tanh"};
    if (s.op == "LSTM") names = {"Sigmoid", "Tanh", "Tanh"};
    if (s.direction == "bidirectional") {
      const std::vector<std::string> once = names;
      names.insert(names.end(), once.begin(), once.end());
    }
  }
  size_t ai = 0, bi = 0;
  std::vector<Fn> all;
  for (const std::string& n : names) {
    if (n == "Tanh") all.push_back([](double x) { return std::tanh(x); });
    else if (n == "Sigmoid") all.push_back(sigmoid);
    else if (n == "Relu") all.push_back([](double x) { return x > 0 ? x : 0; });
    else if (n == "LeakyRelu") {
      double a = s.alphas.at(ai++);
      all.push_back([a](double x) { return x >= 0 ? x : a * x; });
    } else if (n == "HardSigmoid") {
      double a = s.alphas.at(ai++), b = s.betas.at(bi++);
      all.push_back([a, b](double x) { return std::max(0.0, std::min(1.0, a * x + b)); });
    } else if (n == "ScaledTanh") {
      double a = s.alphas.at(ai++), b = s.betas.at(bi++);
      all.push_back([a, b](double x) { return a * std::tanh(b * x); });
    } else if (n == "Softsign") all.push_back([](double x) { return x / (1 + std::abs(x)); });
    else FAIL("test reference lacks activation " << n);
  }
  return std::vector<Fn>(all.begin() + static_cast<long>(per) * dir, all.begin() + static_cast<long>(per) * (dir + 1));
}

struct Inputs {
  Tensor X, W, R, Bias, lens, h0, c0, P;
};

Inputs make_inputs(const Spec& s, uint32_t seed) {
  const int64_t D = s.direction == "bidirectional" ? 2 : 1, G = gates_of(s.op);
  Inputs in;
  in.X = test::random_tensor(s.layout == 0 ? Shape{s.S, s.B, s.I} : Shape{s.B, s.S, s.I}, seed, -1.5f, 1.5f);
  in.W = test::random_tensor({D, G * s.H, s.I}, seed + 1, -0.6f, 0.6f);
  in.R = test::random_tensor({D, G * s.H, s.H}, seed + 2, -0.6f, 0.6f);
  if (s.bias) in.Bias = test::random_tensor({D, 2 * G * s.H}, seed + 3, -0.5f, 0.5f);
  if (s.seq_lens) {
    std::vector<int32_t> l;
    for (int64_t b = 0; b < s.B; ++b) l.push_back(static_cast<int32_t>(b % 2 == 0 ? s.S : std::max<int64_t>(1, s.S - 1 - b)));
    in.lens = Tensor::from<int32_t>({s.B}, l);
  }
  const Shape st = s.layout == 0 ? Shape{D, s.B, s.H} : Shape{s.B, D, s.H};
  if (s.init) {
    in.h0 = test::random_tensor(st, seed + 4, -0.8f, 0.8f);
    if (s.op == "LSTM") in.c0 = test::random_tensor(st, seed + 5, -0.8f, 0.8f);
  }
  if (s.peep) in.P = test::random_tensor({D, 3 * s.H}, seed + 6, -0.5f, 0.5f);
  return in;
}

struct RefOut {
  std::vector<double> Y, Yh, Yc;
};

RefOut reference(const Spec& s, const Inputs& in) {
  const int64_t D = s.direction == "bidirectional" ? 2 : 1, G = gates_of(s.op), S = s.S, B = s.B, I = s.I, H = s.H;
  RefOut r;
  r.Y.assign(static_cast<size_t>(S * D * B * H), 0.0);
  r.Yh.assign(static_cast<size_t>(D * B * H), 0.0);
  r.Yc.assign(static_cast<size_t>(D * B * H), 0.0);
  auto X = [&](int64_t t, int64_t b, int64_t i) {
    return static_cast<double>(in.X.data<float>()[s.layout == 0 ? (t * B + b) * I + i : (b * S + t) * I + i]);
  };
  auto st_idx = [&](int64_t d, int64_t b, int64_t j) { return s.layout == 0 ? (d * B + b) * H + j : (b * D + d) * H + j; };
  auto y_idx = [&](int64_t t, int64_t d, int64_t b, int64_t j) {
    return s.layout == 0 ? ((t * D + d) * B + b) * H + j : ((b * S + t) * D + d) * H + j;
  };
  auto clip = [&](double v) { return s.clip > 0 ? std::max(-static_cast<double>(s.clip), std::min(static_cast<double>(s.clip), v)) : v; };
  for (int64_t d = 0; d < D; ++d) {
    const bool rev = s.direction == "reverse" || d == 1;
    std::vector<Fn> f = act_fns(s, static_cast<int>(d));
    const float* W = in.W.data<float>() + d * G * H * I;
    const float* R = in.R.data<float>() + d * G * H * H;
    const float* Wb = in.Bias.defined() ? in.Bias.data<float>() + d * 2 * G * H : nullptr;
    const float* P = in.P.defined() ? in.P.data<float>() + d * 3 * H : nullptr;
    auto wb = [&](int64_t k) { return Wb ? static_cast<double>(Wb[k]) : 0.0; };
    auto rb = [&](int64_t k) { return Wb ? static_cast<double>(Wb[G * H + k]) : 0.0; };
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = in.lens.defined() ? in.lens.data<int32_t>()[b] : S;
      std::vector<double> h(static_cast<size_t>(H), 0.0), c(static_cast<size_t>(H), 0.0);
      for (int64_t j = 0; j < H; ++j) {
        if (in.h0.defined()) h[static_cast<size_t>(j)] = in.h0.data<float>()[st_idx(d, b, j)];
        if (in.c0.defined()) c[static_cast<size_t>(j)] = in.c0.data<float>()[st_idx(d, b, j)];
      }
      for (int64_t step = 0; step < len; ++step) {
        const int64_t t = rev ? len - 1 - step : step;
        // xw[k] = X W^T + Wb, hr[k] = H R^T (k over all gate rows).
        std::vector<double> xw(static_cast<size_t>(G * H)), hr(static_cast<size_t>(G * H));
        for (int64_t k = 0; k < G * H; ++k) {
          double a = wb(k), e = 0.0;
          for (int64_t i = 0; i < I; ++i) a += X(t, b, i) * W[k * I + i];
          for (int64_t j = 0; j < H; ++j) e += h[static_cast<size_t>(j)] * R[k * H + j];
          xw[static_cast<size_t>(k)] = a;
          hr[static_cast<size_t>(k)] = e;
        }
        std::vector<double> hn(static_cast<size_t>(H));
        if (s.op == "RNN") {
          for (int64_t j = 0; j < H; ++j) hn[static_cast<size_t>(j)] = f[0](clip(xw[static_cast<size_t>(j)] + hr[static_cast<size_t>(j)] + rb(j)));
        } else if (s.op == "GRU") {
          std::vector<double> z(static_cast<size_t>(H)), rr(static_cast<size_t>(H));
          for (int64_t j = 0; j < H; ++j) {
            z[static_cast<size_t>(j)] = f[0](clip(xw[static_cast<size_t>(j)] + hr[static_cast<size_t>(j)] + rb(j)));
            rr[static_cast<size_t>(j)] = f[0](clip(xw[static_cast<size_t>(H + j)] + hr[static_cast<size_t>(H + j)] + rb(H + j)));
          }
          for (int64_t j = 0; j < H; ++j) {
            double pre;
            if (s.lbr) {
              pre = xw[static_cast<size_t>(2 * H + j)] + rr[static_cast<size_t>(j)] * (hr[static_cast<size_t>(2 * H + j)] + rb(2 * H + j));
            } else {
              double e = 0.0;
              for (int64_t q = 0; q < H; ++q) e += rr[static_cast<size_t>(q)] * h[static_cast<size_t>(q)] * R[(2 * H + j) * H + q];
              pre = xw[static_cast<size_t>(2 * H + j)] + e + rb(2 * H + j);
            }
            const double hh = f[1](clip(pre));
            hn[static_cast<size_t>(j)] = (1 - z[static_cast<size_t>(j)]) * hh + z[static_cast<size_t>(j)] * h[static_cast<size_t>(j)];
          }
        } else {
          for (int64_t j = 0; j < H; ++j) {
            auto g = [&](int64_t gate) {
              const size_t k = static_cast<size_t>(gate * H + j);
              return xw[k] + hr[k] + rb(gate * H + j);
            };
            const double cp = c[static_cast<size_t>(j)];
            const double i_ = f[0](clip(g(0) + (P ? P[j] * cp : 0.0)));
            const double f_ = s.input_forget ? 1 - i_ : f[0](clip(g(2) + (P ? P[2 * H + j] * cp : 0.0)));
            const double cc = f[1](clip(g(3)));
            const double cn = f_ * cp + i_ * cc;
            const double o_ = f[0](clip(g(1) + (P ? P[H + j] * cn : 0.0)));
            c[static_cast<size_t>(j)] = cn;
            hn[static_cast<size_t>(j)] = o_ * f[2](cn);
          }
        }
        h = hn;
        for (int64_t j = 0; j < H; ++j) r.Y[static_cast<size_t>(y_idx(t, d, b, j))] = h[static_cast<size_t>(j)];
      }
      for (int64_t j = 0; j < H; ++j) {
        r.Yh[static_cast<size_t>(st_idx(d, b, j))] = h[static_cast<size_t>(j)];
        r.Yc[static_cast<size_t>(st_idx(d, b, j))] = c[static_cast<size_t>(j)];
      }
    }
  }
  return r;
}

double max_diff(const Tensor& t, const std::vector<double>& want) {
  REQUIRE(t.numel() == static_cast<int64_t>(want.size()));
  double m = 0.0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::abs(t.get_double(i) - want[static_cast<size_t>(i)]));
  return m;
}

std::vector<ir::Attribute> attrs_of(const Spec& s) {
  std::vector<ir::Attribute> a = {ir::Attribute::make_int("hidden_size", s.H), ir::Attribute::make_string("direction", s.direction)};
  if (s.layout) a.push_back(ir::Attribute::make_int("layout", s.layout));
  if (s.clip > 0) a.push_back(ir::Attribute::make_float("clip", s.clip));
  if (s.lbr) a.push_back(ir::Attribute::make_int("linear_before_reset", 1));
  if (s.input_forget) a.push_back(ir::Attribute::make_int("input_forget", 1));
  if (!s.acts.empty()) {
    ir::Attribute at;
    at.name = "activations";
    at.type = ir::AttrType::Strings;
    at.strings = s.acts;
    a.push_back(at);
  }
  if (!s.alphas.empty()) a.push_back(ir::Attribute::make_floats("activation_alpha", s.alphas));
  if (!s.betas.empty()) a.push_back(ir::Attribute::make_floats("activation_beta", s.betas));
  return a;
}

void check_spec(const Spec& s, uint32_t seed) {
  INFO(s.op << " dir " << s.direction << " layout " << s.layout << " seq_lens " << s.seq_lens << " init " << s.init
            << " peep " << s.peep << " clip " << s.clip << " lbr " << s.lbr);
  Inputs in = make_inputs(s, seed);
  std::vector<Tensor> ins = {in.X, in.W, in.R, in.Bias, in.lens, in.h0};
  if (s.op == "LSTM") {
    ins.push_back(in.c0);
    ins.push_back(in.P);
  }
  while (!ins.back().defined()) ins.pop_back();
  const size_t nout = s.op == "LSTM" ? 3 : 2;
  auto out = run_node(s.op, ins, nout, attrs_of(s));
  RefOut ref = reference(s, in);
  const int64_t D = s.direction == "bidirectional" ? 2 : 1;
  CHECK(out[0].shape() == (s.layout == 0 ? Shape{s.S, D, s.B, s.H} : Shape{s.B, s.S, D, s.H}));
  CHECK(out[1].shape() == (s.layout == 0 ? Shape{D, s.B, s.H} : Shape{s.B, D, s.H}));
  CHECK(max_diff(out[0], ref.Y) < 2e-5);
  CHECK(max_diff(out[1], ref.Yh) < 2e-5);
  if (s.op == "LSTM") CHECK(max_diff(out[2], ref.Yc) < 2e-5);
}

}  // namespace

TEST_CASE("RNN / GRU / LSTM match the naive reference", "[rnn]") {
  uint32_t seed = 1;
  for (const char* op : {"RNN", "GRU", "LSTM"}) {
    for (const char* dir : {"forward", "reverse", "bidirectional"}) {
      for (int layout : {0, 1}) {
        Spec s;
        s.op = op;
        s.direction = dir;
        s.layout = layout;
        check_spec(s, seed += 10);
        s.seq_lens = true;
        s.init = true;
        s.S = 5;
        s.B = 4;
        s.I = 3;
        s.H = 7;
        check_spec(s, seed += 10);
      }
    }
  }
}

TEST_CASE("RNN variants: no bias, clip, custom activations", "[rnn]") {
  Spec s;
  s.op = "RNN";
  s.bias = false;
  s.clip = 0.4f;
  s.acts = {"LeakyRelu"};
  s.alphas = {0.3f};
  check_spec(s, 500);
  s.direction = "bidirectional";
  s.acts = {"ScaledTanh", "Relu"};
  s.alphas = {1.5f};
  s.betas = {0.7f};
  check_spec(s, 510);
}

TEST_CASE("GRU linear_before_reset and activations", "[rnn]") {
  Spec s;
  s.op = "GRU";
  s.lbr = true;
  s.init = true;
  check_spec(s, 600);
  s.direction = "bidirectional";
  s.seq_lens = true;
  s.layout = 1;
  check_spec(s, 610);
  s.lbr = false;
  s.acts = {"HardSigmoid", "Softsign", "Sigmoid", "Tanh"};
  s.alphas = {0.25f};
  s.betas = {0.45f};
  s.clip = 1.1f;
  check_spec(s, 620);
}

TEST_CASE("LSTM peepholes, input_forget, clip", "[rnn]") {
  Spec s;
  s.op = "LSTM";
  s.peep = true;
  s.init = true;
  check_spec(s, 700);
  s.direction = "bidirectional";
  s.seq_lens = true;
  s.clip = 0.5f;
  check_spec(s, 710);
  s.input_forget = true;
  s.layout = 1;
  s.direction = "reverse";
  check_spec(s, 720);
}

TEST_CASE("RNN ops reject malformed inputs and attributes", "[rnn][negative]") {
  Spec s;
  s.op = "LSTM";
  Inputs in = make_inputs(s, 800);
  auto attrs = attrs_of(s);
  CHECK_NOTHROW(run_node("LSTM", {in.X, in.W, in.R, in.Bias}, 3, attrs));
  // W with the wrong number of gate rows.
  CHECK_THROWS_AS(run_node("LSTM", {in.X, test::random_tensor({1, 3 * s.H, s.I}, 1), in.R}, 3, attrs), Error);
  // Bias of the wrong length.
  CHECK_THROWS_AS(run_node("LSTM", {in.X, in.W, in.R, test::random_tensor({1, 5}, 2)}, 3, attrs), Error);
  // hidden_size disagreeing with R.
  auto bad_h = attrs;
  bad_h[0] = ir::Attribute::make_int("hidden_size", s.H + 1);
  CHECK_THROWS_AS(run_node("LSTM", {in.X, in.W, in.R}, 3, bad_h), Error);
  // Unknown direction and activation.
  auto bad_dir = attrs;
  bad_dir[1] = ir::Attribute::make_string("direction", "sideways");
  CHECK_THROWS_AS(run_node("LSTM", {in.X, in.W, in.R}, 3, bad_dir), Error);
  Spec sa = s;
  sa.acts = {"Sigmoid", "Tanh", "Cube"};
  CHECK_THROWS_AS(run_node("LSTM", {in.X, in.W, in.R}, 3, attrs_of(sa)), Error);
  // sequence_lens longer than the sequence.
  Tensor lens = Tensor::from<int32_t>({s.B}, {1, 2, 99});
  CHECK_THROWS_AS(run_node("LSTM", {in.X, in.W, in.R, in.Bias, lens}, 3, attrs), Error);
  // Rank-2 X.
  CHECK_THROWS_AS(run_node("LSTM", {test::random_tensor({s.S, s.I}, 3), in.W, in.R}, 3, attrs), Error);
}
