#include "zero3/comm/fault.hpp"

#include <fmt/format.h>

#include <atomic>
#include <charconv>
#include <cstdlib>
#include <mutex>

#include "zero3/core/env.hpp"
#include "zero3/core/error.hpp"

namespace zero3::comm::fault {

namespace {
constexpr Kind kKinds[] = {Kind::stall,     Kind::skip_gather,    Kind::extra_micro_batch,  Kind::extra_collective,
                           Kind::mpi_error, Kind::kill_in_update, Kind::stall_in_collective};

std::int64_t parse_int(std::string_view value, std::string_view key, std::string_view text, std::string_view source) {
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size() || v < 0) {
    throw ConfigError(
        fmt::format("{}='{}': {} must be a non-negative decimal integer, got '{}'", source, text, key, value));
  }
  return v;
}
}  // namespace

std::string_view kind_name(Kind kind) {
  switch (kind) {
    case Kind::none:
      return "none";
    case Kind::stall:
      return "stall";
    case Kind::skip_gather:
      return "skip_gather";
    case Kind::extra_micro_batch:
      return "extra_micro_batch";
    case Kind::extra_collective:
      return "extra_collective";
    case Kind::mpi_error:
      return "mpi_error";
    case Kind::kill_in_update:
      return "kill_in_update";
    case Kind::stall_in_collective:
      return "stall_in_collective";
  }
  return "?";
}

Spec parse(std::string_view text, std::string_view source) {
  Spec spec;
  const std::size_t colon = text.find(':');
  const std::string_view kind = text.substr(0, colon);
  for (const Kind k : kKinds) {
    if (kind_name(k) == kind) spec.kind = k;
  }
  if (spec.kind == Kind::none) {
    throw ConfigError(
        fmt::format("{}='{}': unknown fault '{}'; expected stall, skip_gather, extra_micro_batch, extra_collective, "
                    "mpi_error, kill_in_update or stall_in_collective",
                    source, text, kind));
  }
  bool more = colon != std::string_view::npos;
  std::string_view rest = more ? text.substr(colon + 1) : std::string_view();
  while (more) {
    const std::size_t next = rest.find(':');
    const std::string_view part = rest.substr(0, next);
    more = next != std::string_view::npos;
    rest = more ? rest.substr(next + 1) : std::string_view();
    const std::size_t eq = part.find('=');
    if (eq == std::string_view::npos) {
      throw ConfigError(fmt::format("{}='{}': '{}' is not key=value", source, text, part));
    }
    const std::string_view key = part.substr(0, eq);
    const std::string_view value = part.substr(eq + 1);
    if (key == "rank" && spec.rank < 0) {
      spec.rank = static_cast<int>(parse_int(value, key, text, source));
    } else if (key == "step" && spec.step < 0) {
      spec.step = parse_int(value, key, text, source);
    } else if (key == "unit" && !spec.unit && spec.kind == Kind::skip_gather) {
      spec.unit = parse_int(value, key, text, source);
    } else {
      throw ConfigError(fmt::format("{}='{}': unexpected or repeated '{}' (keys: rank, step{})", source, text, key,
                                    spec.kind == Kind::skip_gather ? ", unit" : ""));
    }
  }
  if (spec.rank < 0 || spec.step < 0 || (spec.kind == Kind::skip_gather && !spec.unit)) {
    throw ConfigError(fmt::format("{}='{}': needs rank=R and step=S{}", source, text,
                                  spec.kind == Kind::skip_gather ? " and unit=U" : ""));
  }
  return spec;
}

const Spec& active() {
  static const Spec spec = [] {
    const std::optional<std::string> v = env::get(env::kFault);  // read once, before threads use it
    return !v || v->empty() ? Spec{} : parse(*v);
  }();
  return spec;
}

bool fire(Kind kind, int rank, std::int64_t step, std::optional<std::int64_t> unit) {
  static std::atomic<bool> fired{false};
  const Spec& s = active();
  if (s.kind != kind || s.rank != rank || s.step != step) return false;
  if (s.unit && s.unit != unit) return false;
  return !fired.exchange(true);
}

}  // namespace zero3::comm::fault
