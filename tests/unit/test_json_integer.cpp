// zero3/core/json_integer.hpp: which JSON values are integers int64 holds, at and just past the edges, for
// values parsed from text as a file gives them (nlohmann keeps 2^63 and above as unsigned, floats as doubles).
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>

#include "zero3/core/json_integer.hpp"

namespace {

using zero3::json_fractional;
using zero3::json_integer;
using zero3::json_integer_or_integral_float;
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

nlohmann::json parsed(const char* text) {
  return nlohmann::json::parse(text);
}

}  // namespace

TEST_CASE("json_integer takes the integers int64 holds and nothing else", "[core][json]") {
  CHECK(json_integer(parsed("0")) == 0);
  CHECK(json_integer(parsed("-7")) == -7);
  CHECK(json_integer(parsed("9223372036854775807")) == kMax);
  CHECK(json_integer(parsed("-9223372036854775808")) == kMin);
  // Past int64: nlohmann holds these as unsigned, and get<int64_t>() would make them negative.
  CHECK(json_integer(parsed("9223372036854775808")) == std::nullopt);
  CHECK(json_integer(parsed("18446744073709551615")) == std::nullopt);
  CHECK(json_integer(parsed("4294967296")) == std::int64_t{1} << 32);
  for (const char* other : {"1.0", "1.5", "5e8", "\"5\"", "true", "null", "[1]", "{}"}) {
    INFO(other);
    CHECK(json_integer(parsed(other)) == std::nullopt);
  }
}

TEST_CASE("json_integer_or_integral_float also takes whole floats within int64", "[core][json]") {
  CHECK(json_integer_or_integral_float(parsed("5e8")) == 500000000);
  CHECK(json_integer_or_integral_float(parsed("1.0")) == 1);
  CHECK(json_integer_or_integral_float(parsed("-2.0")) == -2);
  CHECK(json_integer_or_integral_float(parsed("12")) == 12);
  CHECK(json_integer_or_integral_float(parsed("-9.223372036854775808e18")) == kMin);
  // 2^63 as a float is exact and one past int64's largest value.
  CHECK(json_integer_or_integral_float(parsed("9.223372036854775808e18")) == std::nullopt);
  CHECK(json_integer_or_integral_float(parsed("1e30")) == std::nullopt);
  CHECK(json_integer_or_integral_float(parsed("1.5")) == std::nullopt);
  CHECK(json_integer_or_integral_float(parsed("9223372036854775808")) == std::nullopt);
  CHECK(json_integer_or_integral_float(parsed("\"5e8\"")) == std::nullopt);
}

TEST_CASE("json_fractional names floats with a fractional part only", "[core][json]") {
  CHECK(json_fractional(parsed("1.5")));
  CHECK(json_fractional(parsed("-0.25")));
  CHECK_FALSE(json_fractional(parsed("2.0")));
  CHECK_FALSE(json_fractional(parsed("1e30")));
  CHECK_FALSE(json_fractional(parsed("3")));
  CHECK_FALSE(json_fractional(parsed("\"1.5\"")));
}
