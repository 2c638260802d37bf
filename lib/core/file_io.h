#pragma once
// File helpers that keep DESIGN.md's "nothing lost" contract: outputs are written to a temporary
// file in the target folder and renamed into place; inputs are never opened for writing.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

namespace mpq {

namespace fs = std::filesystem;

// Whole file as bytes; BadInput error naming the file when it cannot be read.
std::string read_file_bytes(const fs::path& path);

// Write through `writer` into "<path>.tmp-XXXX" beside `path`, flush, then rename over `path`.
// On any exception the temporary file is removed and `path` is untouched.
void write_file_atomic(const fs::path& path, const std::function<void(std::ostream&)>& writer);
void write_file_atomic(const fs::path& path, const std::string& bytes);

// True when both paths name the same existing file (after resolving links).
bool same_file(const fs::path& a, const fs::path& b);

// Fail (BadInput) when `output` names the same file as `input`.
void refuse_overwrite_input(const fs::path& input, const fs::path& output);

// A read-only memory mapping of a whole file, shared by every tensor that points into it.
class MappedFile {
 public:
  static std::shared_ptr<MappedFile> open(const fs::path& path);
  ~MappedFile();
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const fs::path& path() const { return path_; }

 private:
  MappedFile() = default;
  fs::path path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mpq
