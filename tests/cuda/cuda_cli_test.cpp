// Commands with `--device cuda` end to end on this machine: MPQ_CUDA_EMULATE=host makes the CUDA
// path run its kernel bodies on the CPU (the plugin's host kernel table, host memory), so
// calibration and validation through the CUDA path can be compared with the CPU: the same
// verdicts, the same ranges and metrics to float rounding. On a GPU, gpu_check.sh runs the real
// thing.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;

namespace {

fs::path model() { return test::source_dir() / "tests" / "models" / "resnet_bn_op13.onnx"; }
fs::path data() { return test::source_dir() / "tests" / "models" / "resnet_bn_op13_data"; }

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

bool close(double a, double b, double rtol = 1e-5) { return std::fabs(a - b) <= rtol * std::max(1.0, std::fabs(b)); }

struct EmulateCuda {
  EmulateCuda() { ::setenv("MPQ_CUDA_EMULATE", "host", 1); }
  ~EmulateCuda() { ::unsetenv("MPQ_CUDA_EMULATE"); }
};

}  // namespace

TEST_CASE("calibrate and validate through the CUDA path agree with the CPU", "[cuda][cli][host_bodies]") {
  EmulateCuda emulate;
  test::TempDir tmp;
  // Calibration ranges (min/max of every tensor): the same to float rounding.
  for (const char* device : {"cpu", "cuda"}) {
    auto r = test::run_mpq({"calibrate", model().string(), "--data", data().string(), "--device", device, "-o",
                            (tmp / (std::string(device) + ".json")).string()});
    INFO(device << ": " << r.err);
    REQUIRE(r.exit_code == 0);
  }
  const nlohmann::json cpu = read_json(tmp / "cpu.json"), gpu = read_json(tmp / "cuda.json");
  REQUIRE(cpu.contains("tensors"));
  REQUIRE(cpu["tensors"].size() == gpu["tensors"].size());
  REQUIRE(cpu["tensors"].size() > 10);
  for (auto it = cpu["tensors"].begin(); it != cpu["tensors"].end(); ++it) {
    INFO(it.key());
    REQUIRE(gpu["tensors"].contains(it.key()));
    CHECK(close(gpu["tensors"][it.key()]["min"].get<double>(), it.value()["min"].get<double>()));
    CHECK(close(gpu["tensors"][it.key()]["max"].get<double>(), it.value()["max"].get<double>()));
  }
  // Validation of an INT8 candidate with per-layer diagnosis: same verdict, metrics within 1e-5.
  const fs::path q = tmp / "int8.onnx";
  REQUIRE(test::run_mpq({"quantize", model().string(), "--calib", (tmp / "cpu.json").string(), "-o", q.string()}).exit_code == 0);
  nlohmann::json report[2];
  int code[2];
  for (int i = 0; i < 2; ++i) {
    auto r = test::run_mpq({"validate", "--reference", model().string(), "--candidate", q.string(), "--data", data().string(),
                            "--per-layer", "--json", "--device", i == 0 ? "cpu" : "cuda"});
    INFO(r.err);
    code[i] = r.exit_code;
    report[i] = nlohmann::json::parse(r.out);
  }
  CHECK(code[0] == code[1]);
  CHECK(report[0]["passed"] == report[1]["passed"]);
  REQUIRE(report[0]["outputs"].size() == report[1]["outputs"].size());
  for (size_t o = 0; o < report[0]["outputs"].size(); ++o) {
    CHECK(close(report[1]["outputs"][o]["cosine"].get<double>(), report[0]["outputs"][o]["cosine"].get<double>()));
    CHECK(close(report[1]["outputs"][o]["snr_db"].get<double>(), report[0]["outputs"][o]["snr_db"].get<double>()));
  }
  CHECK(report[1]["per_layer"]["first_jump"]["name"] == report[0]["per_layer"]["first_jump"]["name"]);
  CHECK(report[1]["per_layer"]["compared"] == report[0]["per_layer"]["compared"]);
}

// `--device auto` takes the CUDA path when it is usable (here: the host emulation) and the CPU
// otherwise; the run line names the device.
TEST_CASE("device auto picks CUDA when usable, the CPU otherwise", "[cuda][cli][host_bodies]") {
  {
    auto r = test::run_mpq({"run", model().string(), "--data", data().string(), "--device", "auto"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.find("(cpu,") != std::string::npos);
  }
  EmulateCuda emulate;
  auto r = test::run_mpq({"run", model().string(), "--data", data().string(), "--device", "auto"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("(cuda,") != std::string::npos);
}

// `--tf32` asks the CUDA path for TF32 math (the host table computes FP32 either way); on the CPU it
// is refused with a clear message.
TEST_CASE("the tf32 flag runs on the CUDA path and is refused on the CPU", "[cuda][cli][host_bodies]") {
  auto cpu = test::run_mpq({"run", model().string(), "--data", data().string(), "--tf32"});
  CHECK(cpu.exit_code == 2);
  CHECK(cpu.err.find("--tf32 applies to the CUDA path only") != std::string::npos);
  EmulateCuda emulate;
  auto r = test::run_mpq({"run", model().string(), "--data", data().string(), "--device", "cuda", "--tf32"});
  INFO(r.err);
  CHECK(r.exit_code == 0);
}
