// The CLI's error contract (DESIGN.md): bad input gives a one-line message naming the problem on
// stderr, exit code 2, no crash, and nothing written to stdout.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <fstream>

#include "ir/onnx_io.h"
#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;

namespace {

void expect_input_error(const test::CommandResult& r, const std::string& needle) {
  INFO("stderr: " << r.err);
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains(needle));
  CHECK_THAT(r.err, Catch::StartsWith("mpq: error:"));
  // One line: the message ends at the first newline.
  CHECK(r.err.find('\n') == r.err.size() - 1);
}

fs::path add_model() { return test::testdata_dir() / "node" / "test_add" / "model.onnx"; }

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f << bytes;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

}  // namespace

TEST_CASE("inspect a missing file", "[cli][errors]") {
  expect_input_error(test::run_mpq({"inspect", "/nonexistent/model.onnx"}), "/nonexistent/model.onnx: no such file");
}

TEST_CASE("inspect a truncated model", "[cli][errors]") {
  test::TempDir tmp;
  std::string bytes = read_bytes(test::testdata_dir() / "node" / "test_conv_with_strides_padding" / "model.onnx");
  REQUIRE(bytes.size() > 40);
  write_bytes(tmp / "truncated.onnx", bytes.substr(0, bytes.size() / 2));
  expect_input_error(test::run_mpq({"inspect", (tmp / "truncated.onnx").string()}), "not a valid ONNX model");
}

TEST_CASE("inspect a file that is not ONNX", "[cli][errors]") {
  test::TempDir tmp;
  write_bytes(tmp / "notes.onnx", "this is a text file, not a model\n");
  expect_input_error(test::run_mpq({"inspect", (tmp / "notes.onnx").string()}), "not");
  write_bytes(tmp / "empty.onnx", "");
  expect_input_error(test::run_mpq({"inspect", (tmp / "empty.onnx").string()}), "empty file");
  expect_input_error(test::run_mpq({"inspect", tmp.path().string()}), "is a directory");
}

TEST_CASE("inspect a model with a dangling node input", "[cli][errors]") {
  test::TempDir tmp;
  onnx::ModelProto mp;
  mp.set_ir_version(8);
  mp.add_opset_import()->set_version(17);
  auto* g = mp.mutable_graph();
  g->set_name("g");
  auto* in = g->add_input();
  in->set_name("x");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(1);
  auto* n = g->add_node();
  n->set_op_type("Add");
  n->set_name("add_1");
  n->add_input("x");
  n->add_input("ghost");
  n->add_output("y");
  g->add_output()->set_name("y");
  write_bytes(tmp / "dangling.onnx", mp.SerializeAsString());
  auto r = test::run_mpq({"inspect", (tmp / "dangling.onnx").string()});
  expect_input_error(r, "ghost");
  CHECK_THAT(r.err, Catch::Contains("add_1"));
}

TEST_CASE("inspect a model whose external data escapes its folder", "[cli][errors]") {
  test::TempDir tmp;
  fs::create_directories(tmp / "m");
  write_bytes(tmp / "secret.bin", std::string(16, '\1'));
  onnx::ModelProto mp;
  mp.set_ir_version(8);
  mp.add_opset_import()->set_version(17);
  auto* g = mp.mutable_graph();
  g->set_name("g");
  auto* t = g->add_initializer();
  t->set_name("w");
  t->set_data_type(onnx::TensorProto::FLOAT);
  t->add_dims(4);
  t->set_data_location(onnx::TensorProto::EXTERNAL);
  auto* kv = t->add_external_data();
  kv->set_key("location");
  kv->set_value("../secret.bin");
  auto* n = g->add_node();
  n->set_op_type("Identity");
  n->add_input("w");
  n->add_output("y");
  g->add_output()->set_name("y");
  write_bytes(tmp / "m" / "model.onnx", mp.SerializeAsString());
  expect_input_error(test::run_mpq({"inspect", (tmp / "m" / "model.onnx").string()}), "escapes the model's folder");
}

TEST_CASE("unknown subcommands and options are usage errors", "[cli][errors]") {
  CHECK(test::run_mpq({"frobnicate"}).exit_code == 2);
  CHECK(test::run_mpq({"inspect"}).exit_code == 2);
  CHECK(test::run_mpq({"inspect", add_model().string(), "--no-such-flag"}).exit_code == 2);
}

