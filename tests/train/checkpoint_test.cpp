// Checkpoint files: exact round-trip of tensors and metadata, atomic replacement, and clear
// errors for truncated, corrupted or foreign files.
#include <catch2/catch.hpp>

#include <fstream>

#include "core/file_io.h"
#include "test_util.h"
#include "train/checkpoint.h"

using namespace mpq;
using namespace mpq::train;

TEST_CASE("Checkpoint round-trips tensors of every type and its metadata", "[train][checkpoint]") {
  Checkpoint c;
  c.put("w", test::random_tensor({3, 5, 7}, 1));
  c.put("d", test::random_tensor({4}, 2).cast_to(DType::Float64));
  c.put("i", Tensor::from<int64_t>({2}, {-5, 1234567890123}));
  c.put("h", test::random_tensor({9}, 3).cast_to(DType::Float16));
  c.put("empty", Tensor::zeros(DType::Float32, {0, 3}));
  c.meta()["step"] = 42;
  c.meta()["model"] = "abc";
  test::TempDir dir;
  c.save(dir / "a.ckpt");
  const Checkpoint r = Checkpoint::load(dir / "a.ckpt");
  CHECK(r.meta().at("step").get<int>() == 42);
  CHECK(r.meta().at("model").get<std::string>() == "abc");
  REQUIRE(r.tensors().size() == 5);
  for (const auto& [name, t] : c.tensors()) {
    INFO(name);
    const Tensor& u = r.get(name);
    CHECK(u.dtype() == t.dtype());
    CHECK(u.shape() == t.shape());
    CHECK(std::memcmp(u.raw_data(), t.raw_data(), t.nbytes()) == 0);
  }
  CHECK_THROWS_WITH(r.get("nope"), Catch::Contains("a.ckpt") && Catch::Contains("nope"));
  // Saving again replaces the file as a whole; no temporary file is left behind.
  c.meta()["step"] = 43;
  c.save(dir / "a.ckpt");
  CHECK(Checkpoint::load(dir / "a.ckpt").meta().at("step").get<int>() == 43);
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  CHECK(files == 1);
}

TEST_CASE("Damaged checkpoints are clear errors", "[train][checkpoint]") {
  Checkpoint c;
  c.put("w", test::random_tensor({64}, 4));
  test::TempDir dir;
  c.save(dir / "good");
  const std::string bytes = read_file_bytes(dir / "good");
  auto write = [&](const std::string& name, const std::string& content) {
    std::ofstream(dir / name, std::ios::binary) << content;
    return dir / name;
  };
  CHECK_THROWS_WITH(Checkpoint::load(write("trunc", bytes.substr(0, bytes.size() - 10))), Catch::Contains("truncated"));
  std::string flipped = bytes;
  flipped[flipped.size() - 5] ^= 0x40;
  CHECK_THROWS_WITH(Checkpoint::load(write("flip", flipped)), Catch::Contains("checksum"));
  CHECK_THROWS_WITH(Checkpoint::load(write("text", "hello world, not a checkpoint")), Catch::Contains("not an mpq checkpoint"));
  CHECK_THROWS_AS(Checkpoint::load(dir / "missing"), Error);
}
