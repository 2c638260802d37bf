// Per-layer comparison: name matching through QDQ/Cast, the lock-step streaming runner (results
// independent of the memory window), ranking, and the first jump on small models built here.
#include <catch2/catch.hpp>

#include <cmath>
#include <random>

#include "data/npy.h"
#include "test_util.h"
#include "validate/compare.h"
#include "validate/per_layer.h"

using namespace mpq;
using namespace mpq::validate;
namespace fs = std::filesystem;

namespace {

ir::ValueType batch_type(int64_t features) {
  return ir::ValueType::tensor(DType::Float32, std::vector<ir::Dim>{ir::Dim::symbol("N"), ir::Dim::fixed(features)});
}

Tensor weights(int64_t rows, int64_t cols, uint32_t seed) { return test::random_tensor({rows, cols}, seed, -0.5f, 0.5f); }

Tensor perturbed(const Tensor& w, uint32_t seed, float rel) {
  Tensor out = w.clone();
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  float* p = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] *= 1.0f + rel * d(rng);
  return out;
}

// x[N,8] -> MatMul W1 -> a[N,16] -> Relu -> b -> MatMul W2 -> c[N,16] -> Relu -> d -> MatMul W3 -> y[N,5]
ir::Model mlp(const Tensor& w1, const Tensor& w2, const Tensor& w3) {
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph* g = m.graph.get();
  ir::Value* x = g->add_value("x", batch_type(8));
  g->add_input(x);
  ir::Value* W1 = g->add_initializer("W1", w1);
  ir::Value* W2 = g->add_initializer("W2", w2);
  ir::Value* W3 = g->add_initializer("W3", w3);
  ir::Value* a = g->add_value("a");
  ir::Value* b = g->add_value("b");
  ir::Value* c = g->add_value("c");
  ir::Value* d = g->add_value("d");
  ir::Value* y = g->add_value("y", batch_type(5));
  g->add_node("MatMul", {x, W1}, {a}, "mm1");
  g->add_node("Relu", {a}, {b}, "relu1");
  g->add_node("MatMul", {b, W2}, {c}, "mm2");
  g->add_node("Relu", {c}, {d}, "relu2");
  g->add_node("MatMul", {d, W3}, {y}, "mm3");
  g->add_output(y);
  return m;
}

struct Fixture {
  test::TempDir tmp{"mpq-perlayer"};
  Tensor w1 = weights(8, 16, 1), w2 = weights(16, 16, 2), w3 = weights(16, 5, 3);
  Fixture() {
    fs::create_directories(tmp / "data");
    data::write_npy(tmp / "data" / "a.npy", test::random_tensor({7, 8}, 10));
    data::write_npy(tmp / "data" / "b.npy", test::random_tensor({5, 8}, 11));
  }
  fs::path data_dir() const { return tmp / "data"; }
};

}  // namespace

TEST_CASE("candidate origins walk Q/DQ/Cast chains and the _dequantized suffix", "[validate][per_layer]") {
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph* g = m.graph.get();
  ir::Value* x = g->add_value("x", batch_type(4));
  g->add_input(x);
  ir::Value* s = g->add_initializer("s", Tensor::scalar<float>(0.1f));
  ir::Value* z = g->add_initializer("z", Tensor::scalar<int8_t>(0));
  ir::Value* xq = g->add_value("x_quantized");
  ir::Value* xdq = g->add_value("x_dequantized");
  ir::Value* h16 = g->add_value("h16");
  g->add_node("QuantizeLinear", {x, s, z}, {xq}, "q");
  g->add_node("DequantizeLinear", {xq, s, z}, {xdq}, "dq");
  ir::Node* cast = g->add_node("Cast", {xdq}, {h16}, "cast");
  cast->set_attr(ir::Attribute::make_int("to", 10));
  auto o = candidate_origins(*h16);
  REQUIRE(o.size() == 3);
  CHECK(o[0] == std::make_pair(std::string("x_dequantized"), 1));
  CHECK(o[1] == std::make_pair(std::string("x_quantized"), 2));
  CHECK(o[2] == std::make_pair(std::string("x"), 3));
  auto d = candidate_origins(*xdq);
  // Chain (x_quantized 1, x 2) and suffix (x 1).
  CHECK(std::find(d.begin(), d.end(), std::make_pair(std::string("x"), 1)) != d.end());
  CHECK(candidate_origins(*x).empty());
}

