#pragma once
// The one error type library code throws. Its kind maps to the CLI's exit codes (DESIGN.md):
// 1 validation threshold failed, 2 bad usage or bad input, 3 internal error.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace mpq {

enum class ErrorKind {
  BadInput = 2,     // unreadable, corrupt or unsupported model; wrong data; bad flags
  Unsupported = 4,  // a valid model using something mpq does not implement (exit code 2 as well)
  Internal = 3,     // a bug in mpq
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message) : std::runtime_error(std::move(message)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }
  int exit_code() const { return kind_ == ErrorKind::Internal ? 3 : 2; }

 private:
  ErrorKind kind_;
};

template <typename... Args>
[[noreturn]] void fail(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw Error(kind, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
[[noreturn]] void fail_input(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(ErrorKind::BadInput, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
[[noreturn]] void fail_unsupported(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(ErrorKind::Unsupported, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
[[noreturn]] void fail_internal(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(ErrorKind::Internal, fmt::format(f, std::forward<Args>(args)...));
}

#define MPQ_CHECK(cond, ...)                          \
  do {                                                \
    if (!(cond)) ::mpq::fail_internal(__VA_ARGS__);   \
  } while (0)

}  // namespace mpq