TEST_CASE("a negative or malformed count is a usage error naming its option", "[cli][errors]") {
  // Inside mpq a negative count often means "not given" (all feeds, automatic warm-up); typed by a
  // user it is a mistake, refused at parsing (exit 2) rather than read as that.
  auto refused = [](const std::vector<std::string>& args, const std::string& option, const std::string& value,
                    const std::string& least) {
    auto r = test::run_mpq(args);
    INFO(args[0] << " " << option << " " << value << ": " << r.err);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::Contains(option + ": must be a whole number, " + least + " or more, got " + value));
  };
  const std::string model = add_model().string();
  for (const char* command : {"run", "calibrate", "quantize", "convert", "validate", "sensitivity"})
    for (const char* value : {"-3", "2x"}) refused({command, model, "--max-samples", value}, "--max-samples", value, "0");
  for (const char* command : {"run", "calibrate", "quantize", "convert", "validate", "sensitivity", "qat-finetune"})
    refused({command, model, "--threads", "-1"}, "--threads", "-1", "0");
  refused({"run", model, "--repeat", "-1"}, "--repeat", "-1", "0");
  refused({"sensitivity", model, "--calib-samples", "-1"}, "--calib-samples", "-1", "0");
  refused({"sensitivity", model, "--max-keep", "-1"}, "--max-keep", "-1", "0");
  refused({"qat-finetune", model, "--calib-samples", "-5"}, "--calib-samples", "-5", "0");
  refused({"qat-finetune", model, "--steps", "0"}, "--steps", "0", "1");
  for (const char* option : {"--warmup", "--every", "--freeze-ranges-after"})
    refused({"qat-finetune", model, option, "-2"}, option, "-2", "0");
  refused({"validate", "--reference", model, "--candidate", model, "--top", "-1"}, "--top", "-1", "0");
}

TEST_CASE("help and version", "[cli]") {
  auto help = test::run_mpq({"--help"});
  CHECK(help.exit_code == 0);
  CHECK_THAT(help.out, Catch::Contains("inspect"));
  CHECK_THAT(help.out, Catch::Contains("run"));
  auto version = test::run_mpq({"--version"});
  CHECK(version.exit_code == 0);
  CHECK_THAT(version.out, Catch::StartsWith("mpq "));
  auto sub = test::run_mpq({"inspect", "--help"});
  CHECK(sub.exit_code == 0);
  CHECK_THAT(sub.out, Catch::Contains("Example:"));
}

TEST_CASE("devices reports no CUDA device cleanly on a machine without a GPU", "[cli][cuda]") {
  auto r = test::run_mpq({"devices", "--json"});
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["cpu"] == true);
  if (j["gpus"].empty()) {
    WARN("no GPU here: " << j.value("cuda_unavailable", std::string("?")));
    CHECK(j.contains("cuda_unavailable"));
  }
}

TEST_CASE("device cuda without a usable GPU is one clear line and exit 2, before any work", "[cli][cuda]") {
  auto devices = test::run_mpq({"devices", "--json"});
  REQUIRE(devices.exit_code == 0);
  if (!nlohmann::json::parse(devices.out)["gpus"].empty()) {
    WARN("a GPU is usable here: the no-GPU message cannot be checked");
    return;
  }
  const std::string model = (test::source_dir() / "calib_data" / "demo.onnx").string();
  const std::string data = (test::source_dir() / "calib_data" / "calib").string();
  test::TempDir tmp;
  const fs::path out = tmp / "table.json";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"run", model, "--data", data, "--device", "cuda"},
        std::vector<std::string>{"calibrate", model, "--data", data, "--device", "cuda", "-o", out.string()}}) {
    INFO(args[0]);
    auto r = test::run_mpq(args);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.err, Catch::StartsWith("mpq: error: --device cuda: CUDA is not usable here"));
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }
  CHECK_FALSE(fs::exists(out));
}

TEST_CASE("inspect prints the op histogram and parameters, --json gives op_types", "[cli][inspect]") {
  fs::path model = test::testdata_dir() / "pytorch-converted" / "test_ConvTranspose2d" / "model.onnx";
  auto text = test::run_mpq({"inspect", model.string()});
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("ConvTranspose 1"));
  CHECK_THAT(text.out, Catch::Contains("parameters:"));
  auto r = test::run_mpq({"inspect", model.string(), "--json", "--graph"});
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["op_types"]["ConvTranspose"] == 1);
  CHECK(j["parameters"]["count"].get<int64_t>() > 0);
  CHECK(j["inputs"].size() == 1);
  CHECK_THAT(j["graph"].get<std::string>(), Catch::Contains("ConvTranspose"));
}