TEST_CASE("layers match by name, through inserted Q/DQ, and not across folded tensors", "[validate][per_layer]") {
  Fixture f;
  ir::Model ref = mlp(f.w1, f.w2, f.w3);
  // Candidate: x quantized in front of mm1 (coarse); relu1's output renamed and quantized (finely)
  // so only b_dequantized carries b; relu2's output renamed, so d has no counterpart.
  ir::Model cand;
  cand.set_opset("", 17);
  ir::Graph* g = cand.graph.get();
  ir::Value* x = g->add_value("x", batch_type(8));
  g->add_input(x);
  ir::Value* s = g->add_initializer("s", Tensor::scalar<float>(0.1f));   // x in [-1, 1): ~26 dB
  ir::Value* z = g->add_initializer("z", Tensor::scalar<int8_t>(0));
  ir::Value* sb = g->add_initializer("sb", Tensor::scalar<float>(0.02f));  // b in [0, ~1.5]: ~35 dB, no clipping
  ir::Value* W1 = g->add_initializer("W1", f.w1);
  ir::Value* W2 = g->add_initializer("W2", f.w2);
  ir::Value* W3 = g->add_initializer("W3", f.w3);
  auto v = [&](const char* n) { return g->add_value(n); };
  ir::Value *xq = v("x_quantized"), *xdq = v("x_dequantized"), *a = v("a"), *pre = v("relu1_raw"), *bq = v("b_quantized"),
            *bdq = v("b_dequantized"), *c = v("c"), *d = v("relu2_out");
  ir::Value* y = g->add_value("y", batch_type(5));
  g->add_node("QuantizeLinear", {x, s, z}, {xq});
  g->add_node("DequantizeLinear", {xq, s, z}, {xdq});
  g->add_node("MatMul", {xdq, W1}, {a}, "mm1");
  g->add_node("Relu", {a}, {pre}, "relu1");
  g->add_node("QuantizeLinear", {pre, sb, z}, {bq});
  g->add_node("DequantizeLinear", {bq, sb, z}, {bdq});
  g->add_node("MatMul", {bdq, W2}, {c}, "mm2");
  g->add_node("Relu", {c}, {d}, "relu2");
  g->add_node("MatMul", {d, W3}, {y}, "mm3");
  g->add_output(y);

  LayerMatching lm = match_layers(ref, cand);
  REQUIRE(lm.by_ref.count("x"));
  CHECK(lm.matches[lm.by_ref.at("x")].cand_name == "x");  // exact beats the x_dequantized chain
  CHECK(lm.matches[lm.by_ref.at("a")].exact);
  REQUIRE(lm.by_ref.count("b"));
  CHECK(lm.matches[lm.by_ref.at("b")].cand_name == "b_dequantized");
  CHECK_FALSE(lm.matches[lm.by_ref.at("b")].exact);
  CHECK(lm.matches[lm.by_ref.at("y")].cand_name == "y");
  CHECK(lm.by_ref.count("d") == 0);
  CHECK(std::find(lm.unmatched.begin(), lm.unmatched.end(), "d") != lm.unmatched.end());
  CHECK(lm.by_cand.count("b_quantized") == 0);  // integer tensors never stand for a layer

  // Run it: the per-layer table holds a, b, c, y; the coarse input quantization shows up at mm1,
  // which adds the most noise.
  data::FeedSource feeds = data::FeedSource::open(f.data_dir(), ref);
  CompareOptions o;
  o.per_layer = true;
  o.threads = 1;
  CompareResult r = compare_models(ref, cand, feeds, o);
  REQUIRE(r.per_layer);
  const PerLayerResult& pl = *r.per_layer;
  std::vector<std::string> names;
  for (const auto& l : pl.layers) names.push_back(l.name);
  CHECK(names == std::vector<std::string>{"a", "b", "c", "y"});
  REQUIRE(pl.first_jump);
  CHECK(pl.layers[*pl.first_jump].name == "a");
  CHECK(pl.layers[pl.ranking.front()].name == "a");
  CHECK(std::isinf(pl.layers[0].upstream_snr_db));
  // y reads d, which has no counterpart: its upstream is c's SNR, carried through relu2.
  CHECK(pl.layers[3].upstream_snr_db == pl.layers[2].snr_db);
  CHECK(r.rows == 12);
}

TEST_CASE("a perturbed layer is ranked first and named as the first jump", "[validate][per_layer]") {
  Fixture f;
  ir::Model ref = mlp(f.w1, f.w2, f.w3);
  ir::Model bad = mlp(f.w1, perturbed(f.w2, 5, 0.3f), f.w3);
  data::FeedSource feeds = data::FeedSource::open(f.data_dir(), ref);
  CompareOptions o;
  o.per_layer = true;
  o.threads = 1;
  CompareResult r = compare_models(ref, bad, feeds, o);
  REQUIRE(r.per_layer);
  const PerLayerResult& pl = *r.per_layer;
  REQUIRE(pl.layers.size() == 5);  // a, b, c, d, y
  // Layers before the perturbation are exact.
  CHECK(std::isinf(pl.layers[0].snr_db));
  CHECK(std::isinf(pl.layers[1].snr_db));
  CHECK(std::isfinite(pl.layers[2].snr_db));
  CHECK(pl.layers[pl.ranking.front()].name == "c");
  REQUIRE(pl.first_jump);
  CHECK(pl.layers[*pl.first_jump].name == "c");
  CHECK(pl.layers[*pl.first_jump].node == "mm2");
  // Outputs agree with a run without per-layer comparison.
  CompareOptions plain = o;
  plain.per_layer = false;
  CompareResult r2 = compare_models(ref, bad, feeds, plain);
  CHECK(r2.outputs[0].stats.snr_db() == r.outputs[0].stats.snr_db());
  CHECK(r2.outputs[0].stats.max_abs_error() == r.outputs[0].stats.max_abs_error());
}

