// zero3/core/json_text.hpp: UTF-8 validation, U+FFFD per maximal subpart (checked against the examples of
// the Unicode Standard, 3.9 "U+FFFD Substitution of Maximal Subparts", and against nlohmann::json's own
// replacement), and JSON string literals that a JSON parser reads back.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "zero3/core/json_text.hpp"

using zero3::json_quoted;
using zero3::utf8_or_replacement;
using zero3::valid_utf8;

namespace {
const std::string kFffd = "\xEF\xBF\xBD";

// nlohmann::json's replacement of the same bytes, as an independent reference.
std::string nlohmann_replacement(const std::string& bytes) {
  return nlohmann::json::parse(nlohmann::json(bytes).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace))
      .get<std::string>();
}
}  // namespace

TEST_CASE("well-formed UTF-8 is recognised and kept byte for byte") {
  for (const std::string text :
       {"", "plain ascii", "caf\xC3\xA9", "\xE2\x82\xAC 5", "\xF0\x9F\x98\x80", "\xF4\x8F\xBF\xBF", "\xED\x9F\xBF"}) {
    CHECK(valid_utf8(text));
    CHECK(utf8_or_replacement(text) == text);
  }
}

TEST_CASE("ill-formed sequences are refused: overlongs, surrogates, beyond U+10FFFF, truncated, stray") {
  for (const std::string text : {"\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF5\x80\x80\x80",
                                 "\xE2\x82", "\x80", "abc\xFF", "\xC3"}) {
    CHECK_FALSE(valid_utf8(text));
  }
}

TEST_CASE("each maximal subpart becomes one U+FFFD, as the Unicode Standard's table 3-8 shows") {
  // Table 3-8's example: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d
  const std::string bytes = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string expected = "a" + kFffd + kFffd + kFffd + "b" + kFffd + "c" + kFffd + kFffd + "d";
  CHECK(utf8_or_replacement(bytes) == expected);
  for (const std::string& text : {bytes, std::string("tok\xE9ns\xFF.bin"), std::string("\xF0\x9F\x98"),
                                  std::string("\xED\xA0\x80x"), std::string("\xE0\x80\xAF")}) {
    CHECK(utf8_or_replacement(text) == nlohmann_replacement(text));
  }
}

TEST_CASE("json_quoted makes a literal that parses back to the replaced text") {
  const std::string text = std::string("a \"quoted\" \\ path\n\t\x01\x7F tok\xE9ns");
  const std::string literal = json_quoted(text);
  CHECK(literal.front() == '"');
  CHECK(literal.back() == '"');
  CHECK(nlohmann::json::parse(literal).get<std::string>() == utf8_or_replacement(text));
}
