#include <fmt/format.h>

#include <iostream>
#include <map>
#include <set>

#include "cli.h"
#include "ir/dump.h"
#include "ir/onnx_io.h"
#include "ir/verify.h"

namespace mpq::cli {

namespace {

struct Stats {
  std::map<std::string, int64_t> op_counts;
  int64_t nodes = 0;
  int64_t subgraph_nodes = 0;
  std::map<std::string, std::pair<int64_t, uint64_t>> params_by_dtype;  // count, bytes
  int64_t initializers = 0;
  std::set<std::string> domains;
};

void collect(const ir::Graph& g, bool nested, Stats& s) {
  for (ir::Value* v : g.initializers()) {
    auto& [count, bytes] = s.params_by_dtype[dtype_name(v->initializer().dtype())];
    count += v->initializer().numel();
    bytes += v->initializer().nbytes();
    ++s.initializers;
  }
  for (const auto& n : g.nodes()) {
    std::string op = n->domain.empty() ? n->op_type : n->domain + "::" + n->op_type;
    ++s.op_counts[op];
    (nested ? s.subgraph_nodes : s.nodes)++;
    if (!n->domain.empty()) s.domains.insert(n->domain);
    if (n->op_type == "Constant")
      if (const Tensor* t = n->attr_tensor("value")) {
        auto& [count, bytes] = s.params_by_dtype[dtype_name(t->dtype())];
        count += t->numel();
        bytes += t->nbytes();
      }
    for (ir::Graph* sub : n->subgraphs()) collect(*sub, true, s);
  }
}

nlohmann::json dims_json(const ir::ValueType& t) {
  if (!t.is_tensor() || !t.has_shape) return nullptr;
  nlohmann::json dims = nlohmann::json::array();
  for (const auto& d : t.dims) {
    if (d.known()) dims.push_back(d.value);
    else if (!d.param.empty()) dims.push_back(d.param);
    else dims.push_back(nullptr);
  }
  return dims;
}

nlohmann::json values_json(const std::vector<ir::Value*>& values) {
  nlohmann::json arr = nlohmann::json::array();
  for (ir::Value* v : values) {
    arr.push_back({{"name", v->name()},
                   {"dtype", v->type.is_tensor() ? dtype_name(v->type.elem) : "non-tensor"},
                   {"shape", dims_json(v->type)},
                   {"type", v->type.str()}});
  }
  return arr;
}

int inspect(const std::string& path, bool json, bool graph) {
  ir::Model m = ir::load_model(path);
  ir::verify_or_throw(m);
  Stats s;
  collect(*m.graph, false, s);
  int64_t param_count = 0;
  uint64_t param_bytes = 0;
  for (const auto& [dt, cb] : s.params_by_dtype) {
    param_count += cb.first;
    param_bytes += cb.second;
  }
  std::vector<ir::Value*> inputs = m.graph->required_inputs();
  if (json) {
    nlohmann::json j;
    j["path"] = path;
    j["ir_version"] = m.ir_version;
    j["opsets"] = nlohmann::json::object();
    for (const auto& o : m.opset_imports) j["opsets"][o.domain.empty() ? "ai.onnx" : o.domain] = o.version;
    j["producer"] = {{"name", m.producer_name}, {"version", m.producer_version}};
    j["inputs"] = values_json(inputs);
    j["outputs"] = values_json(m.graph->outputs());
    j["node_count"] = s.nodes;
    j["subgraph_node_count"] = s.subgraph_nodes;
    j["op_types"] = s.op_counts;
    nlohmann::json by = nlohmann::json::object();
    for (const auto& [dt, cb] : s.params_by_dtype) by[dt] = {{"count", cb.first}, {"bytes", cb.second}};
    j["parameters"] = {{"count", param_count}, {"bytes", param_bytes}, {"initializers", s.initializers}, {"by_dtype", by}};
    j["external_data"] = nlohmann::json::array();
    for (const auto& [file, bytes] : m.external_files) j["external_data"].push_back({{"file", file}, {"bytes", bytes}});
    j["custom_domains"] = s.domains;
    j["metadata"] = nlohmann::json::object();
    for (const auto& [k, v] : m.metadata) j["metadata"][k] = v;
    if (graph) j["graph"] = ir::dump(m);
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::vector<std::string> opsets;
  for (const auto& o : m.opset_imports) opsets.push_back(fmt::format("{} {}", o.domain.empty() ? "ai.onnx" : o.domain, o.version));
  std::cout << path << "\n";
  std::cout << fmt::format("  IR version {}, opsets: {}\n", m.ir_version, fmt::join(opsets, ", "));
  if (!m.producer_name.empty()) std::cout << fmt::format("  producer: {} {}\n", m.producer_name, m.producer_version);
  std::cout << "  inputs:\n";
  for (ir::Value* v : inputs) std::cout << fmt::format("    {}: {}\n", v->name(), v->type.str());
  std::cout << "  outputs:\n";
  for (ir::Value* v : m.graph->outputs()) std::cout << fmt::format("    {}: {}\n", v->name(), v->type.str());
  std::vector<std::pair<std::string, int64_t>> ops(s.op_counts.begin(), s.op_counts.end());
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::cout << fmt::format("  nodes: {}{} ({} op types)\n", s.nodes,
                           s.subgraph_nodes ? fmt::format(" + {} in subgraphs", s.subgraph_nodes) : "", ops.size());
  std::vector<std::string> op_strs;
  for (const auto& [op, n] : ops) op_strs.push_back(fmt::format("{} {}", op, n));
  for (size_t i = 0; i < op_strs.size(); i += 6) {
    std::vector<std::string> line(op_strs.begin() + static_cast<long>(i),
                                  op_strs.begin() + static_cast<long>(std::min(op_strs.size(), i + 6)));
    std::cout << "    " << fmt::format("{}", fmt::join(line, ", ")) << "\n";
  }
  std::cout << fmt::format("  parameters: {} in {} initializers ({})\n", human_count(static_cast<double>(param_count)),
                           s.initializers, human_bytes(static_cast<double>(param_bytes)));
  for (const auto& [dt, cb] : s.params_by_dtype)
    std::cout << fmt::format("    {}: {} ({})\n", dt, human_count(static_cast<double>(cb.first)), human_bytes(static_cast<double>(cb.second)));
  if (m.external_files.empty()) {
    std::cout << "  external data: none\n";
  } else {
    std::cout << "  external data:\n";
    for (const auto& [file, bytes] : m.external_files)
      std::cout << fmt::format("    {} ({})\n", file, human_bytes(static_cast<double>(bytes)));
  }
  std::cout << "  custom domains: " << (s.domains.empty() ? std::string("none") : fmt::format("{}", fmt::join(s.domains, ", "))) << "\n";
  for (const auto& [k, v] : m.metadata) std::cout << fmt::format("  metadata {}: {}\n", k, v);
  if (graph) std::cout << "\n" << ir::dump(m);
  return 0;
}

}  // namespace

void setup_inspect(CLI::App& sub, Action& action) {
  struct Opts {
    std::string model;
    bool json = false;
    bool graph = false;
  };
  auto o = std::make_shared<Opts>();
  sub.add_option("MODEL", o->model, "ONNX model file")->required();
  sub.add_flag("--json", o->json, "print one JSON object to stdout (op_types maps op type to count)");
  sub.add_flag("--graph", o->graph, "also print the readable text dump of the graph");
  sub.footer("Example: mpq inspect model.onnx --json");
  sub.callback([&action, o] { action = [o] { return inspect(o->model, o->json, o->graph); }; });
}

}  // namespace mpq::cli
