// `mpq convert` end to end: flags, exit codes, the summary, --json, provenance, determinism,
// data-aware mode and --validate.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "core/file_io.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;
using test::run_mpq;

namespace {

fs::path models() { return test::source_dir() / "tests/models"; }

std::string bytes_of(const fs::path& p) { return read_file_bytes(p); }

nlohmann::json json_of(const test::CommandResult& r) {
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.out);
}

}  // namespace

TEST_CASE("mpq convert --list-policy prints the table", "[cli][convert]") {
  auto r = run_mpq({"convert", "--list-policy"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("Softmax") != std::string::npos);
  CHECK(r.out.find("MatMul") != std::string::npos);
  CHECK(r.out.find("written-out LayerNorm") != std::string::npos);
  auto j = json_of(run_mpq({"convert", "--list-policy", "--json"}));
  bool exp_fp32 = false;
  for (const auto& e : j["ops"])
    if (e["op"] == "Exp") exp_fp32 = e["fp16"] == "fp32" && e["bf16"] == "follow";
  CHECK(exp_fp32);
}

TEST_CASE("mpq convert --fp16 writes a valid model with provenance", "[cli][convert]") {
  test::TempDir tmp;
  const fs::path out = tmp / "resnet.fp16.onnx";
  auto r = run_mpq({"convert", "--fp16", (models() / "resnet_bn_op13.onnx").string(), "-o", out.string()});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("converted") != std::string::npos);
  CHECK(r.out.find("wrote") != std::string::npos);
  ir::Model m = ir::load_model(out);
  CHECK(ir::verify(m).empty());
  CHECK(m.get_metadata("mpq.conversion.precision") == "float16");
  CHECK(m.get_metadata("mpq.conversion.keep_io_types") == "true");
  CHECK(m.get_metadata("mpq.command").find("convert --fp16") != std::string::npos);
  CHECK(!m.get_metadata("mpq.version").empty());
  CHECK(m.graph->inputs()[0]->type.elem == DType::Float32);
  CHECK(fs::file_size(out) <= fs::file_size(models() / "resnet_bn_op13.onnx") * 52 / 100);
  // mpq run executes the converted model.
  auto run = run_mpq({"run", out.string(), "--data", (models() / "resnet_bn_op13_data").string()});
  CHECK(run.exit_code == 0);
}

TEST_CASE("mpq convert is deterministic and never overwrites its input", "[cli][convert]") {
  test::TempDir tmp;
  const fs::path out = tmp / "t.onnx";
  const std::vector<std::string> args = {"convert", "--fp16", (models() / "transformer_op13.onnx").string(), "-o",
                                         out.string()};
  REQUIRE(run_mpq(args).exit_code == 0);
  std::string first = bytes_of(out);
  REQUIRE(run_mpq(args).exit_code == 0);
  CHECK(bytes_of(out) == first);

  const fs::path input = tmp / "in.onnx";
  fs::copy_file(models() / "unet_op13.onnx", input);
  std::string before = bytes_of(input);
  auto r = run_mpq({"convert", "--fp16", input.string(), "-o", input.string()});
  CHECK(r.exit_code == 2);
  CHECK(bytes_of(input) == before);
}

TEST_CASE("mpq convert rejects bad usage with exit code 2", "[cli][convert]") {
  test::TempDir tmp;
  const std::string model = (models() / "unet_op13.onnx").string();
  const std::string out = (tmp / "o.onnx").string();
  CHECK(run_mpq({"convert", model, "-o", out}).exit_code == 2);                       // no target type
  CHECK(run_mpq({"convert", "--fp16", "--bf16", model, "-o", out}).exit_code == 2);   // both
  CHECK(run_mpq({"convert", "--fp16", model}).exit_code == 2);                        // no output
  CHECK(run_mpq({"convert", "--fp16", model, "-o", out, "--validate"}).exit_code == 2);  // no data
  CHECK(run_mpq({"convert", "--fp16", model, "-o", out, "--keep-fp32", "Nope"}).exit_code == 2);
  CHECK(run_mpq({"convert", "--fp16", (tmp / "missing.onnx").string(), "-o", out}).exit_code == 2);
  CHECK(!fs::exists(out));
}

