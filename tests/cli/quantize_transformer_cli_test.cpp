// `mpq quantize` and `mpq convert --fp16` on a BERT-style encoder, end to end: defaults chosen per
// model family and printed, dynamic and static modes, SmoothQuant, int8/FP16 embedding tables,
// sizes, provenance, bad usage.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "ir/onnx_io.h"
#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;

namespace {

std::string model() { return (test::source_dir() / "tests/models/tiny_bert.onnx").string(); }
std::string calib() { return (test::source_dir() / "tests/models/tiny_bert_calib").string(); }
std::string eval_data() { return (test::source_dir() / "tests/models/tiny_bert_data").string(); }

double size_fraction(const fs::path& p) {
  return static_cast<double>(fs::file_size(p)) / static_cast<double>(fs::file_size(model()));
}

// Cosine of the `embedding` output from `mpq validate --json`.
double embedding_cosine(const fs::path& cand) {
  auto r = test::run_mpq({"validate", "--reference", model(), "--candidate", cand.string(), "--data", eval_data(), "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  for (const auto& o : j["outputs"])
    if (o["name"] == "embedding") return o["cosine"].get<double>();
  FAIL("no embedding output in " << r.out);
  return 0;
}

}  // namespace

TEST_CASE("mpq quantize with no flags on an encoder: dynamic per-token, said so, small and accurate", "[cli][dynamic]") {
  test::TempDir tmp;
  auto r = test::run_mpq({"quantize", model(), "-o", (tmp / "q.onnx").string()});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("mode dynamic (per-token ranges at run time) for a transformer"));
  CHECK_THAT(r.out, Catch::Contains("2 embedding table(s) stored int8 per row"));
  // A 0.9 MB model keeps about 60 KB of graph structure: 31%; all-MiniLM-L6-v2 lands at 25.5%.
  CHECK(size_fraction(tmp / "q.onnx") < 0.33);
  CHECK(embedding_cosine(tmp / "q.onnx") >= 0.998);
  ir::Model q = ir::load_model(tmp / "q.onnx");
  CHECK(q.get_metadata("mpq.quantization.mode") == "dynamic");
  CHECK(q.get_metadata("mpq.quantization.activations") == "uint8 asymmetric per token, computed at run time");
  CHECK(q.get_metadata("mpq.quantization.embeddings") == "int8 per row");
  // Same flags, same bytes (apart from the command line naming the output).
  auto again = test::run_mpq({"quantize", model(), "-o", (tmp / "q2.onnx").string()});
  REQUIRE(again.exit_code == 0);
  ir::Model a = ir::load_model(tmp / "q.onnx"), b = ir::load_model(tmp / "q2.onnx");
  a.set_metadata("mpq.command", "");
  b.set_metadata("mpq.command", "");
  CHECK(ir::serialize_model(a) == ir::serialize_model(b));
}

TEST_CASE("mpq quantize on an encoder: per-tensor form, data-driven SmoothQuant, static mode", "[cli][dynamic]") {
  test::TempDir tmp;
  auto t = test::run_mpq({"quantize", model(), "--granularity", "tensor", "-o", (tmp / "t.onnx").string(), "--json"});
  INFO(t.err);
  REQUIRE(t.exit_code == 0);
  auto j = nlohmann::json::parse(t.out);
  CHECK(j["mode"] == "dynamic");
  CHECK(j["granularity"] == "tensor");
  CHECK(j["quantized"]["MatMul"].get<int>() == 12);
  // With --data an encoder also gets SmoothQuant by default, and it is said.
  auto s = test::run_mpq({"quantize", model(), "--data", calib(), "-o", (tmp / "s.onnx").string()});
  INFO(s.err);
  REQUIRE(s.exit_code == 0);
  CHECK_THAT(s.out, Catch::Contains("SmoothQuant alpha 0.5 from --data"));
  CHECK_THAT(s.out, Catch::Contains("6 folded into LayerNorm"));
  CHECK(embedding_cosine(tmp / "s.onnx") >= 0.9999);
  // Static mode: uint8 activations for a transformer by default, printed; SmoothQuant helps.
  auto st = test::run_mpq({"quantize", model(), "--mode", "static", "--data", calib(), "--method", "minmax", "-o",
                           (tmp / "st.onnx").string()});
  INFO(st.err);
  REQUIRE(st.exit_code == 0);
  CHECK_THAT(st.out, Catch::Contains("activations uint8 asymmetric (transformer"));
  CHECK_THAT(st.out, Catch::Contains("embedding table(s) stored int8 per row"));
  auto plain = test::run_mpq({"quantize", model(), "--mode", "static", "--no-smooth-quant", "--data", calib(), "--method",
                              "minmax", "--activation-type", "int8", "-o", (tmp / "plain.onnx").string()});
  REQUIRE(plain.exit_code == 0);
  CHECK(embedding_cosine(tmp / "st.onnx") > embedding_cosine(tmp / "plain.onnx"));
  ir::Model q = ir::load_model(tmp / "st.onnx");
  CHECK(q.get_metadata("mpq.quantization.smooth_quant_alpha") == "0.5");
}

TEST_CASE("mpq convert --fp16 stores an encoder's embedding tables in FP16", "[cli][fp16]") {
  test::TempDir tmp;
  auto r = test::run_mpq({"convert", "--fp16", model(), "-o", (tmp / "h.onnx").string()});
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("embedding tables: 2 stored in float16 with a Cast after their FP32 Gather"));
  CHECK(size_fraction(tmp / "h.onnx") < 0.53);  // all-MiniLM-L6-v2: 50.1%
  CHECK(embedding_cosine(tmp / "h.onnx") >= 0.9999);
}