TEST_CASE("lock-step streaming gives the same statistics for any window; memory stays within it", "[validate][per_layer]") {
  Fixture f;
  ir::Model ref = mlp(f.w1, f.w2, f.w3);
  ir::Model bad = mlp(perturbed(f.w1, 9, 0.05f), f.w2, f.w3);
  data::FeedSource feeds = data::FeedSource::open(f.data_dir(), ref);
  CompareOptions big;
  big.per_layer = true;
  big.threads = 1;
  big.batch_rows = 3;  // 7 rows -> 3+3+1, 5 rows -> 3+2
  CompareOptions tiny = big;
  tiny.window_bytes = 1;  // hand over after every tensor
  CompareResult a = compare_models(ref, bad, feeds, big);
  CompareResult b = compare_models(ref, bad, feeds, tiny);
  CHECK(a.runs == 5);
  CHECK(a.rows == 12);
  REQUIRE(a.per_layer->layers.size() == b.per_layer->layers.size());
  for (size_t i = 0; i < a.per_layer->layers.size(); ++i) {
    CHECK(a.per_layer->layers[i].name == b.per_layer->layers[i].name);
    CHECK(a.per_layer->layers[i].stats.snr_db() == b.per_layer->layers[i].stats.snr_db());
    CHECK(a.per_layer->layers[i].stats.count() == 12 * (i == 4 ? 5 : 16));
  }
  // With a one-byte window the reference never holds more than one tensor of one run: [3,16] floats.
  CHECK(b.per_layer->peak_window_bytes <= 3 * 16 * 4);
  CHECK(a.per_layer->peak_window_bytes >= b.per_layer->peak_window_bytes);
}

TEST_CASE("identical models: every layer exact, no jump", "[validate][per_layer]") {
  Fixture f;
  ir::Model ref = mlp(f.w1, f.w2, f.w3);
  ir::Model same = mlp(f.w1, f.w2, f.w3);
  data::FeedSource feeds = data::FeedSource::open(f.data_dir(), ref);
  CompareOptions o;
  o.per_layer = true;
  o.threads = 1;
  CompareResult r = compare_models(ref, same, feeds, o);
  for (const auto& l : r.per_layer->layers) CHECK(std::isinf(l.snr_db));
  CHECK_FALSE(r.per_layer->first_jump);
  CHECK(r.outputs[0].stats.cosine() == 1.0);
}

TEST_CASE("float16 candidate inputs get the same data, converted", "[validate][per_layer]") {
  Fixture f;
  ir::Model ref = mlp(f.w1, f.w2, f.w3);
  // Candidate: x is float16 and cast up inside the model.
  ir::Model cand = mlp(f.w1, f.w2, f.w3);
  ir::Graph* g = cand.graph.get();
  ir::Value* x = g->find("x");
  x->type = ir::ValueType::tensor(DType::Float16, std::vector<ir::Dim>{ir::Dim::symbol("N"), ir::Dim::fixed(8)});
  ir::Value* x32 = g->add_value("x32");
  ir::Node* cast = g->add_node("Cast", {x}, {x32}, "cast_in");
  cast->set_attr(ir::Attribute::make_int("to", 1));
  for (const auto& n : g->nodes())
    if (n->name == "mm1") g->set_node_input(n.get(), 0, x32);
  g->topological_sort();
  data::FeedSource feeds = data::FeedSource::open(f.data_dir(), ref);
  CompareOptions o;
  o.threads = 1;
  CompareResult r = compare_models(ref, cand, feeds, o);
  CHECK(r.outputs[0].stats.snr_db() > 50.0);  // only the input rounding
  CHECK(std::isfinite(r.outputs[0].stats.snr_db()));
}

TEST_CASE("compare: bad inputs are input errors", "[validate][per_layer]") {
  Fixture f;
  ir::Model ref = mlp(f.w1, f.w2, f.w3);
  data::FeedSource feeds = data::FeedSource::open(f.data_dir(), ref);
  CompareOptions o;
  o.threads = 1;
  // Candidate with a differently named output.
  ir::Model other = mlp(f.w1, f.w2, f.w3);
  ir::Graph* g = other.graph.get();
  ir::Value* z = g->add_value("z", batch_type(5));
  g->add_node("Identity", {g->find("y")}, {z}, "id");
  g->set_output(0, z);
  CHECK_THROWS_WITH(compare_models(ref, other, feeds, o), Catch::Contains("no output 'y'"));
  // Candidate whose output has another shape.
  ir::Model wide = mlp(f.w1, f.w2, weights(16, 6, 3));
  wide.graph->find("y")->type = batch_type(6);
  CHECK_THROWS_WITH(compare_models(ref, wide, feeds, o), Catch::Contains("candidate shape"));
  // Labels given but no classifier-shaped output of the requested name.
  o.label_output = "nope";
  CHECK_THROWS_WITH(compare_models(ref, ref, feeds, o), Catch::Contains("--label-output 'nope'"));
}
