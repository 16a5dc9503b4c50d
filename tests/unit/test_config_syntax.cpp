// Config file syntax: zero3 reads what DeepSpeed's hjson reader (hjson 3.1.0, hjson.load with a duplicate-key
// hook) reads, to the same values, and names each relaxation of JSON in a warning with its line and column;
// in strict mode each is an error. Every expected value below is hjson-py's reading of the input, written as
// JSON (tools/python/ds_compat/hjson_diff.py checks these against hjson-py); "jsonrule" marks valid JSON on which
// hjson's value differs from JSON's (hjson turns 1.0 into 1), where zero3 follows JSON.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "../../runtime/config/json_reader.hpp"
#include "test_config_helpers.hpp"

using namespace zero3::config;
using zero3::config::detail::Json;
using zero3::config::detail::read_json_document;
using zero3::config::detail::SyntaxMode;

namespace {

struct Expected {
  int line;
  int column;
  const char* text;  // must occur in the message
};

struct Case {
  const char* name;
  const char* input;
  const char* value;  // hjson-py's reading, as JSON
  std::vector<Expected> warnings;
};

struct Read {
  bool ok = false;
  Json value;
  std::vector<Diagnostic> errors;
  std::vector<Diagnostic> warnings;
};

Read read(std::string_view text, SyntaxMode mode) {
  Read r;
  r.ok = read_json_document(text, "cfg.json", r.value, r.errors, r.warnings, mode);
  return r;
}

std::string lines(const std::vector<Diagnostic>& ds) {
  std::string s;
  for (const auto& d : ds) s += format_diagnostic("-", d) + "\n";
  return s;
}

bool mentions(const std::vector<Diagnostic>& ds, const Expected& e) {
  const std::string prefix = "line " + std::to_string(e.line) + ", column " + std::to_string(e.column) + ": ";
  for (const auto& d : ds) {
    if (d.path == "cfg.json" && d.message.rfind(prefix, 0) == 0 && d.message.find(e.text) != std::string::npos) {
      return true;
    }
  }
  return false;
}

const Case kAccepted[] = {
    {"comments of all three kinds",
     R"hj({
  // a
  "a": 1, # b
  /* c */ "b": 2
})hj",
     R"js({"a": 1, "b": 2})js",
     {{2, 3, "a // comment"}, {3, 11, "a # comment"}, {4, 3, "a /* */ comment"}}},
    {"trailing commas",
     R"hj({"a": [1, 2,],
 "b": 3,
})hj",
     R"js({"a": [1, 2], "b": 3})js",
     {{1, 12, "trailing comma before ']'"}, {2, 8, "trailing comma before '}'"}}},
    {"line breaks instead of commas",
     R"hj({
 "a": 1
 "b": [1
 2]
})hj",
     R"js({"a": 1, "b": [1, 2]})js",
     {{3, 2, "no comma between two members"}, {4, 2, "no comma between two elements"}}},
    {"a comma on the next line", "{\"a\": 1\n,\"b\": 2\n}", R"js({"a": 1, "b": 2})js", {}},
    {"no comma after a quoted value on the same line",
     R"hj({"a": "x" "b": 2})hj",
     R"js({"a": "x", "b": 2})js",
     {{1, 11, "no comma between two members"}}},
    {"unquoted keys, one warning per line",
     R"hj({train_batch_size: 8, zero_optimization: {stage: 3}})hj",
     R"js({"train_batch_size": 8, "zero_optimization": {"stage": 3}})js",
     {{1, 2, "the unquoted key \"train_batch_size\""}}},
    {"an unquoted key with blanks before ':'",
     R"hj({ab  : 1, "a b": 2})hj",
     R"js({"ab": 1, "a b": 2})js",
     {{1, 2, "unquoted key \"ab\""}}},
    {"quoteless values run to the end of the line",
     R"hj({
 "type": AdamW,
 "lr": 0.001,
 "b": x # c
})hj",
     R"js({"type": "AdamW,", "lr": 0.001, "b": "x # c"})js",
     {{2, 10,
       "the quoteless string \"AdamW,\" (an unquoted value that is not a JSON number, true, false or null is "
       "text to the end of its line; the ',' is part of the string)"},
      {3, 2, "no comma between two members"},
      {4, 7, "quoteless string \"x # c\""}}},
    {"a number followed by text is text",
     R"hj({"a": 3abc
 "b": 1 2
 "c": 5// c
 "d": 5/2
})hj",
     R"js({"a": "3abc", "b": "1 2", "c": 5, "d": "5/2"})js",
     {{1, 7, "quoteless string \"3abc\""},
      {2, 2, "no comma"},
      {2, 7, "quoteless string \"1 2\""},
      {3, 2, "no comma"},
      {3, 8, "a // comment"},
      {4, 2, "no comma"},
      {4, 7, "quoteless string \"5/2\""}}},
    {"true, null, false without quotes are JSON's",
     R"hj({"a": true # t
 "b": null, "c": false})hj",
     R"js({"a": true, "b": null, "c": false})js",
     {{1, 12, "a # comment"}, {2, 2, "no comma"}}},
    {"not JSON numbers are strings",
     R"hj({"a": NaN
"b": -Infinity
"c": 01
"d": +1
"e": .5
"f": 1.
"g": 0x10
})hj",
     R"js({"a": "NaN", "b": "-Infinity", "c": "01", "d": "+1", "e": ".5", "f": "1.", "g": "0x10"})js",
     {{1, 7, "quoteless string \"NaN\""},
      {2, 1, "no comma"},
      {2, 6, "quoteless string \"-Infinity\""},
      {3, 1, "no comma"},
      {3, 6, "quoteless string \"01\""},
      {4, 1, "no comma"},
      {4, 6, "quoteless string \"+1\""},
      {5, 1, "no comma"},
      {5, 6, "quoteless string \".5\""},
      {6, 1, "no comma"},
      {6, 6, "quoteless string \"1.\""},
      {7, 1, "no comma"},
      {7, 6, "quoteless string \"0x10\""}}},
    {"a value on a later line, blanks stripped",
     "{\"a\":\n\n  value with spaces   \n}",
     R"js({"a": "value with spaces"})js",
     {{3, 3, "quoteless string \"value with spaces\""}}},
    {"almost a keyword", "{\"a\": tru\n}", R"js({"a": "tru"})js", {{1, 7, "quoteless string \"tru\""}}},
    {"a keyword glued to a brace is text to the line end",
     "{\"a\": truex}\n}",
     R"js({"a": "truex}"})js",
     {{1, 7, "quoteless string \"truex}\""}}},
    {"a line break inside an array of quoteless strings",
     "{\"a\": [x, y\n]}",
     R"js({"a": ["x, y"]})js",
     {{1, 8, "quoteless string \"x, y\""}}},
    {"comments around a number",
     R"hj({"a": /* c */ 1 /* d */ , "b": 2})hj",
     R"js({"a": 1, "b": 2})js",
     {{1, 7, "a /* */ comment"}}},
    {"comment markers inside a quoteless string",
     "{\"a\": x /* c */\n}",
     R"js({"a": "x /* c */"})js",
     {{1, 7, "quoteless string \"x /* c */\""}}},
    {"comments between array elements",
     "{\"a\": [\n  1 # one\n  2 // two\n]}",
     R"js({"a": [1, 2]})js",
     {{2, 5, "a # comment"}, {3, 3, "no comma"}, {3, 5, "a // comment"}}},
    {"a number and blanks before a comma", "{\"a\": -1 \t,\n}", R"js({"a": -1})js", {{1, 11, "trailing comma"}}},
    {"a minus sign and a space", "{\"a\": - 1\n}", R"js({"a": "- 1"})js", {{1, 7, "quoteless string \"- 1\""}}},
    {"no root braces",
     "train_batch_size: 8\nzero_optimization: {\n  stage: 3\n}\n",
     R"js({"train_batch_size": 8, "zero_optimization": {"stage": 3}})js",
     {{1, 1, "a top-level object without its { } braces"},
      {1, 1, "unquoted key \"train_batch_size\""},
      {2, 1, "no comma between two members"},
      {2, 1, "unquoted key \"zero_optimization\""},
      {3, 3, "unquoted key \"stage\""}}},
    {"no root braces and a trailing comma",
     "a: 1,\n",
     R"js({"a": 1})js",
     {{1, 1, "without its { } braces"}, {1, 1, "unquoted key"}, {1, 5, "trailing comma before the end of the file"}}},
    {"a multi-line string loses the indent of its '''",
     R"hj({
  "a": '''
       first
         second
     third
       '''
})hj",
     R"js({"a": "first\n  second\nthird"})js",
     {{2, 8, "a '''multi-line''' string"}}},
    {"a multi-line string followed by a member",
     "{\"a\": '''\n  one\n  two\n  ''', \"b\": 1}",
     R"js({"a": "one\ntwo", "b": 1})js",
     {{1, 7, "multi-line"}}},
    {"a multi-line string starting on its ''' line",
     "{\"a\": '''  same line\n   next\n  '''}",
     R"js({"a": "same line\nnext"})js",
     {{1, 7, "multi-line"}}},
    {"a ''' string on the first line of a file that ends with a line break",
     "{\"a\": '''x'''}\n",
     R"js({"a": "x"})js",
     {{1, 7, "multi-line"}}},
    {"a ''' string on the first line: hjson counts the last line into the indent",
     "{\"a\": '''x\n    y'''}",
     R"js({"a": "x\ny"})js",
     {{1, 7, "multi-line"}}},
    {"escapes",
     R"hj({"a": "tab\t \u00e9 \ud83d\ude00 \/ \\ \""})hj",
     R"js({"a": "tab\t \u00e9 \ud83d\ude00 / \\ \""})js",
     {}},
    {"escaped NUL and non-ASCII keys", R"hj({"\u00e9": 1, "a\u0000b": 2})hj", R"js({"é": 1, "a\u0000b": 2})js", {}},
    {"the \\' escape", R"hj({"a": "it\'s"})hj", R"js({"a": "it's"})js", {{1, 10, "the escape \\'"}}},
    {"single-quoted strings", R"hj({'a': 'b "c"'})hj", R"js({"a": "b \"c\""})js", {{1, 2, "a single-quoted string"}}},
    {"CRLF line ends", "{\r\n  a: 1\r\n}", R"js({"a": 1})js", {{2, 3, "unquoted key \"a\""}}},
    {"a byte order mark", "\xEF\xBB\xBF{\"a\": 1}", R"js({"a": 1})js", {}},
    {"valid JSON numbers",
     R"hj({"lr": 1e-4,
 "b": [0.9, 0.999],
 "c": -1, "d": 18446744073709551615, "e": -9223372036854775808})hj",
     R"js({"lr": 0.0001, "b": [0.9, 0.999], "c": -1, "d": 18446744073709551615, "e": -9223372036854775808})js",
     {}},
    {"integral floats stay floats",
     R"hj({"a": 1.0, "b": 1e3, "c": -0.0, "d": 2.5e-3})hj",
     R"jsonrule({"a": 1.0, "b": 1000.0, "c": -0.0, "d": 0.0025})jsonrule",
     {}},
    {"integers past 64 bits become doubles",
     R"hj({"a": 123456789012345678901234567890})hj",
     R"jsonrule({"a": 1.2345678901234568e+29})jsonrule",
     {}},
};

