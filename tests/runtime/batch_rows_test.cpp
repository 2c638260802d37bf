// Whole-graph batch splitting (runtime/batch_rows.h): which graphs keep rows apart, how a batch is
// cut, and that the executor's split runs give the bits of the whole one-thread run.
#include <catch2/catch.hpp>

#include <cstring>
#include <future>
#include <thread>

#include "ir/onnx_io.h"
#include "passes/inference_fusion.h"
#include "runtime/batch_rows.h"
#include "runtime/executor.h"
#include "test_util.h"

using namespace mpq;

namespace {

ir::ValueType batched(std::vector<int64_t> trailing, const char* batch = "N") {
  std::vector<ir::Dim> dims{batch ? ir::Dim::symbol(batch) : ir::Dim::fixed(2)};
  for (int64_t d : trailing) dims.push_back(ir::Dim::fixed(d));
  return ir::ValueType::tensor(DType::Float32, dims);
}

// x[N, 4, 6, 6] -> Conv(8) -> Relu -> GlobalAveragePool -> Flatten -> Gemm(3) -> y, with `tail`
// (when set) adding one more node between the Gemm's output and y.
struct SmallCnn {
  ir::Model m;
  ir::Value* x = nullptr;
  ir::Value* logits = nullptr;
  SmallCnn() {
    m.set_opset("", 17);
    ir::Graph& g = *m.graph;
    x = g.add_value("x", batched({4, 6, 6}));
    g.add_input(x);
    ir::Value* c = g.add_value("c", batched({8, 6, 6}));
    ir::Node* conv = g.add_node("Conv", {x, g.add_initializer("w", test::random_tensor({8, 4, 3, 3}, 1)),
                                         g.add_initializer("b", test::random_tensor({8}, 2))},
                                {c}, "conv");
    conv->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
    ir::Value* r = g.add_value("r", batched({8, 6, 6}));
    g.add_node("Relu", {c}, {r}, "relu");
    ir::Value* p = g.add_value("p", batched({8, 1, 1}));
    g.add_node("GlobalAveragePool", {r}, {p}, "gap");
    ir::Value* f = g.add_value("f", batched({8}));
    g.add_node("Flatten", {p}, {f}, "flatten");
    logits = g.add_value("logits", batched({3}));
    g.add_node("Gemm", {f, g.add_initializer("fc_w", test::random_tensor({3, 8}, 3)), g.add_initializer("fc_b", test::random_tensor({3}, 4))},
               {logits}, "fc")
        ->set_attr(ir::Attribute::make_int("transB", 1));
  }
  void output(ir::Value* v) { m.graph->add_output(v); }
};

std::string why_not(const ir::Model& m) {
  std::string why;
  CHECK_FALSE(rt::rows_independent(m, &why));
  return why;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace

TEST_CASE("rows_independent accepts per-row graphs and names the first node that mixes rows", "[batch_rows]") {
  SECTION("a small CNN keeps rows apart") {
    SmallCnn s;
    s.output(s.logits);
    std::string why;
    CHECK(rt::rows_independent(s.m, &why));
  }
  SECTION("Reshape, Shape and other unknown ops keep the batch whole") {
    SmallCnn s;
    ir::Value* out = s.m.graph->add_value("out");
    s.m.graph->add_node("Reshape", {s.logits, s.m.graph->add_initializer("shape", Tensor::from<int64_t>({1}, {-1}))}, {out}, "reshape");
    s.output(out);
    CHECK_THAT(why_not(s.m), Catch::Contains("reshape") && Catch::Contains("Reshape"));
  }
  SECTION("a feed-forward block keeps rows apart; with rows as its weights it does not") {
    for (const bool rows_as_weights : {false, true}) {
      ir::Model m;
      m.set_opset("", 17);
      m.set_opset("mpq", 1);
      ir::Graph& g = *m.graph;
      ir::Value* x = g.add_value("x", batched({5, 24}));
      g.add_input(x);
      ir::Value* w1 = g.add_initializer("w1", test::random_tensor({24, 32}, 1));
      ir::Value* w2 = g.add_initializer("w2", test::random_tensor({32, 24}, 2));
      if (rows_as_weights) {
        w1 = g.add_value("w1_rows", batched({32}));  // [N, 32]: a "weight" that holds rows
        g.add_input(w1);
      }
      ir::Value* y = g.add_value("y", batched({5, 24}));
      g.add_node("GeluMlp", {x, w1, g.add_initializer("b1", test::random_tensor({32}, 3)), w2,
                             g.add_initializer("b2", test::random_tensor({24}, 4))},
                 {y}, "mlp", "mpq");
      g.add_output(y);
      INFO("rows as weights " << rows_as_weights);
      if (rows_as_weights)
        CHECK_THAT(why_not(m), Catch::Contains("mlp"));
      else
        CHECK(rt::rows_independent(m));
    }
  }
  SECTION("Softmax over the batch axis, Concat along it, Gemm reading rows transposed") {
    for (const char* which : {"softmax", "concat", "gemm"}) {
      SmallCnn s;
      ir::Graph& g = *s.m.graph;
      ir::Value* out = g.add_value("out");
      if (std::string(which) == "softmax") {
        g.add_node("Softmax", {s.logits}, {out}, "mix")->set_attr(ir::Attribute::make_int("axis", 0));
      } else if (std::string(which) == "concat") {
        g.add_node("Concat", {s.logits, s.logits}, {out}, "mix")->set_attr(ir::Attribute::make_int("axis", -2));
      } else {
        g.add_node("Gemm", {s.logits, g.add_initializer("b2", test::random_tensor({2, 2}, 9))}, {out}, "mix")
            ->set_attr(ir::Attribute::make_int("transA", 1));
      }
      s.output(out);
      INFO(which);
      CHECK_THAT(why_not(s.m), Catch::Contains("mix"));
    }
  }
  SECTION("an Add of a constant with a row per batch row; with a leading 1 it broadcasts") {
    for (int64_t lead : {2, 1}) {
      SmallCnn s;
      ir::Graph& g = *s.m.graph;
      ir::Value* out = g.add_value("out");
      g.add_node("Add", {s.logits, g.add_initializer("bias", test::random_tensor({lead, 3}, 10))}, {out}, "add");
      s.output(out);
      std::string why;
      CHECK(rt::rows_independent(s.m, &why) == (lead == 1));
      if (lead != 1) CHECK_THAT(why, Catch::Contains("add") && Catch::Contains("broadcasts"));
    }
  }
  SECTION("MaxPool's indices, training-mode BatchNormalization") {
    SmallCnn s;
    ir::Graph& g = *s.m.graph;
    ir::Value* pooled = g.add_value("pooled");
    ir::Value* indices = g.add_value("indices");
    ir::Node* mp = g.add_node("MaxPool", {s.x}, {pooled, indices}, "maxpool");
    mp->set_attr(ir::Attribute::make_ints("kernel_shape", {2, 2}));
    s.output(pooled);
    CHECK_THAT(why_not(s.m), Catch::Contains("maxpool") && Catch::Contains("indices"));
  }
  SECTION("a subgraph, BatchNormalization returning its statistics, Resize by axes, blocked Q/DQ, "
          "a reduction whose axes input overrides its attribute, rows only in a convolution's Z") {
    for (const char* which : {"if", "bn", "resize", "blocked", "reduce", "z_only"}) {
      INFO(which);
      SmallCnn s;
      ir::Graph& g = *s.m.graph;
      ir::Value* out = g.add_value("out");
      const std::string w = which;
      if (w == "if") {
        // The branch reads the batch from the enclosing graph, which is no input of the If node.
        auto branch = std::make_shared<ir::Graph>("then", &g);
        ir::Value* y = branch->add_value("branch_y");
        branch->add_node("Identity", {branch->add_outer_scope_value("logits")}, {y}, "inner");
        branch->add_output(y);
        ir::Node* n = g.add_node("If", {g.add_initializer("cond", Tensor::scalar<bool>(true))}, {out}, "mix");
        n->set_attr(ir::Attribute::make_graph("then_branch", branch));
        n->set_attr(ir::Attribute::make_graph("else_branch", branch));
      } else if (w == "bn") {
        s.m.set_opset("", 12);
        // Only the saved mean (output 3) asked for: batch statistics all the same.
        ir::Value* saved_mean = g.add_value("saved_mean");
        g.add_node("BatchNormalization", {s.logits, g.add_initializer("bs", test::random_tensor({3}, 11)),
                                          g.add_initializer("bb", test::random_tensor({3}, 12)),
                                          g.add_initializer("bm", test::random_tensor({3}, 13)),
                                          g.add_initializer("bv", test::random_tensor({3}, 14, 0.5f, 1.0f))},
                   {out, nullptr, nullptr, saved_mean}, "mix");
      } else if (w == "resize") {
        ir::Node* n = g.add_node("Resize", {s.x, nullptr, g.add_initializer("scales", Tensor::from<float>({2}, {1.0f, 2.0f}))},
                                 {out}, "mix");
        n->set_attr(ir::Attribute::make_ints("axes", {2, 0}));
      } else if (w == "reduce") {
        // The kernel reads the axes input (int32 here) when there is one: axis 0.
        ir::Node* n = g.add_node("ReduceMean", {s.logits, g.add_initializer("rax", Tensor::from<int32_t>({1}, {0}))}, {out}, "mix");
        n->set_attr(ir::Attribute::make_ints("axes", {1}));
        n->set_attr(ir::Attribute::make_int("keepdims", 0));
      } else if (w == "z_only") {
        s.m.set_opset("mpq", 1);
        ir::Node* n = g.add_node("FusedConv", {g.add_initializer("cx", test::random_tensor({2, 4, 6, 6}, 16)), g.find("w"),
                                               g.find("b"), g.find("c")},
                                 {out}, "mix");
        n->domain = "mpq";
        n->set_attr(ir::Attribute::make_ints("pads", {1, 1, 1, 1}));
      } else {
        ir::Node* n = g.add_node("DequantizeLinear", {s.logits, g.add_initializer("sc", test::random_tensor({1, 3}, 15, 0.1f, 1.0f))},
                                 {out}, "mix");
        n->set_attr(ir::Attribute::make_int("axis", 0));
        n->set_attr(ir::Attribute::make_int("block_size", 2));
      }
      s.output(out);
      CHECK_THAT(why_not(s.m), Catch::Contains("mix"));
    }
  }
  SECTION("a fixed batch in the input, an output that is not computed from the rows") {
    SmallCnn s;
    s.output(s.logits);
    s.x->type = batched({4, 6, 6}, nullptr);
    CHECK_THAT(why_not(s.m), Catch::Contains("'x'") && Catch::Contains("fixed"));
    SmallCnn t;
    t.output(t.logits);
    t.output(t.m.graph->find("fc_w"));
    CHECK_THAT(why_not(t.m), Catch::Contains("'fc_w'"));
  }
}

TEST_CASE("an embedding lookup keeps rows apart; gathering the table on another axis does not", "[batch_rows]") {
  for (const int64_t axis : {0, 1}) {
    ir::Model m;
    m.set_opset("", 17);
    ir::Graph& g = *m.graph;
    ir::Value* ids = g.add_value("ids", ir::ValueType::tensor(DType::Int64, std::vector<ir::Dim>{ir::Dim::symbol("N"), ir::Dim::fixed(5)}));
    g.add_input(ids);
    ir::Value* y = g.add_value("y");
    g.add_node("Gather", {g.add_initializer("table", test::random_tensor({10, 10}, 5)), ids}, {y}, "embed")
        ->set_attr(ir::Attribute::make_int("axis", axis));
    g.add_output(y);
    std::string why;
    CHECK(rt::rows_independent(m, &why) == (axis == 0));
    if (axis != 0) CHECK_THAT(why, Catch::Contains("embed"));
  }
}

TEST_CASE("row_parts cuts a batch as the convolution split does; rows slice and join back", "[batch_rows]") {
  CHECK(rt::row_parts(8, 2) == std::vector<int64_t>{4, 4});
  CHECK(rt::row_parts(9, 2) == std::vector<int64_t>{5, 4});
  CHECK(rt::row_parts(2, 2) == std::vector<int64_t>{1, 1});
  CHECK(rt::row_parts(12, 3) == std::vector<int64_t>{4, 4, 4});
  CHECK(rt::row_parts(3, 2).empty());  // uneven with few rows per thread
  CHECK(rt::row_parts(1, 2).empty());
  CHECK(rt::row_parts(8, 1).empty());
  const Tensor t = test::random_tensor({5, 3, 2}, 7);
  const Tensor a = rt::slice_rows(t, 0, 2), b = rt::slice_rows(t, 2, 3);
  CHECK(a.shape() == Shape{2, 3, 2});
  CHECK(b.data<float>()[0] == t.data<float>()[12]);
  CHECK(same_bits(rt::concat_rows({a, b}, "t"), t));
  CHECK_THROWS_WITH(rt::concat_rows({a, test::random_tensor({1, 2, 2}, 8)}, "output 'y'"),
                    Catch::Contains("output 'y'") && Catch::Contains("[1,2,2]"));
}

TEST_CASE("a batch split over the threads by rows gives the bits of the whole one-thread run", "[batch_rows]") {
  SmallCnn s;
  s.output(s.logits);
  rt::ExecOptions one, two, kept;
  one.threads = 1;
  two.threads = 2;
  kept.threads = 2;
  kept.split_rows = false;
  rt::Executor whole(s.m, one), split(s.m, two), unsplit(s.m, kept);
  uint32_t seed = 300;
  for (const int64_t batch : {8, 9, 2, 3, 1}) {
    INFO("batch " << batch);
    const rt::Feeds feeds{{"x", test::random_tensor({batch, 4, 6, 6}, seed++)}};
    const Tensor want = whole.run(feeds)[0];
    const int64_t before = rt::row_split_count();
    const Tensor got = split.run(feeds)[0];
    const bool splits = batch >= 2 && (batch % 2 == 0 || batch >= 8);
    CHECK(rt::row_split_count() == before + (splits ? 1 : 0));
    CHECK(same_bits(got, want));
    const int64_t before_kept = rt::row_split_count();
    CHECK(same_bits(unsplit.run(feeds)[0], want));
    CHECK(rt::row_split_count() == before_kept);
  }
  SECTION("an observer sees the whole run") {
    int64_t rows_seen = 0;
    split.set_observer([&](const ir::Value& v, const Tensor& t) {
      if (v.name() == "logits") rows_seen += t.shape()[0];
    });
    const int64_t before = rt::row_split_count();
    split.run({{"x", test::random_tensor({8, 4, 6, 6}, 99)}});
    CHECK(rt::row_split_count() == before);
    CHECK(rows_seen == 8);
  }
  SECTION("a bad feed fails with the whole batch's shapes") {
    CHECK_THROWS_WITH(split.run({{"x", test::random_tensor({8, 5, 6, 6}, 98)}}), Catch::Contains("[8,5,6,6]"));
  }
}

TEST_CASE("shipped models keep rows apart, as written and fused, and split runs keep their bits", "[batch_rows]") {
  for (const char* stem : {"resnet_bn_op17", "mobilenetv3_op17", "unet_op17", "transformer_op17", "fashion/fashion_vit"}) {
    INFO(stem);
    ir::Model m = ir::load_model(test::source_dir() / "tests/models" / (std::string(stem) + ".onnx"));
    std::string why;
    CHECK(rt::rows_independent(m, &why));
    INFO(why);
    passes::fuse_for_inference(m, rt::BackendKind::CPU);
    std::string why_fused;
    CHECK(rt::rows_independent(m, &why_fused));
    INFO(why_fused);
    rt::ExecOptions one, two;
    one.threads = 1;
    two.threads = 2;
    rt::Executor whole(m, one), split(m, two);
    Shape shape{8};
    for (size_t d = 1; d < m.graph->inputs()[0]->type.dims.size(); ++d) shape.push_back(m.graph->inputs()[0]->type.dims[d].value);
    const Tensor x = test::random_tensor(shape, 17, -2.0f, 2.0f);
    const int64_t before = rt::row_split_count();
    const std::vector<Tensor> got = split.run({{m.graph->inputs()[0]->name(), x}});
    CHECK(rt::row_split_count() == before + 1);
    const std::vector<Tensor> want = whole.run({{m.graph->inputs()[0]->name(), x}});
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) CHECK(same_bits(got[i], want[i]));
  }
}

namespace {

// x[N, 4, 6] -> Reshape to [Shape(x)[0], 4, 2, 3] -> Transpose [1, 0, 2, 3] -> Gather(axis 0, 1) ->
// y[N, 2, 3], as attention heads are split off and picked: the batch size flows through Shape,
// Gather, Unsqueeze and Concat, the rows move to axis 1 and back. `variant` breaks one step.
ir::Model heads_graph(const std::string& variant) {
  ir::Model m;
  m.set_opset("", 17);
  ir::Graph& g = *m.graph;
  ir::Value* x = g.add_value("x", batched({4, 6}));
  g.add_input(x);
  auto i64 = [&](const char* name, Shape shape, std::vector<int64_t> v) {
    return g.add_initializer(name, Tensor::from<int64_t>(shape, v));
  };
  ir::Value* shape = g.add_value("shape");
  g.add_node("Shape", {x}, {shape}, "shape_of_x");
  ir::Value* n = g.add_value("n");
  g.add_node("Gather", {shape, i64("which", {}, {variant == "second_dim" ? 1 : 0})}, {n}, "batch_size");
  ir::Value* size = n;
  if (variant == "arithmetic") {
    size = g.add_value("doubled");
    g.add_node("Mul", {n, i64("two", {}, {2})}, {size}, "double_batch");
  }
  ir::Value* n1 = g.add_value("n1");
  g.add_node("Unsqueeze", {size, i64("axes", {1}, {0})}, {n1}, "unsqueeze");
  ir::Value* target = g.add_value("target");
  g.add_node("Concat", {n1, i64("rest", {3}, {4, 2, 3})}, {target}, "concat")->set_attr(ir::Attribute::make_int("axis", 0));
  ir::Value* r = g.add_value("r");
  g.add_node("Reshape", {x, target}, {r}, "reshape");
  ir::Value* t = g.add_value("t");
  g.add_node("Transpose", {r}, {t}, "transpose")->set_attr(ir::Attribute::make_ints("perm", {1, 0, 2, 3}));
  if (variant == "moved_output") {
    g.add_output(t);
    return m;
  }
  ir::Value* in = t;
  if (variant == "relu_moved") {
    in = g.add_value("relu");
    g.add_node("Relu", {t}, {in}, "relu_on_moved");
  }
  ir::Value* y = g.add_value("y");
  g.add_node("Gather", {in, i64("head", {}, {1})}, {y}, "pick")
      ->set_attr(ir::Attribute::make_int("axis", variant == "gather_batch" ? 1 : 0));
  g.add_output(y);
  return m;
}

}  // namespace

TEST_CASE("the batch size through Shape and the rows through Transpose and Gather", "[batch_rows]") {
  SECTION("heads split off and picked keep rows apart, and split runs keep their bits") {
    ir::Model m = heads_graph("");
    std::string why;
    REQUIRE(rt::rows_independent(m, &why));
    rt::ExecOptions one, two;
    one.threads = 1;
    two.threads = 2;
    rt::Executor whole(m, one), split(m, two);
    for (const int64_t batch : {8, 9}) {
      const rt::Feeds feeds{{"x", test::random_tensor({batch, 4, 6}, static_cast<uint32_t>(batch))}};
      const int64_t before = rt::row_split_count();
      const Tensor got = split.run(feeds)[0];
      CHECK(rt::row_split_count() == before + 1);
      CHECK(got.shape() == Shape{batch, 2, 3});
      CHECK(same_bits(got, whole.run(feeds)[0]));
    }
  }
  SECTION("each broken step is named") {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"second_dim", "reshape"}, {"arithmetic", "double_batch"}, {"moved_output", "output 't'"},
        {"relu_moved", "relu_on_moved"}, {"gather_batch", "pick"}};
    for (const auto& [variant, named] : cases) {
      INFO(variant);
      CHECK_THAT(why_not(heads_graph(variant)), Catch::Contains(named));
    }
  }
}

TEST_CASE("a host block freed on a thread is kept for that thread, and returned when it ends", "[batch_rows][memory]") {
  // An odd size, in a size class nothing else here uses.
  constexpr size_t kBytes = 3 * 1000 * 1000 + 7;
  std::promise<void*> freed;
  std::promise<void> go_on;
  std::promise<void*> again;
  std::promise<void> finish;
  std::thread worker([&] {
    std::shared_ptr<void> block = host_alloc(kBytes);
    void* raw = block.get();
    block.reset();  // into this thread's cache
    freed.set_value(raw);
    go_on.get_future().wait();
    again.set_value(host_alloc(kBytes).get());  // taken back here, freed again at once
    finish.get_future().wait();
  });
  void* first = freed.get_future().get();
  {
    // Another thread does not get the worker's block while the worker keeps it.
    std::shared_ptr<void> mine = host_alloc(kBytes);
    CHECK(mine.get() != first);
  }
  go_on.set_value();
  CHECK(again.get_future().get() == first);
  const size_t before = host_cache_bytes();
  finish.set_value();
  worker.join();  // its kept block goes to the shared cache
  CHECK(host_cache_bytes() >= before + kBytes);
}
