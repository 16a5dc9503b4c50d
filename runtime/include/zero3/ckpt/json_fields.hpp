// Typed, range-checked access to the fields of one JSON object that a checkpoint carries (its manifest, the
// engine's counters, the trainer's state): a field of the wrong type, outside its range or missing is a
// CheckpointError "<source>: field <path>: <problem>", never a JSON library error or a number silently
// narrowed (nlohmann's get<int64_t> truncates 1.5 and wraps 2^63). Header-only; any thread.
//
//   const ckpt::JsonFields f(manifest.state, "state", "ck/global_step40/manifest.json");
//   const std::int64_t step = f.i64("step");                          // required, any int64
//   const std::int64_t spikes = f.i64_or("spikes", 0, 0, 1000);       // absent: 0; else within [0, 1000]
//   const ckpt::JsonFields guard = f.object_or_empty("step_guard");   // absent: an empty object
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/json_integer.hpp"

namespace zero3::ckpt {

class JsonFields {
 public:
  using json = nlohmann::json;
  static constexpr std::int64_t kMaxI64 = std::numeric_limits<std::int64_t>::max();
  static constexpr std::int64_t kMinI64 = std::numeric_limits<std::int64_t>::min();

  // `j` must outlive this object. `path`: where `j` sits ("" for the top level), `source`: the file.
  JsonFields(const json& j, std::string path, std::string source)
      : j_(j), path_(std::move(path)), source_(std::move(source)) {
    if (!j_.is_object()) fail(path_, fmt::format("expected an object, got {}", j_.type_name()));
  }

  const json& get_object() const { return j_; }
  bool has(std::string_view key) const { return j_.find(key) != j_.end(); }
  const json& get(std::string_view key) const {
    auto it = j_.find(key);
    if (it == j_.end()) fail(sub(key), "missing");
    return *it;
  }
  std::string string(std::string_view key) const {
    const json& v = get(key);
    if (!v.is_string()) fail(sub(key), fmt::format("expected a string, got {}", v.dump()));
    return v.get<std::string>();
  }
  std::uint64_t u64(std::string_view key) const {
    const json& v = get(key);
    if (v.is_number_unsigned()) return v.get<std::uint64_t>();
    if (v.is_number_integer() && v.get<std::int64_t>() >= 0) return static_cast<std::uint64_t>(v.get<std::int64_t>());
    fail(sub(key), fmt::format("expected a non-negative integer, got {}", v.dump()));
  }
  // An integer within [lo, hi].
  std::int64_t i64(std::string_view key, std::int64_t lo = kMinI64, std::int64_t hi = kMaxI64) const {
    const json& v = get(key);
    const std::optional<std::int64_t> integer = json_integer(v);
    if (!integer) fail(sub(key), fmt::format("expected an integer{}, got {}", range_text(lo, hi), v.dump()));
    const std::int64_t n = *integer;
    if (n < lo || n > hi) fail(sub(key), fmt::format("{} is out of range{}", n, range_text(lo, hi)));
    return n;
  }
  // i64(), or `fallback` when the key is absent (a checkpoint written before the field existed).
  std::int64_t i64_or(std::string_view key, std::int64_t fallback, std::int64_t lo = kMinI64,
                      std::int64_t hi = kMaxI64) const {
    return has(key) ? i64(key, lo, hi) : fallback;
  }
  int int32(std::string_view key, int min_value) const {
    return static_cast<int>(i64(key, min_value, std::numeric_limits<int>::max()));
  }
  bool boolean(std::string_view key) const {
    const json& v = get(key);
    if (!v.is_boolean()) fail(sub(key), fmt::format("expected true or false, got {}", v.dump()));
    return v.get<bool>();
  }
  bool boolean_or(std::string_view key, bool fallback) const { return has(key) ? boolean(key) : fallback; }
  double number(std::string_view key) const {
    const json& v = get(key);
    if (!v.is_number()) fail(sub(key), fmt::format("expected a number, got {}", v.dump()));
    return v.get<double>();
  }
  // An array of finite numbers; absent: empty.
  std::vector<double> finite_numbers_or_empty(std::string_view key) const {
    if (!has(key)) return {};
    const json& v = array(key);
    std::vector<double> out;
    out.reserve(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_number() || !std::isfinite(v[i].get<double>())) {
        fail(fmt::format("{}[{}]", sub(key), i), fmt::format("expected a finite number, got {}", v[i].dump()));
      }
      out.push_back(v[i].get<double>());
    }
    return out;
  }
  const json& array(std::string_view key) const {
    const json& v = get(key);
    if (!v.is_array()) fail(sub(key), fmt::format("expected an array, got {}", v.type_name()));
    return v;
  }
  // The object under `key` (an empty one when absent), its fields checked as these are.
  JsonFields object_or_empty(std::string_view key) const {
    static const json kEmpty = json::object();
    return JsonFields(has(key) ? get(key) : kEmpty, sub(key), source_);
  }
  std::string sub(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  const std::string& source() const { return source_; }

  [[noreturn]] void fail(const std::string& path, const std::string& problem) const {
    throw CheckpointError(fmt::format("{}: field {}: {}", source_, path.empty() ? "(top level)" : path, problem));
  }

 private:
  static std::string range_text(std::int64_t lo, std::int64_t hi) {
    if (lo == kMinI64 && hi == kMaxI64) return "";
    if (hi == kMaxI64) return fmt::format(" (at least {})", lo);
    return fmt::format(" ({} .. {})", lo, hi);
  }
  const json& j_;
  std::string path_;
  std::string source_;
};

}  // namespace zero3::ckpt
