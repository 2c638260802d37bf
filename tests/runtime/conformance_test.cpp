// ONNX's backend test cases on the CPU executor (tests/conformance_suite.h).
#include "conformance_suite.h"

using namespace mpq;
using test::conformance::run_suite;
using test::conformance::SuiteResult;

TEST_CASE("ONNX backend conformance: node", "[conformance]") {
  SuiteResult r = run_suite("node");
  CHECK(r.failed == 0);
  CHECK(r.unexpected_pass == 0);
}

TEST_CASE("ONNX backend conformance: pytorch-converted", "[conformance]") {
  SuiteResult r = run_suite("pytorch-converted");
  CHECK(r.failed == 0);
  CHECK(r.unexpected_pass == 0);
}

TEST_CASE("ONNX backend conformance: pytorch-operator", "[conformance]") {
  SuiteResult r = run_suite("pytorch-operator");
  CHECK(r.failed == 0);
  CHECK(r.unexpected_pass == 0);
}

TEST_CASE("ONNX backend conformance: simple", "[conformance]") {
  SuiteResult r = run_suite("simple");
  CHECK(r.failed == 0);
  CHECK(r.unexpected_pass == 0);
}
