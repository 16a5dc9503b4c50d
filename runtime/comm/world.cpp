#include "zero3/comm/world.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <charconv>
#include <cstdlib>
#include <vector>

#include "zero3/core/error.hpp"

namespace zero3::comm {
namespace {

// One launcher's four variables, in the order rank, size, local rank, local size.
struct Family {
  std::string_view label;  // for World::source
  std::array<std::string_view, 4> names;
};

constexpr Family kOpenMpi{
    "mpirun (OMPI_COMM_WORLD_*)",
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}};
constexpr Family kGeneric{"environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)",
                          {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}};

std::string show(std::string_view name, const std::optional<std::string>& value) {
  return value ? fmt::format("{}='{}'", name, *value) : fmt::format("{} unset", name);
}

// The family's values, or nullopt when none of its variables is set.
std::optional<std::array<int, 4>> read_family(const Family& family, const World::EnvLookup& lookup) {
  std::array<std::optional<std::string>, 4> raw;
  int set = 0;
  for (std::size_t i = 0; i < 4; ++i) {
    raw[i] = lookup(family.names[i]);
    if (raw[i]) ++set;
  }
  if (set == 0) return std::nullopt;
  if (set != 4) {
    std::vector<std::string> parts;
    for (std::size_t i = 0; i < 4; ++i) parts.push_back(show(family.names[i], raw[i]));
    throw ConfigError(fmt::format(
        "incomplete launcher environment: {}. Set all four of {} (or none of them), or start the job with mpirun",
        fmt::join(parts, ", "), fmt::join(family.names, ", ")));
  }
  std::array<int, 4> values{};
  for (std::size_t i = 0; i < 4; ++i) {
    const std::string& text = *raw[i];
    int v = 0;
    const char* first = text.data();
    const char* last = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(first, last, v);
    if (text.empty() || ec != std::errc() || ptr != last) {
      throw ConfigError(fmt::format("launcher variable {}='{}' is not a decimal integer{}", family.names[i], text,
                                    ec == std::errc::result_out_of_range ? " in range" : ""));
    }
    values[i] = v;
  }
  const auto [rank, size, local_rank, local_size] = values;
  auto name = [&](int i) { return family.names[static_cast<std::size_t>(i)]; };
  if (size < 1) throw ConfigError(fmt::format("launcher variable {}={} must be at least 1", name(1), size));
  if (local_size < 1) {
    throw ConfigError(fmt::format("launcher variable {}={} must be at least 1", name(3), local_size));
  }
  if (rank < 0 || rank >= size) {
    throw ConfigError(
        fmt::format("launcher variables are inconsistent: {}={} must be in [0, {}={})", name(0), rank, name(1), size));
  }
  if (local_rank < 0 || local_rank >= local_size) {
    throw ConfigError(fmt::format("launcher variables are inconsistent: {}={} must be in [0, {}={})", name(2),
                                  local_rank, name(3), local_size));
  }
  if (local_size > size) {
    throw ConfigError(
        fmt::format("launcher variables are inconsistent: {}={} exceeds {}={}", name(3), local_size, name(1), size));
  }
  return values;
}

}  // namespace

World World::from_lookup(const EnvLookup& lookup) {
  const auto ompi = read_family(kOpenMpi, lookup);
  const auto generic = read_family(kGeneric, lookup);
  if (ompi && generic && *ompi != *generic) {
    std::vector<std::string> diffs;
    for (std::size_t i = 0; i < 4; ++i) {
      if ((*ompi)[i] != (*generic)[i]) {
        diffs.push_back(
            fmt::format("{}={} but {}={}", kOpenMpi.names[i], (*ompi)[i], kGeneric.names[i], (*generic)[i]));
      }
    }
    throw ConfigError(fmt::format(
        "launcher environments disagree: {}. Unset RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE when starting "
        "with mpirun",
        fmt::join(diffs, "; ")));
  }
  World w;
  const auto& values = ompi ? ompi : generic;
  if (!values) {
    w.source = "single process (no launcher variables)";
    return w;
  }
  w.rank = (*values)[0];
  w.size = (*values)[1];
  w.local_rank = (*values)[2];
  w.local_size = (*values)[3];
  w.source = std::string(ompi ? kOpenMpi.label : kGeneric.label);
  return w;
}

World World::from_environment() {
  return from_lookup([](std::string_view name) -> std::optional<std::string> {
    const char* v = std::getenv(std::string(name).c_str());  // NOLINT(concurrency-mt-unsafe): read at start-up
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

}  // namespace zero3::comm
