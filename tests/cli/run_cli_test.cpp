// `mpq run`: --profile's per-op-type table and --profile-nodes' per-node one (JSON and text), their
// usage errors, and the inference graph `mpq run` builds (folded BatchNorm, fused activations,
// channel-blocked convolutions) giving the outputs of the graph as written (--no-fusion).
#include <catch2/catch.hpp>

#include <sched.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/npy.h"
#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;

namespace {

fs::path model_path(const std::string& name) { return test::source_dir() / "tests" / "models" / (name + ".onnx"); }
fs::path data_path(const std::string& name) { return test::source_dir() / "tests" / "models" / (name + "_data"); }

}  // namespace

TEST_CASE("mpq run --profile reports time per op type over the timed runs", "[cli][run][profile]") {
  const auto r = test::run_mpq({"run", model_path("resnet_bn_op17").string(), "--data", data_path("resnet_bn_op17").string(),
                                "--max-samples", "1", "--repeat", "3", "--threads", "1", "--profile", "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j.contains("profile"));
  double share = 0;
  bool saw_conv = false;
  for (const auto& row : j["profile"]) {
    share += row["share"].get<double>();
    CHECK(row["ms_per_run"].get<double>() >= 0.0);
    if (row["op"] == "mpq::FusedConv") {
      saw_conv = true;
      CHECK(row["calls_per_run"].get<double>() == 9.0);  // the model's nine Conv(+BN+Relu) nodes
    }
    CHECK(row["op"] != "BatchNormalization");  // folded into the convolutions
  }
  CHECK(saw_conv);
  CHECK(share > 0.0);
  CHECK(share <= 1.0 + 1e-9);

  const auto text = test::run_mpq({"run", model_path("resnet_bn_op17").string(), "--data",
                                   data_path("resnet_bn_op17").string(), "--max-samples", "1", "--repeat", "2",
                                   "--profile"});
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("time per op type") && Catch::Contains("mpq::FusedConv") &&
                           Catch::Contains("(between nodes)"));
}

namespace {

// Sets (or, with nullptr, unsets) an environment variable for the scope; mpq inherits it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace

TEST_CASE("mpq run says how its idle threads wait", "[cli][run]") {
  const std::vector<std::string> args{"run", model_path("resnet_bn_op17").string(), "--data",
                                      data_path("resnet_bn_op17").string(), "--max-samples", "1", "--threads", "2"};
  auto with = [&](const std::string& extra) {
    std::vector<std::string> a = args;
    if (!extra.empty()) a.push_back(extra);
    return test::run_mpq(a);
  };
  ScopedEnv set_by_main("MPQ_THREAD_ENV_SET", nullptr), chosen("MPQ_IDLE_THREADS", nullptr);
  SECTION("the user's OMP_WAIT_POLICY is kept and reported as theirs") {
    ScopedEnv policy("OMP_WAIT_POLICY", "PASSIVE"), spin("GOMP_SPINCOUNT", nullptr);
    const auto j = with("--json");
    INFO(j.err);
    REQUIRE(j.exit_code == 0);
    CHECK(nlohmann::json::parse(j.out)["idle_threads"] == "user");
    const auto text = with("");
    REQUIRE(text.exit_code == 0);
    CHECK_THAT(text.out, Catch::Contains("(cpu, 2 threads, idle threads user)"));
  }
  SECTION("otherwise mpq's own choice: spin on a quiet machine, sleep on a busy one") {
    ScopedEnv policy("OMP_WAIT_POLICY", nullptr), spin("GOMP_SPINCOUNT", nullptr);
    const auto j = with("--json");
    INFO(j.err);
    REQUIRE(j.exit_code == 0);
    const std::string mode = nlohmann::json::parse(j.out)["idle_threads"].get<std::string>();
    CHECK((mode == "spin" || mode == "sleep"));
  }
}

namespace {

// Restricts the calling thread (and so the mpq it starts) to its first allowed CPU for the scope.
class ScopedOneCpu {
 public:
  ScopedOneCpu() {
    sched_getaffinity(0, sizeof old_, &old_);
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &old_)) {
        CPU_SET(c, &one);
        break;
      }
    sched_setaffinity(0, sizeof one, &one);
  }
  ~ScopedOneCpu() { sched_setaffinity(0, sizeof old_, &old_); }

 private:
  cpu_set_t old_;
};

int cpus_of_this_thread() {
  cpu_set_t set;
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

}  // namespace

TEST_CASE("mpq run uses the CPUs it may run on, also where OpenMP binds threads", "[cli][run][threads]") {
  const std::vector<std::string> args{"run", model_path("resnet_bn_op17").string(), "--data",
                                      data_path("resnet_bn_op17").string(), "--max-samples", "1", "--json"};
  auto with = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> a = args;
    a.insert(a.end(), extra.begin(), extra.end());
    return test::run_mpq(a);
  };
  ScopedEnv set_by_main("MPQ_THREAD_ENV_SET", nullptr), chosen("MPQ_IDLE_THREADS", nullptr);
  const int cpus = cpus_of_this_thread();
  if (cpus < 2) {
    WARN("skipped: this machine lets the test run on " << cpus << " CPU(s); the check needs 2");
    return;
  }
  SECTION("OMP_PROC_BIND=close: the process mpq re-runs as keeps every CPU") {
    // libgomp pins the first process's initial thread to one CPU before main; without widening
    // its mask before execv, the re-run process would have one CPU for two threads.
    ScopedEnv bind("OMP_PROC_BIND", "close");
    const auto r = with({"--threads", "2"});
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(nlohmann::json::parse(r.out)["cpus_allowed"] == cpus);
    CHECK_THAT(r.err, !Catch::Contains("take turns"));
  }
  SECTION("one allowed CPU (taskset): one thread by default, a warning for more") {
    ScopedOneCpu one;
    const auto by_default = with({});
    INFO(by_default.err);
    REQUIRE(by_default.exit_code == 0);
    const auto j = nlohmann::json::parse(by_default.out);
    CHECK(j["cpus_allowed"] == 1);
    CHECK(j["threads"] == 1);
    CHECK_THAT(by_default.err, !Catch::Contains("take turns"));
    const auto two = with({"--threads", "2"});
    REQUIRE(two.exit_code == 0);
    CHECK(nlohmann::json::parse(two.out)["threads"] == 2);
    CHECK_THAT(two.err, Catch::Contains("2 threads asked for") && Catch::Contains("1 CPU(s)") &&
                            Catch::Contains("--threads 1"));
  }
}

