#include "zero3/core/resident.hpp"

#include <sys/resource.h>

#include <fstream>
#include <string>
#include <string_view>

namespace zero3 {
namespace {

// A "Name:   1234 kB" line of /proc/self/status, in bytes.
std::optional<std::uint64_t> status_kib(std::string_view name) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(name) || line.size() <= name.size() || line[name.size()] != ':') continue;
    try {
      return std::stoull(line.substr(name.size() + 1)) * 1024;
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::uint64_t> resident_bytes() {
  return status_kib("VmRSS");
}

std::optional<std::uint64_t> resident_peak_bytes() {
  if (const std::optional<std::uint64_t> hwm = status_kib("VmHWM")) return hwm;
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return std::nullopt;
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

}  // namespace zero3
