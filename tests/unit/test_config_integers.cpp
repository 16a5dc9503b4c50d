// Integer keys: each is read with the range of the C++ type its value lands in (a model's sizes are int) as
// well as its row's own range, so that 2^32 + k is refused by name instead of wrapping to k. Exact integers
// written as floats (1e8) are integers, as in DeepSpeed's pydantic blocks; fractions are refused.
#include <catch2/catch.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "test_config_helpers.hpp"

using namespace zero3::config;
using zero3::config::testing::dump;
using zero3::config::testing::has;
using zero3::config::testing::parse;

namespace {

// A valid gpt model block with `key` set to the JSON text `value`.
std::string with_model_key(const std::string& key, const std::string& value) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::parse(
      R"({"train_batch_size": 8, "zero3": {"model": {"type": "gpt", "layers": 2, "hidden_size": 64, "heads": 4,
          "vocab_size": 64, "seq_len": 32}}})");
  doc["zero3"]["model"][key] = nlohmann::ordered_json::parse(value);
  return doc.dump();
}

}  // namespace

TEST_CASE("a model size past a 32-bit int is refused by key and value, not wrapped", "[config][integers]") {
  for (const std::string key : {"layers", "hidden_size", "heads", "vocab_size", "seq_len"}) {
    for (const std::string value : {"4294967297", "4294967360", "2147483648", "18446744073709551615"}) {
      INFO(key << " = " << value);
      const ParseResult r = parse(with_model_key(key, value));
      INFO(dump(r));
      CHECK_FALSE(r.ok());
      CHECK(has(r.errors, "zero3.model." + key, value + " is out of range (1 .. 2147483647, a 32-bit integer)"));
    }
  }
  // Past int64 as well: a float no integer type holds.
  CHECK(has(parse(with_model_key("layers", "1e30")).errors, "zero3.model.layers",
            "1e+30 is out of range (1 .. 2147483647, a 32-bit integer)"));
}

TEST_CASE("the largest int is a model size; below the row's minimum is the row's error", "[config][integers]") {
  const ParseResult largest = parse(with_model_key("seq_len", "2147483647"));
  INFO(dump(largest));
  REQUIRE(largest.ok());
  CHECK(largest.config->zero3.model->seq_len == 2147483647);
  for (const std::string value : {"-1", "0", "-4294967297"}) {
    INFO(value);
    CHECK(has(parse(with_model_key("layers", value)).errors, "zero3.model.layers", "must be > 0, got " + value));
  }
}

TEST_CASE("an integer written as an exact float is that integer; a fraction is refused", "[config][integers]") {
  const ParseResult r = parse(with_model_key("layers", "1e8"));
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.config->zero3.model->layers == 100000000);
  CHECK(has(parse(with_model_key("layers", "1.5")).errors, "zero3.model.layers", "got 1.5 (a fractional number)"));
  CHECK(has(parse(with_model_key("hidden_size", "64.5")).errors, "zero3.model.hidden_size",
            "got 64.5 (a fractional number)"));
  CHECK(has(parse(with_model_key("hidden_size", "6.4e9")).errors, "zero3.model.hidden_size",
            "6400000000.0 is out of range (1 .. 2147483647, a 32-bit integer)"));
}

TEST_CASE("a micro-batch is held in an int; a 64-bit key keeps the 64-bit range", "[config][integers]") {
  CHECK(has(parse(R"({"train_batch_size": 4294967296, "train_micro_batch_size_per_gpu": 4294967296})").errors,
            "train_micro_batch_size_per_gpu", "4294967296 is out of range (1 .. 2147483647, a 32-bit integer)"));
  const ParseResult big =
      parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "sub_group_size": 1099511627776}})");
  INFO(dump(big));
  REQUIRE(big.ok());
  CHECK(big.config->zero.sub_group_size == std::int64_t{1} << 40);
  CHECK(
      has(parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "sub_group_size": 9223372036854775808}})")
              .errors,
          "zero_optimization.sub_group_size", "9223372036854775808 is out of range (0 .. 9223372036854775807"));
}

TEST_CASE("the key table states the type a narrowed integer lands in", "[config][integers][schema]") {
  CHECK(type_text(find_key("zero3.model", "layers")->type) == "int > 0, at most 2147483647");
  CHECK(type_text(find_key("zero_optimization", "sub_group_size")->type) == "int >= 0");
  // Every size of the model lands in the model's int fields.
  for (const KeySpec& k : known_keys()) {
    if (k.block != "zero3.model" || k.type.kind != ValueType::Kind::integer) continue;
    INFO(k.key);
    CHECK(k.type.held_max == 2147483647);
  }
}