// Inputs hjson-py rejects too; `where` is the error's "line L, column C".
struct Rejected {
  const char* name;
  const char* input;
  const char* value;  // nullptr: hjson-py rejects it (the field keeps hjson_diff.py's pattern)
  const char* where;
  const char* text;
};

const Rejected kRejected[] = {
    {"a key with a space", R"hj({a b: 1})hj", nullptr, "line 1, column 3", "whitespace inside an unquoted key"},
    {"two commas", R"hj([1,,2])hj", nullptr, "line 1, column 4", "expected a value, found ','"},
    {"two commas in an object", R"hj({"a": "x",, "b": 2})hj", nullptr, "line 1, column 11", "found ','"},
    {"a colon missing", R"hj({"a" 1})hj", nullptr, "line 1, column 6", "expected ':'"},
    {"a line break in a quoted string", "{\"a\": \"x\ny\"}", nullptr, "line 1, column 9",
     "a line break inside a string"},
    {"a quoteless value swallows the closing bracket", "{\"a\": [x, y]\n}", nullptr, "line 2, column 1",
     "expected a value, found '}'"},
    {"a number glued to a quoted key", R"hj({"a": 1 "b": 2})hj", nullptr, "line 1, column 16",
     "the end of the file inside the object"},
    {"text after the document", R"hj({"a": 1} x)hj", nullptr, "line 1, column 10", "more text after the end"},
    {"an unclosed object", "{\"train_batch_size\": 8,\n", nullptr, "line 2, column 1", "the end of the file"},
    {"a ''' string in a one-line file", R"hj({"a": '''x'''})hj", nullptr, "line 1, column 7", "one line"},
    {"a number out of range", R"hj({"a": 1e400})hj", nullptr, "line 1, column 7", "out of range"},
    {"a repeated unquoted key", "a: {b: 1\nb: 2}", nullptr, "", ""},
};

}  // namespace

