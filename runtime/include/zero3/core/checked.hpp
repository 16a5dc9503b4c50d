// Checked integer arithmetic for sizes computed from values a user or a file gave (a config's model shape, a
// checkpoint's counters, a file's header): a product, sum or narrowing that does not fit its type throws instead
// of wrapping. The caller names the quantity (`what`) and the error type (ConfigError for a config's value,
// CheckpointError for a checkpoint's), so the message says which value was too large and the exit status says
// whose it was. Header-only; any thread.
#pragma once

#include <fmt/format.h>

#include <concepts>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include "zero3/core/error.hpp"

namespace zero3 {

// "a 32-bit integer", "a 64-bit unsigned integer": the type a message says a value did not fit.
template <std::integral T>
std::string integer_type_name() {
  return fmt::format("a {}-bit {}integer", std::numeric_limits<T>::digits + (std::is_signed_v<T> ? 1 : 0),
                     std::is_signed_v<T> ? "" : "unsigned ");
}

// a * b, or Err("<what>: <a> * <b> overflows a 64-bit unsigned integer").
template <class Err = Error, std::integral T>
T checked_mul(T a, T b, std::string_view what) {
  T r{};
  if (__builtin_mul_overflow(a, b, &r)) {
    throw Err(fmt::format("{}: {} * {} overflows {}", what, a, b, integer_type_name<T>()));
  }
  return r;
}

// a + b, or Err("<what>: <a> + <b> overflows ...").
template <class Err = Error, std::integral T>
T checked_add(T a, T b, std::string_view what) {
  T r{};
  if (__builtin_add_overflow(a, b, &r)) {
    throw Err(fmt::format("{}: {} + {} overflows {}", what, a, b, integer_type_name<T>()));
  }
  return r;
}

// `v` as a To, or Err("<what>: <v> is out of range (<lo> .. <hi>, a 32-bit integer)") when To cannot hold it.
template <std::integral To, class Err = Error, std::integral From>
To checked_narrow(From v, std::string_view what) {
  To r{};
  if (__builtin_add_overflow(v, From{0}, &r)) {
    throw Err(fmt::format("{}: {} is out of range ({} .. {}, {})", what, v, std::numeric_limits<To>::min(),
                          std::numeric_limits<To>::max(), integer_type_name<To>()));
  }
  return r;
}

}  // namespace zero3
