#include "data/npy.h"

#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>

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

// The header is a Python dict literal, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (1, 28, 28), }.
// It is read by hand, not with std::regex: building three regexes per file cost more than running
// a small model on it (`mpq run` and `mpq calibrate` read one file per feed).
std::string_view skip_space(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n' || s.front() == '\r')) s.remove_prefix(1);
  return s;
}

// The text after `'key':` (or `"key":`), leading blanks removed, if the key is there.
std::optional<std::string_view> find_dict_value(std::string_view header, std::string_view key) {
  for (const char quote : {'\'', '"'}) {
    const std::string quoted = std::string(1, quote) + std::string(key) + quote;
    for (size_t at = header.find(quoted); at != std::string_view::npos; at = header.find(quoted, at + 1)) {
      std::string_view rest = skip_space(header.substr(at + quoted.size()));
      if (!rest.empty() && rest.front() == ':') return skip_space(rest.substr(1));
    }
  }
  return std::nullopt;
}

// The same; fails naming the file if the key is absent.
std::string_view dict_value(std::string_view header, std::string_view key, const std::filesystem::path& path) {
  const std::optional<std::string_view> v = find_dict_value(header, key);
  if (!v) fail_input("{}: .npy header has no {}", path.string(), key);
  return *v;
}

std::string_view quoted_value(std::string_view header, std::string_view key, const std::filesystem::path& path) {
  std::string_view v = dict_value(header, key, path);
  const char quote = v.empty() ? '\0' : v.front();
  const size_t end = quote == '\'' || quote == '"' ? v.find(quote, 1) : std::string_view::npos;
  if (end == std::string_view::npos) fail_input("{}: .npy header's {} is not a quoted string", path.string(), key);
  return v.substr(1, end - 1);
}

// 'shape': (d0, d1, ...): the digits of each entry (Python 2 files may write 3L).
Shape shape_value(std::string_view header, const std::filesystem::path& path) {
  std::string_view v = dict_value(header, "shape", path);
  const size_t close = v.find(')');
  if (v.empty() || v.front() != '(' || close == std::string_view::npos)
    fail_input("{}: .npy header's shape is not a tuple", path.string());
  Shape shape;
  const std::string_view dims = v.substr(1, close - 1);
  for (size_t i = 0; i < dims.size();) {
    if (dims[i] < '0' || dims[i] > '9') {
      ++i;
      continue;
    }
    int64_t d = 0;
    for (; i < dims.size() && dims[i] >= '0' && dims[i] <= '9'; ++i) {
      if (d > (int64_t{1} << 56)) fail_input("{}: .npy header's shape has a dimension too large", path.string());
      d = d * 10 + (dims[i] - '0');
    }
    shape.push_back(d);
  }
  // The element count must fit too (each dimension alone does): a wrapped product would size a
  // tensor with less storage than its shape claims.
  int64_t numel = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(numel, d, &numel) || numel > (int64_t{1} << 56))
      fail_input("{}: .npy header's shape {} has too many elements", path.string(), shape_str(shape));
  return shape;
}

// Bytes from the start of the file to the end of the header (the data offset), from the magic and
// the length field alone: tells how much of the file the header needs.
size_t header_extent(const std::string& bytes, const std::filesystem::path& path, size_t* start_out = nullptr) {
  static const char magic[] = "\x93NUMPY";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), magic, 6) != 0)
    fail_input("{}: not a .npy file (bad magic)", path.string());
  const uint8_t major = static_cast<uint8_t>(bytes[6]);
  size_t header_len = 0, start = 0;
  if (major == 1) {
    header_len = static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) fail_input("{}: truncated .npy header", path.string());
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i])) << (8 * i);
    start = 12;
  } else {
    fail_input("{}: unsupported .npy version {}", path.string(), major);
  }
  if (start_out) *start_out = start;
  return start + header_len;
}

NpyHeader parse_header(const std::string& bytes, const std::filesystem::path& path) {
  size_t start = 0;
  const size_t end = header_extent(bytes, path, &start);
  if (bytes.size() < end) fail_input("{}: truncated .npy header", path.string());
  const size_t header_len = end - start;
  const std::string_view header(bytes.data() + start, header_len);
  NpyHeader h;
  h.dtype = dtype_from_descr(std::string(quoted_value(header, "descr", path)), path);
  // An absent fortran_order means C order (NumPy always writes it; hand-made files may not).
  if (find_dict_value(header, "fortran_order").value_or("False").substr(0, 4) == "True")
    fail_input("{}: Fortran-order .npy arrays are not supported; save with np.ascontiguousarray", path.string());
  h.shape = shape_value(header, path);
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
  // A header longer than the first 4 KiB: read the whole file.
  if (header_extent(head, path) > head.size()) return parse_header(read_file_bytes(path), path);
  return parse_header(head, path);
}

Tensor read_npy(const std::filesystem::path& path) {
  std::string bytes = read_file_bytes(path);
  NpyHeader h = parse_header(bytes, path);
  // Checked before the tensor is allocated: a header may claim far more than the file holds.
  const size_t need = dtype_storage_bytes(h.dtype, shape_numel(h.shape));
  if (bytes.size() - h.data_offset < need)
    fail_input("{}: .npy data is truncated ({} bytes, shape {} of {} needs {})", path.string(),
               bytes.size() - h.data_offset, shape_str(h.shape), dtype_name(h.dtype), need);
  Tensor t(h.dtype, h.shape);
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
