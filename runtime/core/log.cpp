#include "zero3/core/log.hpp"

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

namespace zero3::log {
namespace {
std::atomic<Level> g_level{Level::info};
std::mutex g_mutex;
std::string g_prefix = "[zero3] ";  // guarded by g_mutex

std::string_view level_word(Level l) {
  switch (l) {
    case Level::debug:
      return "debug: ";
    case Level::info:
      return "";
    case Level::warning:
      return "warning: ";
    case Level::error:
      return "error: ";
  }
  return "";
}
}  // namespace

void set_rank(int rank, int world_size) {
  std::lock_guard lock(g_mutex);
  g_prefix = fmt::format("[zero3 rank {}/{}] ", rank, world_size);
}

void set_level(Level l) {
  g_level.store(l);
}
Level level() {
  return g_level.load(std::memory_order_relaxed);
}

void write(Level l, std::string_view message) {
  std::lock_guard lock(g_mutex);
  // One fwrite per line keeps lines of different ranks from interleaving mid-line.
  std::string line = fmt::format("{}{}{}\n", g_prefix, level_word(l), message);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace zero3::log
