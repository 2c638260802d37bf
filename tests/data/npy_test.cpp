// .npy reading: the header parser against files as NumPy writes them, hand-written variants of
// the header dict, and malformed headers (each a clear error naming the file).
#include <catch2/catch.hpp>

#include <fstream>

#include "core/error.h"
#include "data/npy.h"
#include "test_util.h"

using namespace mpq;
namespace fs = std::filesystem;

namespace {

// A version 1.0 file with `dict` as its header and `data` after it (the header is padded to 64
// bytes as NumPy does; the parser must not rely on that).
void write_raw_npy(const fs::path& path, std::string dict, const std::string& data, bool pad = true) {
  if (pad) {
    const size_t total = 10 + dict.size() + 1;
    dict += std::string((64 - total % 64) % 64, ' ');
  }
  dict += "\n";
  std::string bytes = "\x93NUMPY";
  bytes += '\x01';
  bytes += '\x00';
  bytes += static_cast<char>(dict.size() & 0xff);
  bytes += static_cast<char>((dict.size() >> 8) & 0xff);
  bytes += dict + data;
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string float_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

}  // namespace

TEST_CASE("npy: written tensors read back with their dtype, shape and values") {
  test::TempDir tmp("npy");
  for (const Shape& shape : {Shape{}, Shape{7}, Shape{1, 28, 28}, Shape{3, 0, 5}, Shape{2, 3, 5, 7}}) {
    Tensor t = test::random_tensor(shape, 11);
    data::write_npy(tmp / "t.npy", t);
    const data::NpyHeader h = data::read_npy_header(tmp / "t.npy");
    CHECK(h.dtype == DType::Float32);
    CHECK(h.shape == shape);
    Tensor back = data::read_npy(tmp / "t.npy");
    REQUIRE(back.shape() == shape);
    CHECK(test::max_abs_diff(back, t) == 0.0);
  }
  Tensor ints(DType::Int64, {2, 3});
  for (int64_t i = 0; i < 6; ++i) ints.data<int64_t>()[i] = i * 1000000007LL;
  data::write_npy(tmp / "i.npy", ints);
  Tensor back = data::read_npy(tmp / "i.npy");
  REQUIRE(back.dtype() == DType::Int64);
  CHECK(back.shape() == Shape{2, 3});
  CHECK(back.data<int64_t>()[5] == 5 * 1000000007LL);
}

TEST_CASE("npy: header dicts in other spellings") {
  test::TempDir tmp("npy");
  const std::string data = float_bytes({1.5f, -2.0f, 3.25f, 4.0f, 5.0f, 6.0f});
  struct Case {
    std::string dict;
    Shape shape;
  };
  const std::vector<Case> cases = {
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", {2, 3}},
      {"{'shape':(2,3),'fortran_order':False,'descr':'<f4'}", {2, 3}},             // other order, no blanks
      {"{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (6,)}", {6}},     // double quotes
      {"{'descr' : '<f4' , 'fortran_order' : False , 'shape' : ( 3L, 2L ) }", {3, 2}},  // Python 2 longs
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 1, 3), }", {1, 2, 1, 3}},
      {"{'descr': '<f4', 'shape': (2, 3), }", {2, 3}},  // no fortran_order: C order
      // a header longer than the 4 KiB read_npy_header looks at first
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }" + std::string(5000, ' '), {3, 2}},
  };
  for (const auto& c : cases) {
    CAPTURE(c.dict);
    for (bool pad : {true, false}) {
      write_raw_npy(tmp / "h.npy", c.dict, data, pad);
      CHECK(data::read_npy_header(tmp / "h.npy").shape == c.shape);
      Tensor t = data::read_npy(tmp / "h.npy");
      REQUIRE(t.shape() == c.shape);
      CHECK(t.data<float>()[0] == 1.5f);
      CHECK(t.data<float>()[5] == 6.0f);
    }
  }
}

TEST_CASE("npy: malformed headers are errors naming the file") {
  test::TempDir tmp("npy");
  const std::string data = float_bytes({1, 2, 3, 4});
  struct Case {
    std::string dict;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"{'fortran_order': False, 'shape': (4,), }", "has no descr"},
      {"{'descr': <f4, 'fortran_order': False, 'shape': (4,), }", "not a quoted string"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (4,), }", "dtype"},  // quote closes late
      {"{'descr': '<f4', 'fortran_order': False, }", "has no shape"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [4], }", "shape is not a tuple"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4, }", "shape is not a tuple"},
      {"{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", "Fortran-order"},
      {"{'descr': '<c8', 'fortran_order': False, 'shape': (4,), }", "not supported"},
      {"{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", "big-endian"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", "too large"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (8,), }", "truncated"},
      // each dimension fits, their product does not: never a tensor with less storage than its shape
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", "too many elements"},
      // a shape far larger than the file: refused before anything is allocated
      {"{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }", "truncated"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.dict);
    write_raw_npy(tmp / "bad.npy", c.dict, data);
    try {
      data::read_npy(tmp / "bad.npy");
      FAIL("no error");
    } catch (const Error& e) {
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("bad.npy") && Catch::Contains(c.message));
    }
  }
  std::ofstream(tmp / "magic.npy") << "NUMPY not really";
  CHECK_THROWS_WITH(data::read_npy(tmp / "magic.npy"), Catch::Contains("magic.npy") && Catch::Contains("bad magic"));
}
