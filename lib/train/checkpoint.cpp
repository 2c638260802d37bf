#include "train/checkpoint.h"

#include <cstring>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"

namespace mpq::train {

namespace {

constexpr char kMagic[8] = {'M', 'P', 'Q', 'C', 'K', 'P', 'T', '1'};
constexpr size_t kAlign = 64;

uint64_t fnv1a(uint64_t h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}
constexpr uint64_t kFnvBasis = 14695981039346656037ull;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

void Checkpoint::put(const std::string& name, const Tensor& t) {
  if (!t.defined()) fail_internal("checkpoint: tensor '{}' is undefined", name);
  if (t.dtype() == DType::String) fail_internal("checkpoint: tensor '{}' holds strings", name);
  tensors_[name] = t.clone();
}

const Tensor& Checkpoint::get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    fail_input("{}: checkpoint has no tensor '{}' (written for another model or another setting?)",
               source_.empty() ? std::string("checkpoint") : source_.string(), name);
  return it->second;
}

void Checkpoint::save(const std::filesystem::path& file) const {
  nlohmann::json header;
  header["meta"] = meta_;
  header["tensors"] = nlohmann::json::array();
  size_t offset = 0;
  uint64_t checksum = kFnvBasis;
  for (const auto& [name, t] : tensors_) {
    header["tensors"].push_back({{"name", name},
                                 {"dtype", dtype_name(t.dtype())},
                                 {"shape", t.shape()},
                                 {"offset", offset},
                                 {"bytes", t.nbytes()}});
    checksum = fnv1a(checksum, static_cast<const uint8_t*>(t.raw_data()), t.nbytes());
    offset = align_up(offset + t.nbytes());
  }
  header["checksum"] = std::to_string(checksum);
  const std::string text = header.dump();
  write_file_atomic(file, [&](std::ostream& out) {
    out.write(kMagic, sizeof(kMagic));
    const uint64_t len = text.size();
    out.write(reinterpret_cast<const char*>(&len), sizeof(len));
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    const std::string pad(kAlign, '\0');
    size_t written = 0;
    for (const auto& [name, t] : tensors_) {
      out.write(static_cast<const char*>(t.raw_data()), static_cast<std::streamsize>(t.nbytes()));
      written += t.nbytes();
      const size_t aligned = align_up(written);
      out.write(pad.data(), static_cast<std::streamsize>(aligned - written));
      written = aligned;
    }
  });
}

Checkpoint Checkpoint::load(const std::filesystem::path& file) {
  const std::string bytes = read_file_bytes(file);
  const std::string where = file.string();
  if (bytes.size() < sizeof(kMagic) + 8 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    fail_input("{}: not an mpq checkpoint", where);
  uint64_t len = 0;
  std::memcpy(&len, bytes.data() + sizeof(kMagic), sizeof(len));
  const size_t data_start = sizeof(kMagic) + 8 + len;
  if (len > bytes.size() || data_start > bytes.size()) fail_input("{}: checkpoint is truncated", where);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.substr(sizeof(kMagic) + 8, len));
  } catch (const std::exception& e) {
    fail_input("{}: checkpoint header is corrupt: {}", where, e.what());
  }
  Checkpoint c;
  c.source_ = file;
  try {
    c.meta_ = header.at("meta");
    uint64_t checksum = kFnvBasis;
    for (const auto& e : header.at("tensors")) {
      const std::string name = e.at("name").get<std::string>();
      const auto dtype = dtype_from_name(e.at("dtype").get<std::string>());
      if (!dtype) fail_input("{}: tensor '{}' has an unknown type", where, name);
      const Shape shape = e.at("shape").get<Shape>();
      const size_t offset = e.at("offset").get<size_t>(), n = e.at("bytes").get<size_t>();
      Tensor t(*dtype, shape);
      if (t.nbytes() != n || data_start + offset + n > bytes.size())
        fail_input("{}: checkpoint is truncated or corrupt at tensor '{}'", where, name);
      std::memcpy(t.raw_data(), bytes.data() + data_start + offset, n);
      checksum = fnv1a(checksum, static_cast<const uint8_t*>(t.raw_data()), n);
      c.tensors_[name] = std::move(t);
    }
    if (header.at("checksum").get<std::string>() != std::to_string(checksum))
      fail_input("{}: checkpoint checksum does not match its contents (corrupt file)", where);
  } catch (const nlohmann::json::exception& e) {
    fail_input("{}: checkpoint header is corrupt: {}", where, e.what());
  }
  return c;
}

}  // namespace mpq::train
