// Graph editing, verifier, text dump and import/export edge cases of the IR.
#include <catch2/catch.hpp>
#include <onnx/onnx_pb.h>

#include <fstream>

#include "core/error.h"
#include "core/half.h"
#include "ir/dump.h"
#include "ir/onnx_io.h"
#include "ir/onnx_proto.h"
#include "ir/onnx_tools.h"
#include "ir/verify.h"
#include "test_util.h"

using namespace mpq;
using namespace mpq::ir;
namespace fs = std::filesystem;

namespace {

// x -> Relu -> r -> Add(r, w) -> y
Model small_model() {
  Model m;
  m.set_opset("", 17);
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, {Dim::symbol("N"), Dim::fixed(4)}));
  g.add_input(x);
  Value* w = g.add_initializer("w", Tensor::from<float>({4}, {1, 2, 3, 4}));
  Value* r = g.add_value("r");
  Value* y = g.add_value("y", ValueType::tensor(DType::Float32, {Dim::symbol("N"), Dim::fixed(4)}));
  g.add_node("Relu", {x}, {r}, "relu");
  g.add_node("Add", {r, w}, {y}, "add");
  g.add_output(y);
  return m;
}

}  // namespace

TEST_CASE("graph keeps producers and uses in sync while editing", "[ir]") {
  Model m = small_model();
  Graph& g = *m.graph;
  Value* x = g.find("x");
  Value* r = g.find("r");
  REQUIRE(r->producer() != nullptr);
  CHECK(r->producer()->op_type == "Relu");
  REQUIRE(r->uses().size() == 1);
  CHECK(r->uses()[0].node->op_type == "Add");

  // Insert a Cast between x and Relu: x -> Cast -> c -> Relu.
  Value* c = g.add_value(g.unique_name("x_cast"));
  Node* cast = g.add_node("Cast", {x}, {c}, "cast");
  cast->set_attr(Attribute::make_int("to", 1));
  Node* relu = r->producer();
  g.set_node_input(relu, 0, c);
  CHECK(x->uses().size() == 1);
  CHECK(x->uses()[0].node == cast);
  // The new node was appended after its consumer: the verifier sees the order problem...
  CHECK_FALSE(verify(m).empty());
  // ...and a topological sort fixes it.
  g.topological_sort();
  CHECK(verify(m).empty());
  CHECK(g.nodes()[0]->op_type == "Cast");

  // replace_uses rewires consumers but not graph outputs.
  g.replace_uses(r, c);
  CHECK(r->uses().empty());
  CHECK(g.remove_dead_nodes() == 1);  // Relu is now dead
  CHECK(verify(m).empty());
  CHECK(g.find("r") == nullptr);
}

TEST_CASE("unique_name avoids every name in the model", "[ir]") {
  Model m = small_model();
  std::string n = m.graph->unique_name("x");
  CHECK(n != "x");
  CHECK(m.graph->find(n) == nullptr);
  CHECK(m.graph->unique_name("fresh") == "fresh");
}

TEST_CASE("topological_sort reports a cycle naming a node", "[ir]") {
  Model m;
  Graph& g = *m.graph;
  Value* x = g.add_value("x", ValueType::tensor(DType::Float32, Shape{2}));
  g.add_input(x);
  Value* a = g.add_value("a");
  Value* b = g.add_value("b");
  g.add_node("Add", {x, b}, {a}, "first");
  g.add_node("Relu", {a}, {b}, "second");
  g.add_output(b);
  CHECK_THROWS_WITH(g.topological_sort(), Catch::Contains("cycle"));
  CHECK_FALSE(verify(m).empty());
}

TEST_CASE("a value cannot be produced twice", "[ir]") {
  Model m = small_model();
  Graph& g = *m.graph;
  CHECK_THROWS_AS(g.add_node("Relu", {g.find("x")}, {g.find("r")}, "again"), Error);
}

TEST_CASE("clone is deep and independent", "[ir]") {
  Model m = small_model();
  Model c = m.clone();
  CHECK(dump(m) == dump(c));
  c.graph->remove_node(c.graph->nodes()[1].get());
  CHECK(dump(m) != dump(c));
  CHECK(verify(m).empty());
}

TEST_CASE("text dump is readable and shows types, attributes and initializers", "[ir]") {
  Model m = small_model();
  m.graph->nodes()[0]->set_attr(Attribute::make_ints("perm", {1, 0}));
  std::string d = dump(m);
  CHECK_THAT(d, Catch::Contains("input x: float32[N,4]"));
  CHECK_THAT(d, Catch::Contains("init w: float32[4]"));
  CHECK_THAT(d, Catch::Contains("{1, 2, 3, 4}"));
  CHECK_THAT(d, Catch::Contains("= Relu \"relu\" (x) {perm: ints [1,0]}"));
  CHECK_THAT(d, Catch::Contains("output y: float32[N,4]"));
}

