// docs/environment.md lists exactly the variables zero3/core/env.hpp declares, each with the header's words, and
// env::get refuses a name the header does not declare.
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <string>

#include "zero3/core/env.hpp"
#include "zero3/core/error.hpp"

namespace {

std::string read_doc() {
  const std::string path = std::string(ZERO3_SOURCE_DIR) + "/docs/environment.md";
  std::ifstream in(path);
  INFO(path);
  REQUIRE(in.good());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::size_t count_rows(const std::string& doc) {
  std::size_t n = 0;
  for (std::size_t at = doc.find("\n| `ZERO3_"); at != std::string::npos; at = doc.find("\n| `ZERO3_", at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("docs/environment.md has one row per declared variable, in the header's words") {
  const std::string doc = read_doc();
  for (const zero3::env::Variable& v : zero3::env::kVariables) {
    const std::string row =
        "| `" + std::string(v.name) + "` | " + std::string(v.values) + " | " + std::string(v.meaning) + " |\n";
    INFO("expected row (regenerate the table from runtime/include/zero3/core/env.hpp): " << row);
    CHECK(doc.find(row) != std::string::npos);
  }
  CHECK(count_rows(doc) == zero3::env::kVariables.size());
}

TEST_CASE("env::get reads only declared variables") {
  CHECK_THROWS_AS(zero3::env::get("ZERO3_NOT_DECLARED"), zero3::UsageError);
  CHECK_NOTHROW(zero3::env::get(zero3::env::kProgressPort));
}