TEST_CASE("mpq quantize: defaults per family and bad usage", "[cli][dynamic]") {
  test::TempDir tmp;
  const std::string cnn = (test::source_dir() / "tests/models/resnet_bn_op13.onnx").string();
  // A CNN without data: no dynamic default; the message says what to pass.
  auto r = test::run_mpq({"quantize", cnn, "-o", (tmp / "c.onnx").string()});
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("looks like a CNN") && Catch::Contains("--data DIR"));
  auto cd = test::run_mpq({"quantize", cnn, "--data", (test::source_dir() / "tests/models/resnet_bn_op13_data").string(),
                           "-o", (tmp / "c.onnx").string()});
  INFO(cd.err);
  REQUIRE(cd.exit_code == 0);
  CHECK_THAT(cd.out, Catch::Contains("mode static (calibrated ranges) for a CNN") &&
                         Catch::Contains("activations int8 symmetric"));
  auto bad = [&](std::vector<std::string> args, const std::string& says) {
    args.insert(args.begin(), "quantize");
    auto b = test::run_mpq(args);
    INFO(b.err);
    CHECK(b.exit_code == 2);
    CHECK_THAT(b.err, Catch::Contains(says));
  };
  const std::string out = (tmp / "x.onnx").string();
  bad({model(), "--smooth-quant", "-o", out}, "--smooth-quant needs --data");
  bad({model(), "--mode", "dynamic", "--format", "qoperator", "-o", out}, "is for --mode static");
  bad({model(), "--mode", "dynamic", "--activation-type", "int8", "-o", out}, "uint8");
  bad({model(), "--mode", "static", "-o", out}, "static quantization needs --data");
  bad({model(), "--granularity", "row", "-o", out}, "granularity");
  bad({model(), "--data", calib(), "--smooth-quant", "0.5", "--no-smooth-quant", "-o", out}, "exclude each other");
  auto help = test::run_mpq({"quantize", "--help"});
  CHECK_THAT(help.out, Catch::Contains("the choice for CNNs") && Catch::Contains("the choice for transformer encoders"));
}