TEST_CASE("initializer encodings import to the same values", "[ir][import]") {
  auto roundtrip = [](const onnx::TensorProto& p) { return tensor_from_proto(p, nullptr); };
  SECTION("float_data") {
    onnx::TensorProto p;
    p.set_data_type(onnx::TensorProto::FLOAT);
    p.add_dims(2);
    p.add_float_data(1.5f);
    p.add_float_data(-2.0f);
    Tensor t = roundtrip(p);
    CHECK(t.data<float>()[1] == -2.0f);
  }
  SECTION("float16 packed in int32_data") {
    onnx::TensorProto p;
    p.set_data_type(onnx::TensorProto::FLOAT16);
    p.add_dims(2);
    p.add_int32_data(float_to_half_bits(0.5f));
    p.add_int32_data(float_to_half_bits(-3.0f));
    Tensor t = roundtrip(p);
    REQUIRE(t.dtype() == DType::Float16);
    CHECK(to_float(t.data<Float16>()[1]) == -3.0f);
  }
  SECTION("bfloat16 packed in int32_data") {
    onnx::TensorProto p;
    p.set_data_type(onnx::TensorProto::BFLOAT16);
    p.add_dims(1);
    p.add_int32_data(float_to_bf16_bits(2.5f));
    CHECK(to_float(roundtrip(p).data<BFloat16>()[0]) == 2.5f);
  }
  SECTION("int8 in int32_data") {
    onnx::TensorProto p;
    p.set_data_type(onnx::TensorProto::INT8);
    p.add_dims(3);
    for (int v : {-128, 0, 127}) p.add_int32_data(v);
    Tensor t = roundtrip(p);
    CHECK(t.data<int8_t>()[0] == -128);
    CHECK(t.data<int8_t>()[2] == 127);
  }
  SECTION("int64, double, uint64 and strings") {
    onnx::TensorProto a;
    a.set_data_type(onnx::TensorProto::INT64);
    a.add_int64_data(-7);
    CHECK(roundtrip(a).data<int64_t>()[0] == -7);
    onnx::TensorProto b;
    b.set_data_type(onnx::TensorProto::DOUBLE);
    b.add_double_data(0.25);
    CHECK(roundtrip(b).data<double>()[0] == 0.25);
    onnx::TensorProto c;
    c.set_data_type(onnx::TensorProto::UINT32);
    c.add_uint64_data(4000000000u);
    CHECK(roundtrip(c).data<uint32_t>()[0] == 4000000000u);
    onnx::TensorProto d;
    d.set_data_type(onnx::TensorProto::STRING);
    d.add_dims(2);
    d.add_string_data("a");
    d.add_string_data("bc");
    CHECK(roundtrip(d).strings()[1] == "bc");
  }
  SECTION("raw_data of the wrong size is rejected with the tensor's name") {
    onnx::TensorProto p;
    p.set_name("weights");
    p.set_data_type(onnx::TensorProto::FLOAT);
    p.add_dims(4);
    p.set_raw_data(std::string(8, '\0'));
    CHECK_THROWS_WITH(roundtrip(p), Catch::Contains("weights"));
  }
  SECTION("typed field count mismatch is rejected") {
    onnx::TensorProto p;
    p.set_name("bias");
    p.set_data_type(onnx::TensorProto::INT64);
    p.add_dims(3);
    p.add_int64_data(1);
    CHECK_THROWS_WITH(roundtrip(p), Catch::Contains("bias"));
  }
}

TEST_CASE("external data: loads from the model folder, refuses paths that escape it", "[ir][external]") {
  test::TempDir tmp;
  fs::create_directories(tmp / "model");
  fs::path model_path = tmp / "model" / "m.onnx";
  Model m = small_model();
  // Large enough to go external.
  std::vector<float> big(2048);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i);
  m.graph->add_initializer("big", Tensor::from<float>({2048}, big));
  SaveOptions opts;
  opts.external = ExternalData::Always;
  save_model(m, model_path, opts);
  REQUIRE(fs::exists(tmp / "model" / "m.onnx.data"));
  Model loaded = load_model(model_path);
  CHECK(dump(loaded) == dump(m));
  REQUIRE(loaded.external_files.size() == 1);
  CHECK(loaded.external_files[0].second == 2048 * 4);

  // Rewrite the location to escape the folder.
  auto with_location = [&](const std::string& location) {
    onnx::ModelProto mp;
    std::ifstream in(model_path, std::ios::binary);
    REQUIRE(mp.ParseFromIstream(&in));
    for (auto& t : *mp.mutable_graph()->mutable_initializer())
      for (auto& kv : *t.mutable_external_data())
        if (kv.key() == "location") kv.set_value(location);
    fs::path out = tmp / "model" / "escaping.onnx";
    std::ofstream o(out, std::ios::binary);
    mp.SerializeToOstream(&o);
    return out;
  };
  fs::copy_file(tmp / "model" / "m.onnx.data", tmp / "outside.data");
  CHECK_THROWS_WITH(load_model(with_location("../outside.data")), Catch::Contains("escapes"));
  CHECK_THROWS_WITH(load_model(with_location((tmp / "outside.data").string())), Catch::Contains("relative path"));
  CHECK_THROWS_WITH(load_model(with_location("missing.data")), Catch::Contains("not found"));
}

