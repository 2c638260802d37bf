// Times training steps for scripts/bench_train.py: a benchmark driver, not a test (it is not a
// *_test.cpp, so ctest does not run it). One step = forward, mean cross-entropy, backward, AdamW
// update, as PyTorch's side of the benchmark does it.
//
//   bench_train MODEL IMAGES.npy LABELS.npy --batch B --steps S --warmup W --threads T
//               [--amp off|fp16|bf16] [--eval-mode]
//
// Prints one JSON object: every step's milliseconds, the median, and peak resident memory (VmHWM,
// reset after the warm-up steps through /proc/self/clear_refs) with the resident memory before the
// timed steps, plus the engine's own activation/gradient peak.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "data/npy.h"
#include "ir/onnx_io.h"
#include "train/autograd.h"
#include "train/loss.h"
#include "train/optimizer.h"
#include "train/trainer.h"

using namespace mpq;
using namespace mpq::train;

namespace {

long status_kib(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(std::strlen(key)));
  return -1;
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::cerr << "usage: bench_train MODEL IMAGES.npy LABELS.npy --batch B --steps S --warmup W --threads T [--amp A] [--eval-mode]\n";
    return 2;
  }
  int64_t batch = 64, steps = 20, warmup = 3;
  int threads = 2;
  std::string amp = "off";
  bool training = true;
  for (int i = 4; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--batch") batch = std::stoll(next());
    else if (a == "--steps") steps = std::stoll(next());
    else if (a == "--warmup") warmup = std::stoll(next());
    else if (a == "--threads") threads = std::stoi(next());
    else if (a == "--amp") amp = next();
    else if (a == "--eval-mode") training = false;
  }
  try {
    const ir::Model model = ir::load_model(argv[1]);
    const Tensor images = data::read_npy(argv[2]);
    const Tensor labels_all = data::read_npy(argv[3]).cast_to(DType::Int64);
    const int64_t rows = images.dim(0);
    const size_t row_bytes = images.nbytes() / static_cast<size_t>(rows);
    AutogradOptions o;
    o.threads = threads;
    o.amp = parse_amp(amp);
    o.training = training;
    Autograd engine(model, o);
    std::vector<size_t> all(engine.parameters().size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    auto opt = make_adamw({ParamGroup{"all", all, 1.0, 0.0, false}});
    GradScaler scaler(GradScalerOptions{65536.0, 2.0, 0.5, 2000, o.amp == Amp::Fp16});
    Trainer trainer(engine, *opt, scaler, LrSchedule{1e-4, 0, steps + warmup});
    const std::string input = engine.parameters().empty() ? "input" : model.graph->required_inputs().at(0)->name();
    std::vector<double> ms;
    long rss_before = 0;
    for (int64_t s = 0; s < warmup + steps; ++s) {
      if (s == warmup) {
        rss_before = status_kib("VmRSS:");
        reset_peak_rss();
      }
      Shape shape = images.shape();
      shape[0] = batch;
      Tensor x(images.dtype(), shape);
      Tensor y(DType::Int64, {batch});
      for (int64_t r = 0; r < batch; ++r) {
        const int64_t src = (s * batch + r) % rows;
        std::memcpy(static_cast<char*>(x.raw_data()) + static_cast<size_t>(r) * row_bytes,
                    static_cast<const char*>(images.raw_data()) + static_cast<size_t>(src) * row_bytes, row_bytes);
        y.data<int64_t>()[r] = labels_all.data<int64_t>()[src];
      }
      const auto t0 = std::chrono::steady_clock::now();
      trainer.step({{input, x}}, [&](const std::vector<Tensor>& outs) {
        LossResult l = cross_entropy(outs[0], y);
        return LossOutput{l.value, {l.grad}};
      });
      const double t = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (s >= warmup) ms.push_back(t);
    }
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    std::cout << fmt::format(
        "{{\"median_step_ms\": {:.3f}, \"min_step_ms\": {:.3f}, \"steps_ms\": [{}], \"peak_rss_kib\": {}, \"rss_before_kib\": {}, "
        "\"engine_peak_step_bytes\": {}, \"persistent_bytes\": {}}}\n",
        sorted[sorted.size() / 2], sorted.front(), fmt::join(ms, ", "), status_kib("VmHWM:"), rss_before,
        engine.memory().peak_step_bytes, engine.memory().persistent_bytes);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_train: " << e.what() << "\n";
    return 3;
  }
}
