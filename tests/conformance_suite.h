#pragma once
// Runs ONNX's own backend test cases (Debian libonnx-testdata) through the executor and compares
// with their expected outputs. A case whose ops are all supported must pass, unless it is listed
// with its reason in a tests/runtime/conformance_known_failures*.txt file. Shared by
// tests/runtime/conformance_test.cpp (CPU) and tests/cuda/cuda_conformance_test.cpp (the CUDA path).
//
// MPQ_CONFORMANCE_FILTER=<regex> restricts the cases (handy while writing a kernel);
// MPQ_CONFORMANCE_VERBOSE=1 prints every failure in full.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>

#include "ir/onnx_io.h"
#include "ir/verify.h"
#include "runtime/executor.h"
#include "test_util.h"

namespace mpq::test::conformance {

namespace fs = std::filesystem;

struct KnownFailures {
  std::map<std::string, std::string> reasons;
};

// Every tests/runtime/conformance_known_failures*.txt: "<case name> <reason>" per line.
inline KnownFailures load_known_failures() {
  KnownFailures k;
  for (const auto& e : fs::directory_iterator(test::source_dir() / "tests/runtime")) {
    std::string file = e.path().filename().string();
    if (file.rfind("conformance_known_failures", 0) != 0 || e.path().extension() != ".txt") continue;
    std::ifstream in(e.path());
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      auto sp = line.find_first_of(" \t");
      std::string name = line.substr(0, sp);
      std::string reason = sp == std::string::npos ? "" : line.substr(line.find_first_not_of(" \t", sp));
      INFO("known failure '" << name << "' needs a reason in " << file);
      REQUIRE(!reason.empty());
      k.reasons[name] = reason;
    }
  }
  return k;
}

// ONNX 1.12's test data stores bfloat16 tensors with data_type UINT16; read them as the bfloat16
// bit patterns they are when the model declares bfloat16.
inline Tensor as_declared(Tensor t, const ir::ValueType& declared) {
  if (t.dtype() == DType::UInt16 && declared.is_tensor() && declared.elem == DType::BFloat16)
    return Tensor::wrap(DType::BFloat16, t.shape(), t.buffer());
  return t;
}

// Compares one output; returns an empty string when it matches.
inline std::string compare(const Tensor& got, const Tensor& want, const std::string& name) {
  if (got.dtype() != want.dtype())
    return fmt::format("output '{}': dtype {} but expected {}", name, dtype_name(got.dtype()), dtype_name(want.dtype()));
  if (got.shape() != want.shape())
    return fmt::format("output '{}': shape {} but expected {}", name, shape_str(got.shape()), shape_str(want.shape()));
  if (got.dtype() == DType::String) {
    if (got.strings() != want.strings()) return fmt::format("output '{}': strings differ", name);
    return {};
  }
  const bool is_float = dtype_is_float(got.dtype());
  // ONNX's backend tests use rtol=1e-3, atol=1e-7; half types get the tolerance of their precision.
  double rtol = 1e-3, atol = 1e-7;
  if (got.dtype() == DType::Float16) atol = 1e-3;
  if (got.dtype() == DType::BFloat16) {
    rtol = 1e-2;
    atol = 1e-2;
  }
  int64_t bad = 0;
  int64_t first_bad = -1;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (is_float) {
      double a = got.get_double(i), b = want.get_double(i);
      if (std::isnan(b)) {
        if (!std::isnan(a)) ++bad;
      } else if (std::isinf(b)) {
        if (a != b) ++bad;
      } else if (!(std::fabs(a - b) <= atol + rtol * std::fabs(b))) {
        ++bad;
      } else {
        continue;
      }
    } else {
      if (got.get_int64(i) == want.get_int64(i)) continue;
      ++bad;
    }
    if (first_bad < 0) first_bad = i;
  }
  if (bad == 0) return {};
  return fmt::format("output '{}': {} of {} values differ; first at {}: got {} expected {}", name, bad, got.numel(),
                     first_bad, got.get_double(first_bad), want.get_double(first_bad));
}

struct SuiteResult {
  int passed = 0, failed = 0, known = 0, unsupported = 0, unexpected_pass = 0;
  std::map<std::string, int> unsupported_ops;
  std::vector<std::string> failures;
};