TEST_CASE("mpq convert --no-keep-io-types changes the interface", "[cli][convert]") {
  test::TempDir tmp;
  const fs::path out = tmp / "u.onnx";
  auto r = run_mpq({"convert", "--fp16", (models() / "unet_op17.onnx").string(), "-o", out.string(), "--no-keep-io-types"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  ir::Model m = ir::load_model(out);
  CHECK(m.graph->inputs()[0]->type.elem == DType::Float16);
  CHECK(m.graph->outputs()[0]->type.elem == DType::Float16);
  CHECK(m.get_metadata("mpq.conversion.keep_io_types") == "false");
}

TEST_CASE("mpq convert --data --validate on the overflow model", "[cli][convert]") {
  test::TempDir tmp;
  const fs::path out = tmp / "o.onnx";
  const std::string data = (models() / "fp16_overflow_data").string();
  auto j = json_of(run_mpq({"convert", "--fp16", (models() / "fp16_overflow.onnx").string(), "-o", out.string(), "--data",
                            data, "--validate", "--json"}));
  REQUIRE(j["validation"]["outputs"].size() == 1);
  CHECK(j["validation"]["outputs"][0]["cosine"].get<double>() >= 0.999);
  CHECK(j["validation"]["outputs"][0]["nonfinite"].get<int>() == 0);
  CHECK(j["kept_by_category"]["pattern"].get<int>() == 9);
  CHECK(j["data"]["feeds"].get<int>() == 4);
  ir::Model m = ir::load_model(out);
  CHECK(m.get_metadata("mpq.conversion.data_samples") == "4");
  CHECK(m.get_metadata("mpq.conversion.max_magnitude") == "4096");

  // The gate: passes at 0.999, fails (exit 1) at an impossible threshold, the output still written.
  auto ok = run_mpq({"convert", "--fp16", (models() / "fp16_overflow.onnx").string(), "-o", out.string(), "--data", data,
                     "--validate", "--min-cosine", "0.999"});
  CHECK(ok.exit_code == 0);
  CHECK(ok.out.find("PASS") != std::string::npos);
  auto bad = run_mpq({"convert", "--fp16", (models() / "fp16_overflow.onnx").string(), "-o", out.string(), "--data", data,
                      "--validate", "--min-cosine", "1.5"});
  CHECK(bad.exit_code == 1);
  CHECK(bad.out.find("FAIL") != std::string::npos);
}

TEST_CASE("mpq convert data-aware mode prints the kept nodes with their reason", "[cli][convert]") {
  test::TempDir tmp;
  auto r = run_mpq({"convert", "--fp16", (models() / "resnet_bn_op13.onnx").string(), "-o", (tmp / "r.onnx").string(),
                    "--data", (models() / "resnet_bn_op13_data").string(), "--max-magnitude", "2"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("kept in FP32") != std::string::npos);
  CHECK(r.out.find("exceeds --max-magnitude 2") != std::string::npos);
  CHECK(r.out.find("data-aware") != std::string::npos);
}

TEST_CASE("mpq convert --bf16 converts and records the precision", "[cli][convert]") {
  test::TempDir tmp;
  const fs::path out = tmp / "b.onnx";
  auto r = run_mpq({"convert", "--bf16", (models() / "transformer_op13.onnx").string(), "-o", out.string(), "--data",
                    (models() / "transformer_op13_data").string(), "--validate"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("BF16") != std::string::npos);
  CHECK(r.out.find("cosine") != std::string::npos);
  ir::Model m = ir::load_model(out);
  CHECK(m.opset() == 13);  // every op it has accepts bfloat16 at 13: no raise needed
  CHECK(m.get_metadata("mpq.conversion.precision") == "bfloat16");
  bool bf16 = false;
  for (const ir::Value* v : m.graph->initializers()) bf16 = bf16 || v->initializer().dtype() == DType::BFloat16;
  CHECK(bf16);
}

TEST_CASE("mpq convert keeps the demo classifier's top-1 on Fashion-MNIST", "[cli][convert][fashion]") {
  const fs::path demo = test::source_dir() / "calib_data/demo.onnx";
  const fs::path eval = test::source_dir() / "calib_data/eval";
  if (!fs::exists(demo) || !fs::exists(eval / "images.npy")) {
    WARN("calib_data/demo.onnx or calib_data/eval is missing: run scripts/train_fashion.py");
    return;
  }
  test::TempDir tmp;
  auto j = json_of(run_mpq({"convert", "--fp16", demo.string(), "-o", (tmp / "demo.fp16.onnx").string(), "--data",
                            eval.string(), "--validate", "--json"}));
  const auto& o = j["validation"]["outputs"][0];
  CHECK(o["cosine"].get<double>() >= 0.9999);
  CHECK(o["top1_rows"].get<int>() == 1000);
  CHECK(o["top1_agree"].get<int>() == 1000);
  CHECK(j["size_ratio"].get<double>() <= 0.52);
}
