// import → export → import of every model in ONNX's test data gives an identical text dump, and
// the exported file passes the ONNX checker wherever the original does.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <iostream>

#include "ir/dump.h"
#include "ir/onnx_io.h"
#include "ir/onnx_tools.h"
#include "ir/verify.h"
#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;

namespace {

struct RoundTripStats {
  int models = 0, identical = 0, checked = 0, check_ok = 0, check_skipped = 0;
  std::vector<std::string> problems;
};

void round_trip_suite(const std::string& suite, RoundTripStats& s, const fs::path& tmp) {
  fs::path root = test::testdata_dir() / suite;
  REQUIRE(fs::exists(root));
  std::vector<fs::path> models;
  for (const auto& e : fs::directory_iterator(root))
    if (fs::exists(e.path() / "model.onnx")) models.push_back(e.path() / "model.onnx");
  std::sort(models.begin(), models.end());
  for (const fs::path& path : models) {
    std::string name = path.parent_path().filename().string();
    ++s.models;
    try {
      ir::Model a = ir::load_model(path);
      auto problems = ir::verify(a);
      if (!problems.empty()) {
        s.problems.push_back(name + ": verify: " + problems.front());
        continue;
      }
      std::string dump_a = ir::dump(a);
      fs::path out = tmp / (suite + "__" + name + ".onnx");
      ir::save_model(a, out);
      ir::Model b = ir::load_model(out);
      std::string dump_b = ir::dump(b);
      if (dump_a == dump_b) ++s.identical;
      else s.problems.push_back(name + ": text dump differs after round trip");
      ir::CheckResult original = ir::check_model(a);
      ir::CheckResult exported = ir::check_model(b);
      if (!exported.ran) {
        ++s.check_skipped;
      } else {
        ++s.checked;
        if (exported.ok || !original.ok) ++s.check_ok;
        else s.problems.push_back(name + ": exported model fails the checker: " + exported.message);
      }
    } catch (const std::exception& e) {
      s.problems.push_back(name + ": " + e.what());
    }
  }
}

}  // namespace

TEST_CASE("every ONNX test-data model round-trips through the IR", "[ir][roundtrip]") {
  // Exports stay in the build tree: the ctest `ort_loads_exported_models` loads them in ONNX Runtime.
  fs::path out_dir = fs::path(MPQ_TEST_OUT_DIR) / "roundtrip";
  fs::remove_all(out_dir);
  fs::create_directories(out_dir);
  RoundTripStats s;
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator", "simple"}) round_trip_suite(suite, s, out_dir);
  std::cout << fmt::format("round trip: {} models, {} identical dumps, checker ran on {} ({} passed), {} not checkable "
                           "by libonnx 1.12\n",
                           s.models, s.identical, s.checked, s.check_ok, s.check_skipped);
  for (const auto& p : s.problems) std::cout << "  " << p << "\n";
  CHECK(s.models > 1000);
  CHECK(s.problems.empty());
  CHECK(s.identical == s.models);
}