TEST_CASE("hjson syntax DeepSpeed accepts is read to hjson's values, each relaxation a warning", "[config][syntax]") {
  for (const Case& c : kAccepted) {
    INFO(c.name << "\ninput:\n" << c.input);
    const Read r = read(c.input, SyntaxMode::deepspeed);
    INFO("errors:\n" << lines(r.errors) << "warnings:\n" << lines(r.warnings));
    REQUIRE(r.ok);
    CHECK(r.errors.empty());
    CHECK(r.value.dump() == Json::parse(c.value).dump());
    for (const Expected& e : c.warnings) CHECK(mentions(r.warnings, e));
    for (const auto& w : r.warnings) CHECK_THAT(w.message, Catch::Contains("DeepSpeed's hjson reader"));
    CHECK(r.warnings.size() == c.warnings.size());

    const Read strict = read(c.input, SyntaxMode::strict_json);
    INFO("strict errors:\n" << lines(strict.errors));
    CHECK(strict.warnings.empty());
    for (const Expected& e : c.warnings) CHECK(mentions(strict.errors, e));
    if (c.warnings.empty()) {
      CHECK(strict.ok);
      CHECK(strict.errors.empty());
    } else {
      CHECK_FALSE(strict.ok);
      CHECK(strict.errors.size() == r.warnings.size());
      for (const auto& e : strict.errors) CHECK_THAT(e.message, Catch::Contains("is not strict JSON"));
    }
  }
}

