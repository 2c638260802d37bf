#include "core/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "core/error.h"

namespace mpq {

std::string read_file_bytes(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail_input("{}: no such file", path.string());
  if (fs::is_directory(path, ec)) fail_input("{}: is a directory, expected a file", path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail_input("{}: cannot open: {}", path.string(), std::strerror(errno));
  std::string bytes;
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  if (size < 0) fail_input("{}: cannot read", path.string());
  bytes.resize(static_cast<size_t>(size));
  if (size > 0 && !in.read(bytes.data(), size)) fail_input("{}: read failed", path.string());
  return bytes;
}

void write_file_atomic(const fs::path& path, const std::function<void(std::ostream&)>& writer) {
  fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail_input("{}: output folder {} does not exist", path.string(), dir.string());
  std::random_device rd;
  fs::path tmp = dir / fmt::format(".{}.tmp-{:08x}", path.filename().string(), rd());
  try {
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      if (!out) fail_input("{}: cannot create temporary output file: {}", tmp.string(), std::strerror(errno));
      writer(out);
      out.flush();
      if (!out) fail_input("{}: write failed (disk full?)", path.string());
    }
    fs::rename(tmp, path, ec);
    if (ec) fail_input("{}: cannot move output into place: {}", path.string(), ec.message());
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

void write_file_atomic(const fs::path& path, const std::string& bytes) {
  write_file_atomic(path, [&](std::ostream& out) { out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); });
}

bool same_file(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  if (!fs::exists(a, ec) || !fs::exists(b, ec)) return false;
  return fs::equivalent(a, b, ec);
}

void refuse_overwrite_input(const fs::path& input, const fs::path& output) {
  if (same_file(input, output))
    fail_input("{}: refusing to overwrite the input model; choose another output path", output.string());
}

std::shared_ptr<MappedFile> MappedFile::open(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_input("{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail_input("{}: cannot stat: {}", path.string(), std::strerror(errno));
  }
  std::shared_ptr<MappedFile> m(new MappedFile());
  m->path_ = path;
  m->size_ = static_cast<size_t>(st.st_size);
  if (m->size_ > 0) {
    void* p = ::mmap(nullptr, m->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      fail_input("{}: cannot map: {}", path.string(), std::strerror(errno));
    }
    m->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace mpq