TEST_CASE("models beyond 2 GB load through external data without reading it all", "[ir][external][large]") {
  test::TempDir tmp;
  // A sparse 2.25 GB data file: the disk holds almost nothing, the model still addresses it all.
  const uint64_t chunk = uint64_t(768) << 20;  // 768 MiB per tensor, 3 tensors
  fs::path data = tmp / "huge.bin";
  {
    std::ofstream f(data, std::ios::binary);
    f.seekp(static_cast<std::streamoff>(3 * chunk - 1));
    f.put('\0');
  }
  onnx::ModelProto mp;
  mp.set_ir_version(8);
  mp.add_opset_import()->set_version(17);
  auto* g = mp.mutable_graph();
  g->set_name("huge");
  for (int i = 0; i < 3; ++i) {
    auto* t = g->add_initializer();
    t->set_name(fmt::format("w{}", i));
    t->set_data_type(onnx::TensorProto::FLOAT);
    t->add_dims(static_cast<int64_t>(chunk / 4));
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    auto add = [&](const char* k, const std::string& v) {
      auto* kv = t->add_external_data();
      kv->set_key(k);
      kv->set_value(v);
    };
    add("location", "huge.bin");
    add("offset", std::to_string(i * chunk));
    add("length", std::to_string(chunk));
  }
  auto* in = g->add_input();
  in->set_name("x");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(1);
  auto* node = g->add_node();
  node->set_op_type("Identity");
  node->add_input("x");
  node->add_output("y");
  auto* out = g->add_output();
  out->set_name("y");
  {
    std::ofstream f(tmp / "huge.onnx", std::ios::binary);
    mp.SerializeToOstream(&f);
  }
  Model m = load_model(tmp / "huge.onnx");
  uint64_t total = 0;
  for (Value* v : m.graph->initializers()) total += v->initializer().nbytes();
  CHECK(total == 3 * chunk);
  CHECK(total > (uint64_t(2) << 30));
  // The last element is addressable (mapped, not copied).
  const Tensor& last = m.graph->find("w2")->initializer();
  CHECK(last.data<float>()[last.numel() - 1] == 0.0f);
}

TEST_CASE("IR version 10 / opset 21 models load and round-trip without the checker", "[ir]") {
  test::TempDir tmp;
  Model m = small_model();
  m.ir_version = 10;
  m.set_opset("", 21);
  m.set_opset("com.example", 1);
  m.graph->nodes()[0]->domain = "com.example";
  m.set_metadata("mpq.test", "yes");
  m.doc_string = "doc";
  save_model(m, tmp / "v10.onnx");
  Model b = load_model(tmp / "v10.onnx");
  CHECK(dump(b) == dump(m));
  CheckResult r = check_model(b);
  CHECK_FALSE(r.ran);
  CHECK_THAT(r.message, Catch::Contains("not checked"));
}

TEST_CASE("shape inference fills in intermediate types", "[ir][shape-inference]") {
  Model m = small_model();
  REQUIRE(m.graph->find("r")->type.is_unknown());
  std::string note;
  int typed = infer_shapes(m, &note);
  INFO(note);
  CHECK(typed >= 1);
  CHECK(m.graph->find("r")->type.str() == "float32[N,4]");
}

TEST_CASE("subgraphs keep outer-scope references", "[ir][subgraph]") {
  Model m;
  m.set_opset("", 17);
  Graph& g = *m.graph;
  Value* cond = g.add_value("cond", ValueType::tensor(DType::Bool, Shape{}));
  g.add_input(cond);
  Value* x = g.add_initializer("x", Tensor::from<float>({2}, {1, 2}));
  Value* y = g.add_value("y");
  Node* n = g.add_node("If", {cond}, {y}, "if");
  for (const char* branch : {"then_branch", "else_branch"}) {
    auto sub = std::make_shared<Graph>(branch, &g);
    Value* ox = sub->add_outer_scope_value("x");
    Value* out = sub->add_value(std::string(branch) + "_out", ValueType::tensor(DType::Float32, Shape{2}));
    sub->add_node(branch == std::string("then_branch") ? "Relu" : "Neg", {ox}, {out});
    sub->add_output(out);
    n->set_attr(Attribute::make_graph(branch, sub));
  }
  g.add_output(y);
  CHECK(verify(m).empty());
  CHECK(outer_references(*n->attr_graph("then_branch")) == std::vector<std::string>{"x"});
  std::string text = dump(m);
  CHECK_THAT(text, Catch::Contains("(^x)"));
  Model b = parse_model(serialize_model(m), ".", "memory");
  CHECK(dump(b) == text);
  (void)x;
}