TEST_CASE("text hjson rejects is an error with line and column", "[config][syntax]") {
  for (const Rejected& c : kRejected) {
    INFO(c.name << "\ninput:\n" << c.input);
    for (SyntaxMode mode : {SyntaxMode::deepspeed, SyntaxMode::strict_json}) {
      const Read r = read(c.input, mode);
      INFO("errors:\n" << lines(r.errors));
      CHECK_FALSE(r.errors.empty());
      if (*c.where == '\0') continue;
      CHECK_FALSE(r.ok);
      bool found = false;
      for (const auto& e : r.errors) {
        found = found || (e.message.find(c.where) != std::string::npos && e.message.find(c.text) != std::string::npos);
      }
      CHECK(found);
    }
  }
}

TEST_CASE("a repeated key is an error at its JSON path, also without quotes or braces", "[config][syntax]") {
  const Read r = read("a: {b: 1\nb: 2}", SyntaxMode::deepspeed);
  INFO(lines(r.errors));
  REQUIRE(r.errors.size() == 1);
  CHECK(r.errors[0].path == "a.b");
  CHECK_THAT(r.errors[0].message, Catch::Contains("duplicate key"));
  CHECK(r.value.dump() == R"({"a":{"b":2}})");  // the last value, at the first key's place
}

TEST_CASE("empty and comment-only files are errors, as before", "[config][syntax]") {
  for (const char* text : {"", " \n\t", "// only\n/* comments */\n"}) {
    for (SyntaxMode mode : {SyntaxMode::deepspeed, SyntaxMode::strict_json}) {
      const Read r = read(text, mode);
      CHECK_FALSE(r.ok);
      REQUIRE(r.errors.size() == 1);
      CHECK_THAT(r.errors[0].message, Catch::Contains("empty file"));
    }
  }
}

TEST_CASE("a top level that is not an object is an error", "[config][syntax]") {
  for (const char* text : {"\"config\"", "8", "null", "[1, 2]", "text without a colon"}) {
    const Read r = read(text, SyntaxMode::deepspeed);
    INFO(text << "\n" << lines(r.errors));
    CHECK_FALSE(r.ok);
    REQUIRE(r.errors.size() == 1);
  }
  CHECK_THAT(read("\"config\"", SyntaxMode::deepspeed).errors[0].message, Catch::Contains("the top level is a string"));
  // hjson: not an object without braces, so one quoteless string.
  CHECK_THAT(read("text without a colon", SyntaxMode::deepspeed).errors[0].message,
             Catch::Contains("the top level is a string"));
  // Neither an object without braces nor one value: the object's error, saying how the file was read.
  const Read neither = read("a: 1\nb", SyntaxMode::deepspeed);
  REQUIRE_FALSE(neither.errors.empty());
  CHECK_THAT(neither.errors.back().message, Catch::Contains("line 2, column 1"));
  CHECK_THAT(neither.errors.back().message, Catch::Contains("read as an object without braces"));
}

