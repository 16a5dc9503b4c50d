// What zero3 takes as an integer from JSON, in one place for every reader (the config, Hugging Face's
// config.json, checkpoint manifests and trainer state): a JSON integer that int64 holds. nlohmann::json keeps
// an integer past INT64_MAX as unsigned and its get<int64_t>() wraps it to a negative number, and it truncates
// a float, so a reader passes a value through here before it takes it as an int64. DeepSpeed configs may
// write sizes as floats ("5e8"); a reader of those uses json_integer_or_integral_float. Header-only.
//
//   if (const auto n = zero3::json_integer(j); n && *n >= 1) layers = *n;   // 1, 2^40; not 1.5, -1, 2^64
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

namespace zero3 {

// The value of a JSON integer that int64 holds; nullopt for anything else (floats, strings, 2^63 and above).
inline std::optional<std::int64_t> json_integer(const nlohmann::json& j) {
  if (j.is_number_unsigned()) {
    const auto u = j.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  if (j.is_number_integer()) return j.get<std::int64_t>();
  return std::nullopt;
}

// Whether `j` is a float with a fractional part (1.5): a reader that takes integral floats names that case.
inline bool json_fractional(const nlohmann::json& j) {
  if (!j.is_number_float()) return false;
  const double d = j.get<double>();
  return std::isfinite(d) && std::trunc(d) != d;
}

// json_integer, and also a finite float with no fractional part within int64's range (5e8, 1.0).
inline std::optional<std::int64_t> json_integer_or_integral_float(const nlohmann::json& j) {
  if (!j.is_number_float()) return json_integer(j);
  const double d = j.get<double>();
  // -2^63 and 2^63 are exact doubles; int64 holds the first and not the second.
  if (!std::isfinite(d) || std::trunc(d) != d || d >= 9223372036854775808.0 || d < -9223372036854775808.0) {
    return std::nullopt;
  }
  return static_cast<std::int64_t>(d);
}

}  // namespace zero3