TEST_CASE("mpq run --profile without --repeat is a usage error", "[cli][run][profile][negative]") {
  const auto r = test::run_mpq({"run", model_path("resnet_bn_op17").string(), "--data", data_path("resnet_bn_op17").string(),
                                "--profile"});
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.err, Catch::Contains("--profile") && Catch::Contains("--repeat"));
}

TEST_CASE("mpq run --profile-nodes reports time per node", "[cli][run][profile]") {
  const auto r = test::run_mpq({"run", model_path("resnet_bn_op17").string(), "--data", data_path("resnet_bn_op17").string(),
                                "--max-samples", "1", "--repeat", "3", "--threads", "1", "--profile-nodes", "--json"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  REQUIRE(j.contains("profile"));
  int convs = 0;
  double share = 0, previous = 1e30;
  for (const auto& row : j["profile"]) {
    REQUIRE(row.contains("node"));
    CHECK(row["calls_per_run"].get<double>() == 1.0);  // one row per node
    CHECK(row["ms_per_run"].get<double>() <= previous);  // slowest first
    previous = row["ms_per_run"].get<double>();
    share += row["share"].get<double>();
    convs += row["op"] == "mpq::FusedConv";
  }
  CHECK(convs == 9);
  CHECK(share <= 1.0 + 1e-9);
  const auto text = test::run_mpq({"run", model_path("resnet_bn_op17").string(), "--data",
                                   data_path("resnet_bn_op17").string(), "--max-samples", "1", "--repeat", "2",
                                   "--profile-nodes"});
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("time per node") && Catch::Contains("mpq::FusedConv"));
  const auto both = test::run_mpq({"run", model_path("resnet_bn_op17").string(), "--data",
                                   data_path("resnet_bn_op17").string(), "--repeat", "2", "--profile", "--profile-nodes"});
  CHECK(both.exit_code == 2);
  CHECK_THAT(both.err, Catch::Contains("--profile-nodes"));
  const auto no_repeat = test::run_mpq({"run", model_path("resnet_bn_op17").string(), "--data",
                                        data_path("resnet_bn_op17").string(), "--profile-nodes"});
  CHECK(no_repeat.exit_code == 2);
  CHECK_THAT(no_repeat.err, Catch::Contains("--profile-nodes") && Catch::Contains("--repeat"));
}

TEST_CASE("mpq run's inference graph gives the outputs of the graph as written", "[cli][run][blocked]") {
  // resnet_bn: BatchNorm folded, residual Add and Relu fused, every tensor between convolutions
  // channel-blocked; mobilenetv3: depthwise and pointwise chains, HardSwish, squeeze-excitation.
  for (const std::string name : {"resnet_bn_op17", "mobilenetv3_op17"}) {
    INFO(name);
    const fs::path tmp = fs::temp_directory_path() / ("mpq_run_cli_" + name);
    fs::remove_all(tmp);
    for (const bool fused : {true, false}) {
      std::vector<std::string> args{"run", model_path(name).string(), "--data", data_path(name).string(),
                                    "--max-samples", "2", "--outputs", (tmp / (fused ? "fused" : "plain")).string()};
      if (!fused) args.push_back("--no-fusion");
      const auto r = test::run_mpq(args);
      INFO(r.err);
      REQUIRE(r.exit_code == 0);
    }
    int compared = 0;
    for (const auto& f : fs::recursive_directory_iterator(tmp / "fused")) {
      if (f.path().extension() != ".npy") continue;
      const fs::path other = tmp / "plain" / fs::relative(f.path(), tmp / "fused");
      CHECK(test::rel_l2(data::read_npy(f.path()), data::read_npy(other)) < 1e-5);
      ++compared;
    }
    CHECK(compared >= 2);
    fs::remove_all(tmp);
  }
}