TEST_CASE("warnings stop at 20 and a count", "[config][syntax]") {
  std::string text;
  for (int i = 0; i < 30; ++i) text += "k" + std::to_string(i) + ": 1\n";  // 30 unquoted keys, 29 missing commas
  const Read r = read(text, SyntaxMode::deepspeed);
  REQUIRE(r.ok);
  CHECK(r.value.size() == 30);
  REQUIRE(r.warnings.size() == 21);
  CHECK_THAT(r.warnings.back().message, Catch::Contains("and 40 more uses of hjson syntax"));
  const Read strict = read(text, SyntaxMode::strict_json);
  CHECK(strict.errors.size() == 21);
}

TEST_CASE("hostile input: deep nesting, long lines, many keys", "[config][syntax]") {
  SECTION("nesting past 512 levels is an error, not a crash") {
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    const Read r = read(deep, SyntaxMode::deepspeed);
    REQUIRE(r.errors.size() == 1);
    CHECK_THAT(r.errors[0].message, Catch::Contains("nesting deeper than 512 levels"));
    const Read objects = read(std::string(5000, '{'), SyntaxMode::deepspeed);
    CHECK_FALSE(objects.ok);
  }
  SECTION("512 levels are fine") {
    std::string ok = "{\"a\": " + std::string(511, '[') + std::string(511, ']') + "}";
    CHECK(read(ok, SyntaxMode::strict_json).ok);
  }
  SECTION("many keys and a long quoteless line") {
    std::string text = "{";
    for (int i = 0; i < 200000; ++i) text += "\"k" + std::to_string(i) + "\": 1,";
    text += "\"long\": " + std::string(1 << 20, 'x') + ",,,]]]}}}\n}";
    const Read r = read(text, SyntaxMode::deepspeed);
    REQUIRE(r.ok);
    CHECK(r.value.size() == 200001);
    CHECK(r.value["long"].get<std::string>().size() == (1u << 20) + 9);
  }
  SECTION("unterminated constructs") {
    for (const char* text : {"{\"a\": \"x", "{\"a\": '''\nx", "/* x", "{\"a\": 1 /* x", "{\"a\": \"\\u12",
                             "{\"a\": \"\\ud800\\u\"}", "{\"a\":", "{a", "[", "'", "{\"a\": [1, 2", "\"\\"}) {
      INFO(text);
      const Read r = read(text, SyntaxMode::deepspeed);
      CHECK_FALSE(r.ok);
      CHECK_FALSE(r.errors.empty());
    }
  }
  SECTION("invalid UTF-8 is an error with its place") {
    const Read r = read("{\"a\": \"\xC3\x28\"}", SyntaxMode::deepspeed);
    REQUIRE(r.errors.size() == 1);
    CHECK_THAT(r.errors[0].message, Catch::Contains("not valid UTF-8 text: line 1, column 8"));
  }
  SECTION("an unpaired surrogate escape: hjson keeps it, zero3 cannot") {
    const Read r = read(R"({"a": "\ud800"})", SyntaxMode::deepspeed);
    REQUIRE(r.errors.size() == 1);
    CHECK_THAT(r.errors[0].message, Catch::Contains("hjson accepts this; zero3 does not"));
  }
}

TEST_CASE("parse_config_text reads hjson syntax and passes the warnings on", "[config][syntax]") {
  const ParseResult r = zero3::config::testing::parse(
      "// a DeepSpeed config as users write them\n"
      "{\n"
      "  train_batch_size: 8\n"
      "  optimizer: {type: \"AdamW\", params: {lr: 1e-4}}\n"
      "  zero_optimization: {stage: 3,},\n"
      "}\n");
  INFO(zero3::config::testing::dump(r));
  REQUIRE(r.ok());
  CHECK(r.config->batch.train_batch_size == 8);
  CHECK(zero3::config::testing::has(r.warnings, "<config>", "line 1, column 1: accepted a // comment"));
  CHECK(zero3::config::testing::has(r.warnings, "<config>", "line 3, column 3: accepted the unquoted key"));
  CHECK(zero3::config::testing::has(r.warnings, "<config>", "line 5, column 31: accepted a trailing comma before '}'"));
}
