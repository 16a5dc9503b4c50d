// zero3/core/checked.hpp: products, sums and narrowings at and just past the edges of their types, the error
// type the caller chose and a message naming the quantity and its operands.
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>

#include "zero3/core/checked.hpp"

namespace {

using zero3::checked_add;
using zero3::checked_mul;
using zero3::checked_narrow;
using zero3::ConfigError;
using zero3::Error;

constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();
constexpr std::uint64_t kUint64Max = std::numeric_limits<std::uint64_t>::max();

}  // namespace

TEST_CASE("checked_mul returns the product that fits and refuses the one that does not", "[core][checked]") {
  CHECK(checked_mul(std::uint64_t{1} << 32, std::uint64_t{1} << 31, "x") == std::uint64_t{1} << 63);
  CHECK(checked_mul(kInt64Max, std::int64_t{1}, "x") == kInt64Max);
  CHECK(checked_mul(std::int64_t{-3}, std::int64_t{7}, "x") == -21);
  CHECK(checked_mul(std::size_t{0}, std::size_t{kUint64Max}, "x") == 0);
  CHECK_THROWS_MATCHES(checked_mul(std::uint64_t{1} << 32, std::uint64_t{1} << 32, "the embedding's elements"), Error,
                       Catch::Message("the embedding's elements: 4294967296 * 4294967296 overflows a 64-bit unsigned "
                                      "integer"));
  CHECK_THROWS_AS(checked_mul(kInt64Max / 2 + 1, std::int64_t{2}, "x"), Error);
  CHECK_THROWS_AS(checked_mul(std::int32_t{65536}, std::int32_t{32768}, "x"), Error);
}

TEST_CASE("checked_add returns the sum that fits and refuses the one that does not", "[core][checked]") {
  CHECK(checked_add(kUint64Max - 1, std::uint64_t{1}, "x") == kUint64Max);
  CHECK(checked_add(std::int64_t{-5}, std::int64_t{3}, "x") == -2);
  CHECK_THROWS_MATCHES(checked_add(kUint64Max, std::uint64_t{1}, "params of the model"), Error,
                       Catch::Message("params of the model: 18446744073709551615 + 1 overflows a 64-bit unsigned "
                                      "integer"));
  CHECK_THROWS_AS(checked_add(std::numeric_limits<std::int64_t>::min(), std::int64_t{-1}, "x"), Error);
}

TEST_CASE("checked_narrow keeps every value the narrower type holds", "[core][checked]") {
  CHECK(checked_narrow<int>(std::int64_t{2147483647}, "x") == 2147483647);
  CHECK(checked_narrow<int>(std::int64_t{-2147483648LL}, "x") == std::numeric_limits<int>::min());
  CHECK(checked_narrow<std::uint32_t>(std::int64_t{4294967295LL}, "x") == 4294967295U);
  CHECK(checked_narrow<std::int64_t>(std::uint64_t{1} << 62, "x") == std::int64_t{1} << 62);
  CHECK(checked_narrow<std::size_t>(std::int64_t{0}, "x") == 0);
}

TEST_CASE("checked_narrow refuses a value past either end, naming it and the range", "[core][checked]") {
  // 2^32 + 1 would wrap to 1 in a 32-bit int: the bug this header exists for.
  CHECK_THROWS_MATCHES(checked_narrow<int>(std::int64_t{4294967297LL}, "zero3.model.layers"), Error,
                       Catch::Message("zero3.model.layers: 4294967297 is out of range (-2147483648 .. 2147483647, a "
                                      "32-bit integer)"));
  CHECK_THROWS_AS(checked_narrow<int>(std::int64_t{2147483648LL}, "x"), Error);
  CHECK_THROWS_AS(checked_narrow<std::size_t>(std::int64_t{-1}, "x"), Error);
  CHECK_THROWS_AS(checked_narrow<std::int64_t>(kUint64Max, "x"), Error);
  CHECK_THROWS_AS(checked_narrow<std::uint8_t>(256, "x"), Error);
}

TEST_CASE("the caller chooses the error type", "[core][checked]") {
  CHECK_THROWS_AS(checked_mul<ConfigError>(kUint64Max, std::uint64_t{2}, "x"), ConfigError);
  CHECK_THROWS_AS(checked_add<ConfigError>(kInt64Max, std::int64_t{1}, "x"), ConfigError);
  CHECK_THROWS_AS((checked_narrow<int, ConfigError>(std::int64_t{1} << 40, "x")), ConfigError);
}
