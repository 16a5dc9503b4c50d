// Rank-prefixed logging to stderr: "[zero3 rank 1/4] warning: ...". Thread-safe; one line per call.
// The rank prefix is set once the World is known; before that lines carry no rank.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace zero3::log {

enum class Level { debug = 0, info = 1, warning = 2, error = 3 };

void set_rank(int rank, int world_size);
void set_level(Level level);
Level level();
void write(Level level, std::string_view message);

template <typename... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::debug) write(Level::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::info) write(Level::info, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= Level::warning) write(Level::warning, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  write(Level::error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace zero3::log
