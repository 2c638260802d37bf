#include "data/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"
#include "core/file_io.h"

namespace mpq::data {

namespace {

DType dtype_from_descr(const std::string& descr, const std::filesystem::path& path) {
  if (descr.size() < 2) fail_input("{}: bad dtype '{}' in .npy header", path.string(), descr);
  char order = descr[0];
  std::string code = descr.substr(1);
  if (order == '>' && code != "i1" && code != "u1" && code != "b1")
    fail_input("{}: big-endian .npy data ('{}') is not supported; save it little-endian", path.string(), descr);
  static const std::pair<const char*, DType> table[] = {
      {"f4", DType::Float32}, {"f8", DType::Float64}, {"f2", DType::Float16}, {"i1", DType::Int8},
      {"u1", DType::UInt8},   {"i2", DType::Int16},   {"u2", DType::UInt16},  {"i4", DType::Int32},
      {"u4", DType::UInt32},  {"i8", DType::Int64},   {"u8", DType::UInt64},  {"b1", DType::Bool},
  };
  for (const auto& [c, t] : table)
    if (code == c) return t;
  fail_input("{}: .npy dtype '{}' is not supported", path.string(), descr);
}

const char* descr_of(DType t) {
  switch (t) {
    case DType::Float32: return "<f4";
    case DType::Float64: return "<f8";
    case DType::Float16: return "<f2";
    case DType::Int8: return "|i1";
    case DType::UInt8: return "|u1";
    case DType::Int16: return "<i2";
    case DType::UInt16: return "<u2";
    case DType::Int32: return "<i4";
    case DType::UInt32: return "<u4";
    case DType::Int64: return "<i8";
    case DType::UInt64: return "<u8";
    case DType::Bool: return "|b1";
    default: return nullptr;
  }
}

NpyHeader parse_header(const std::string& bytes, const std::filesystem::path& path) {
  static const char magic[] = "\x93NUMPY";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), magic, 6) != 0)
    fail_input("{}: not a .npy file (bad magic)", path.string());
  uint8_t major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail_input("{}: truncated .npy header", path.string());
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    start = 12;
  } else {
    fail_input("{}: unsupported .npy version {}", path.string(), major);
  }
  if (bytes.size() < start + header_len) fail_input("{}: truncated .npy header", path.string());
  std::string header = bytes.substr(start, header_len);
  std::smatch m;
  if (!std::regex_search(header, m, std::regex("'descr'\\s*:\\s*'([^']*)'")))
    fail_input("{}: .npy header has no descr", path.string());
  NpyHeader h;
  h.dtype = dtype_from_descr(m[1].str(), path);
  if (std::regex_search(header, m, std::regex("'fortran_order'\\s*:\\s*True")))
    fail_input("{}: Fortran-order .npy arrays are not supported; save with np.ascontiguousarray", path.string());
  if (!std::regex_search(header, m, std::regex("'shape'\\s*:\\s*\\(([^)]*)\\)")))
    fail_input("{}: .npy header has no shape", path.string());
  std::string dims = m[1].str();
  std::regex num("\\d+");
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it)
    h.shape.push_back(std::stoll(it->str()));
  h.data_offset = start + header_len;
  return h;
}

}  // namespace

NpyHeader read_npy_header(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_input("{}: cannot open", path.string());
  std::string head(4096, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  NpyHeader h = parse_header(head, path);
  if (h.data_offset > head.size()) {
    // Very long header: read the whole file.
    return parse_header(read_file_bytes(path), path);
  }
  return h;
}

Tensor read_npy(const std::filesystem::path& path) {
  std::string bytes = read_file_bytes(path);
  NpyHeader h = parse_header(bytes, path);
  Tensor t(h.dtype, h.shape);
  size_t need = t.nbytes();
  if (bytes.size() - h.data_offset < need)
    fail_input("{}: .npy data is truncated ({} bytes, shape {} of {} needs {})", path.string(),
               bytes.size() - h.data_offset, shape_str(h.shape), dtype_name(h.dtype), need);
  if (need) std::memcpy(t.raw_data(), bytes.data() + h.data_offset, need);
  return t;
}

void write_npy(const std::filesystem::path& path, const Tensor& t) {
  const char* descr = descr_of(t.dtype());
  if (!descr) fail_input("{}: cannot write {} tensors as .npy", path.string(), dtype_name(t.dtype()));
  std::string shape;
  for (size_t i = 0; i < t.shape().size(); ++i) shape += std::to_string(t.shape()[i]) + (t.rank() == 1 || i + 1 < t.shape().size() ? "," : "");
  if (t.rank() > 1 && !shape.empty() && shape.back() == ',') shape.pop_back();
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr, shape);
  size_t total = 10 + dict.size() + 1;
  size_t pad = (64 - total % 64) % 64;
  dict += std::string(pad, ' ') + "\n";
  std::string header = "\x93NUMPY";
  header += '\x01';
  header += '\x00';
  header += static_cast<char>(dict.size() & 0xff);
  header += static_cast<char>((dict.size() >> 8) & 0xff);
  header += dict;
  write_file_atomic(path, [&](std::ostream& out) {
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(static_cast<const char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
  });
}

}  // namespace mpq::data
