// Times the backward of one node through the training engine, for scripts/bench_grad_ops.py. Not
// a test (no assertions, timings vary): built beside the tests, never registered with ctest.
//
//   bench_conv_grad OP --x N,C,H,W [--w M,C,KH,KW] [--bias] [--const-x] [--scales 1,1,2,2]
//                   [--attr name=v1,v2 ...] [--opset 17] [--threads 2] [--repeat 20] [--double]
//
// X, W and B are random graph inputs (X an initializer with --const-x, so that no dX is computed,
// as for a network's first layer); --scales gives Resize its (whole-number) scales as an
// initializer, roi omitted. Each repetition runs the forward untimed, then times
// backward() with a random dL/dY. Prints one JSON line: median and best wall time and process CPU
// time of backward() in milliseconds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <time.h>

#include "core/error.h"
#include "ir/graph.h"
#include "train/autograd.h"

using namespace mpq;

namespace {

Shape parse_ints(const std::string& s) {
  Shape v;
  size_t pos = 0;
  while (pos <= s.size()) {
    const size_t comma = s.find(',', pos);
    const std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (!item.empty()) v.push_back(std::stoll(item));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return v;
}

Tensor random_tensor(const Shape& shape, uint32_t seed, bool dbl) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Tensor t(DType::Float32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(rng);
  return dbl ? t.cast_to(DType::Float64) : t;
}

ir::Attribute parse_attr(const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos) fail_input("--attr {}: expected name=value", spec);
  const std::string name = spec.substr(0, eq), value = spec.substr(eq + 1);
  static const char* const kStrings[] = {"auto_pad", "mode", "coordinate_transformation_mode", "nearest_mode"};
  static const char* const kInts[] = {"group", "ceil_mode", "count_include_pad", "storage_order"};
  for (const char* s : kStrings)
    if (name == s) return ir::Attribute::make_string(name, value);
  for (const char* s : kInts)
    if (name == s) return ir::Attribute::make_int(name, std::stoll(value));
  return ir::Attribute::make_ints(name, parse_ints(value));
}

int run(int argc, char** argv) {
  if (argc < 2) fail_input("usage: bench_conv_grad OP --x SHAPE [--w SHAPE] [options]");
  const std::string op = argv[1];
  Shape xs, ws;
  std::vector<float> scales;
  bool bias = false, const_x = false, dbl = false;
  int opset = 17, threads = 2, repeat = 20;
  std::vector<ir::Attribute> attrs;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) fail_input("{} needs a value", a);
      return argv[++i];
    };
    if (a == "--x") xs = parse_ints(next());
    else if (a == "--w") ws = parse_ints(next());
    else if (a == "--bias") bias = true;
    else if (a == "--scales") {
      for (int64_t v : parse_ints(next())) scales.push_back(static_cast<float>(v));
    }
    else if (a == "--const-x") const_x = true;
    else if (a == "--double") dbl = true;
    else if (a == "--attr") attrs.push_back(parse_attr(next()));
    else if (a == "--opset") opset = std::stoi(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--repeat") repeat = std::stoi(next());
    else fail_input("unknown option {}", a);
  }
  ir::Model model;
  model.set_opset("", opset);
  ir::Graph* g = model.graph.get();
  rt::Feeds feeds;
  std::vector<ir::Value*> ins;
  auto add = [&](const std::string& name, const Tensor& t, bool constant) {
    if (constant) {
      ins.push_back(g->add_initializer(name, t));
      return;
    }
    ir::Value* v = g->add_value(name, ir::ValueType::tensor(t.dtype(), t.shape()));
    g->add_input(v);
    ins.push_back(v);
    feeds[name] = t;
  };
  add("x", random_tensor(xs, 1, dbl), const_x);
  if (!ws.empty()) add("w", random_tensor(ws, 2, dbl), false);
  if (bias) add("b", random_tensor({op == "ConvTranspose" ? ws.at(1) : ws.at(0)}, 3, dbl), false);
  if (!scales.empty()) {
    ins.push_back(nullptr);  // roi
    ins.push_back(g->add_initializer("scales", Tensor::from<float>({static_cast<int64_t>(scales.size())}, scales)));
  }
  ir::Value* y = g->add_value("y");
  g->add_output(y);
  ir::Node* n = g->add_node(op, ins, {y}, "bench");
  for (const auto& at : attrs) n->set_attr(at);

  train::AutogradOptions o;
  o.threads = threads;
  o.input_grads = true;
  o.default_parameters = false;
  train::Autograd engine(model, o);
  std::vector<double> ms, cpu_ms;
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  };
  Tensor dy;
  for (int r = 0; r < repeat + 2; ++r) {
    std::vector<Tensor> out = engine.forward(feeds);
    if (!dy.defined()) dy = random_tensor(out.at(0).shape(), 4, dbl);
    const double c0 = cpu_now();
    const auto t0 = std::chrono::steady_clock::now();
    engine.backward({dy});
    const auto t1 = std::chrono::steady_clock::now();
    const double c1 = cpu_now();
    if (r >= 2) {  // two warm-ups
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      cpu_ms.push_back(c1 - c0);
    }
  }
  std::sort(ms.begin(), ms.end());
  std::sort(cpu_ms.begin(), cpu_ms.end());
  std::printf("{\"op\": \"%s\", \"median_ms\": %.4f, \"min_ms\": %.4f, \"cpu_median_ms\": %.4f, \"cpu_min_ms\": %.4f}\n",
              op.c_str(), ms[ms.size() / 2], ms.front(), cpu_ms[cpu_ms.size() / 2], cpu_ms.front());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_conv_grad: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_conv_grad: %s\n", e.what());
    return 2;
  }
}
