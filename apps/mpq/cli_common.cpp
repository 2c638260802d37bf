#include <unistd.h>

#include <fmt/format.h>

#include <cstdio>
#include <sstream>

#include "cli.h"

namespace mpq::cli {

namespace {
std::string g_command_line;
}

const std::string& command_line() { return g_command_line; }

void set_command_line(int argc, char** argv) {
  g_command_line.clear();
  for (int i = 0; i < argc; ++i) {
    if (i) g_command_line += ' ';
    std::string a = argv[i];
    if (i == 0) a = "mpq";
    if (a.find_first_of(" \t\"'") != std::string::npos) a = "'" + a + "'";
    g_command_line += a;
  }
}

bool stderr_is_terminal() { return ::isatty(STDERR_FILENO) == 1; }

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)), total_(total), enabled_(stderr_is_terminal() && total > 1),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

Progress::~Progress() { finish(); }

void Progress::update(int64_t done) {
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  if (done < total_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  double secs = std::chrono::duration<double>(now - start_).count();
  double rate = secs > 0 ? static_cast<double>(done) / secs : 0.0;
  const int width = 30;
  int filled = total_ > 0 ? static_cast<int>(width * done / total_) : width;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(static_cast<size_t>(width), '.');
  std::fprintf(stderr, "\r%s [%s] %lld/%lld  %.1f/s", label_.c_str(), bar.c_str(), static_cast<long long>(done),
               static_cast<long long>(total_), rate);
  std::fflush(stderr);
}

void Progress::finish() {
  if (!enabled_ || finished_) return;
  finished_ = true;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} {}", bytes, units[u]) : fmt::format("{:.2f} {}", bytes, units[u]);
}

std::string human_count(double n) {
  if (n >= 1e9) return fmt::format("{:.2f}G", n / 1e9);
  if (n >= 1e6) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1e3) return fmt::format("{:.1f}K", n / 1e3);
  return fmt::format("{:.0f}", n);
}

std::set<std::string> split_comma_list(const std::vector<std::string>& items) {
  std::set<std::string> out;
  for (const std::string& item : items) {
    std::stringstream ss(item);
    std::string part;
    while (std::getline(ss, part, ','))
      if (!part.empty()) out.insert(part);
  }
  return out;
}

}  // namespace mpq::cli
