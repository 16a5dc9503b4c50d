// The event log: one JSON line per event in <run dir>/events.jsonl, and the alert command fed the line.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "zero3/core/events.hpp"

namespace {

std::vector<nlohmann::json> read_lines(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("zero3-events-" + name + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace

TEST_CASE("events are JSON lines with every field, non-finite figures as strings", "[events]") {
  const auto dir = fresh_dir("lines");
  zero3::events::configure({.run_dir = dir, .rank = 3});
  zero3::events::emit({.level = zero3::log::Level::warning,
                       .kind = "nonfinite_skip",
                       .step = 17,
                       .message = "step 17 skipped: \"w\" is\tnot finite",
                       .figures = {{"grad_norm", std::numeric_limits<double>::infinity()}, {"loss", 2.5}},
                       .fields = {{"param", "blocks.3.w"}}});
  zero3::events::emit({.level = zero3::log::Level::info, .kind = "note", .message = "second"});
  const auto lines = read_lines(dir / "events.jsonl");
  REQUIRE(lines.size() == 2);
  const auto& e = lines[0];
  CHECK(e["level"] == "warning");
  CHECK(e["rank"] == 3);
  CHECK(e["step"] == 17);
  CHECK(e["kind"] == "nonfinite_skip");
  CHECK(e["message"] == "step 17 skipped: \"w\" is\tnot finite");
  CHECK(e["figures"]["grad_norm"] == "inf");
  CHECK(e["figures"]["loss"] == 2.5);
  CHECK(e["fields"]["param"] == "blocks.3.w");
  CHECK(e["time"].get<std::string>().size() == 24);  // 2026-12-02T14:40:31.123Z
  CHECK(lines[1]["step"] == -1);
  zero3::events::configure({});
  std::filesystem::remove_all(dir);
}

TEST_CASE("an event quoting bytes that are not UTF-8 is still a JSON line", "[events]") {
  const auto dir = fresh_dir("utf8");
  zero3::events::configure({.run_dir = dir, .rank = 0});
  const std::string name = "/data/tok\xe9ns\xff.bin";  // Latin-1 e-acute and a byte no UTF-8 has
  zero3::events::emit({.level = zero3::log::Level::error,
                       .kind = "train_failed",
                       .message = "cannot open " + name + ": \x01",
                       .fields = {{"file\xc3", name}}});
  const auto lines = read_lines(dir / "events.jsonl");  // throws when a line is not JSON
  REQUIRE(lines.size() == 1);
  CHECK(lines[0]["message"] == "cannot open /data/tok\uFFFDns\uFFFD.bin: \x01");
  CHECK(lines[0]["fields"]["file\uFFFD"] == "/data/tok\uFFFDns\uFFFD.bin");
  zero3::events::configure({});
  std::filesystem::remove_all(dir);
}

TEST_CASE("the alert command receives warnings and errors on stdin, not info", "[events]") {
  const auto dir = fresh_dir("alert");
  std::filesystem::create_directories(dir);
  const auto got = dir / "alerts.txt";
  zero3::events::configure({.run_dir = dir, .rank = 0, .alert_command = "cat >> '" + got.string() + "'"});
  zero3::events::emit({.level = zero3::log::Level::info, .kind = "quiet", .message = "not an alert"});
  zero3::events::emit({.level = zero3::log::Level::error, .kind = "collective_timeout", .message = "rank 1 missing"});
  REQUIRE(zero3::events::flush(std::chrono::seconds(10)));
  const auto alerts = read_lines(got);
  REQUIRE(alerts.size() == 1);
  CHECK(alerts[0]["kind"] == "collective_timeout");
  CHECK(alerts[0]["level"] == "error");
  zero3::events::configure({});
  std::filesystem::remove_all(dir);
}

TEST_CASE("a failing or silent alert command neither blocks nor throws", "[events]") {
  zero3::events::configure({.alert_command = "exit 3"});
  zero3::events::emit({.level = zero3::log::Level::warning, .kind = "a", .message = "to a command that fails"});
  CHECK(zero3::events::flush(std::chrono::seconds(10)));
  zero3::events::configure({.alert_command = "exec sleep 3 >/dev/null 2>&1"});
  zero3::events::emit({.level = zero3::log::Level::warning, .kind = "b", .message = "to a command that hangs"});
  CHECK_FALSE(zero3::events::flush(std::chrono::milliseconds(200)));
  zero3::events::configure({});
}