// Runs one case folder; returns "" on pass, "unsupported: ..." or a failure message.
inline std::string run_case(const fs::path& dir, std::map<std::string, int>& unsupported_ops, const rt::ExecOptions& opts) {
  ir::Model model = ir::load_model(dir / "model.onnx");
  auto problems = ir::verify(model);
  if (!problems.empty()) return "verify: " + problems.front();
  auto missing = rt::unsupported_ops(model);
  if (!missing.empty()) {
    for (const auto& op : missing) ++unsupported_ops[op];
    return "unsupported: " + fmt::format("{}", fmt::join(missing, ","));
  }
  std::vector<ir::Value*> inputs = model.graph->required_inputs();
  for (ir::Value* v : inputs)
    if (!v->type.is_tensor()) {
      ++unsupported_ops["<non-tensor input>"];
      return "unsupported: non-tensor input " + v->name();
    }
  for (ir::Value* v : model.graph->outputs())
    if (!v->type.is_tensor()) {
      ++unsupported_ops["<non-tensor output>"];
      return "unsupported: non-tensor output " + v->name();
    }
  std::vector<fs::path> sets;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(e.path());
  std::sort(sets.begin(), sets.end());
  std::vector<rt::Feeds> set_feeds;
  for (const fs::path& set : sets) {
    rt::Feeds feeds;
    for (size_t k = 0;; ++k) {
      fs::path f = set / fmt::format("input_{}.pb", k);
      if (!fs::exists(f)) break;
      if (k >= inputs.size()) return fmt::format("{}: more input files than model inputs", set.filename().string());
      Tensor t = as_declared(ir::load_tensor_pb(f), inputs[k]->type);
      // A few ONNX 1.12 cases (CastLike's 'like') ship data whose shape contradicts the declared
      // input; ONNX's own runner ignores declared shapes, so follow the data there.
      auto declared = inputs[k]->type.static_shape();
      if (set_feeds.empty() && declared && *declared != t.shape() && inputs[k]->type.elem == t.dtype())
        inputs[k]->type = ir::ValueType::tensor(t.dtype(), t.shape());
      feeds[inputs[k]->name()] = std::move(t);
    }
    set_feeds.push_back(std::move(feeds));
  }
  rt::Executor exec(model, opts);
  for (size_t s = 0; s < sets.size(); ++s) {
    const fs::path& set = sets[s];
    const rt::Feeds& feeds = set_feeds[s];
    std::vector<Tensor> outs = exec.run(feeds);
    for (size_t k = 0; k < outs.size(); ++k) {
      fs::path f = set / fmt::format("output_{}.pb", k);
      if (!fs::exists(f)) continue;
      Tensor want = as_declared(ir::load_tensor_pb(f), model.graph->outputs()[k]->type);
      std::string diff = compare(outs[k], want, exec.output_names()[k]);
      if (!diff.empty()) return set.filename().string() + ": " + diff;
    }
  }
  return {};
}

// `opts` selects the backend (the CUDA path with the host kernel table in tests/cuda); `tag` names
// the run in the summary line.
inline SuiteResult run_suite(const std::string& suite, const rt::ExecOptions& opts = {}, const std::string& tag = "") {
  SuiteResult r;
  fs::path root = test::testdata_dir() / suite;
  INFO("ONNX test data missing: install Debian's libonnx-testdata (scripts/setup.sh)");
  REQUIRE(fs::exists(root));
  static const KnownFailures known = load_known_failures();
  const char* filter_env = std::getenv("MPQ_CONFORMANCE_FILTER");
  const bool verbose = std::getenv("MPQ_CONFORMANCE_VERBOSE") != nullptr;
  std::regex filter(filter_env ? filter_env : ".*");
  std::vector<fs::path> cases;
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && fs::exists(e.path() / "model.onnx")) cases.push_back(e.path());
  std::sort(cases.begin(), cases.end());
  for (const fs::path& c : cases) {
    std::string name = c.filename().string();
    if (!std::regex_search(name, filter)) continue;
    std::string result;
    try {
      result = run_case(c, r.unsupported_ops, opts);
    } catch (const Error& e) {
      result = std::string(e.kind() == ErrorKind::Unsupported ? "unsupported: " : "error: ") + e.what();
      if (e.kind() == ErrorKind::Unsupported) ++r.unsupported_ops["<" + std::string(e.what()).substr(0, 60) + ">"];
    } catch (const std::exception& e) {
      result = std::string("exception: ") + e.what();
    }
    auto k = known.reasons.find(name);
    if (result.rfind("unsupported: ", 0) == 0) {
      ++r.unsupported;
    } else if (result.empty()) {
      ++r.passed;
      if (k != known.reasons.end()) {
        ++r.unexpected_pass;
        std::cout << fmt::format("[{}] {} passes but is listed as a known failure\n", suite, name);
      }
    } else if (k != known.reasons.end()) {
      ++r.known;
      if (verbose) std::cout << fmt::format("[{}] known failure {}: {}\n", suite, name, result);
    } else {
      ++r.failed;
      r.failures.push_back(name + ": " + result);
    }
  }
  std::cout << fmt::format("conformance {}{}: {} passed, {} failed, {} known failures, {} unsupported\n", suite, tag, r.passed,
                           r.failed, r.known, r.unsupported);
  if (!r.unsupported_ops.empty()) {
    std::vector<std::string> ops;
    for (const auto& [op, n] : r.unsupported_ops) ops.push_back(fmt::format("{}({})", op, n));
    std::cout << fmt::format("  unsupported ops: {}\n", fmt::join(ops, " "));
  }
  for (const std::string& f : r.failures) std::cout << "  FAIL " << f << "\n";
  return r;
}


}  // namespace mpq::test::conformance
