// The real-world config corpus (tests/data/configs/corpus/): each file reproduces a shape found in public
// projects, and manifest.json records DeepSpeed 0.19.8's verdict on it per world size (derived by
// tools/python/ds_compat/ds_verdict.py) and the exit and findings zero3 must give, normally and under strict.
// The manifest is checked here against the parser and against itself: zero3 rejects what DeepSpeed
// rejects and accepts what it accepts, except where an entry states a deliberate difference.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "zero3/config/parse.hpp"

using namespace zero3::config;
using nlohmann::json;

namespace {

const std::string kCorpusDir = std::string(ZERO3_CONFIG_FIXTURES) + "/corpus";

json load_manifest() {
  std::ifstream in(kCorpusDir + "/manifest.json");
  REQUIRE(in.good());
  return json::parse(in);
}

// 0 runnable, 1 valid DeepSpeed but not runnable, 2 invalid: `zero3 config check`'s exit codes.
int exit_class(const ParseResult& r) {
  if (!r.ok()) return 2;
  return r.runnable() ? 0 : 1;
}

struct Finding {
  std::string kind;  // error, warning, not implemented, note
  std::string path;
};

std::vector<Finding> findings_of(const ParseResult& r) {
  std::vector<Finding> out;
  for (const auto& d : r.errors) out.push_back({"error", d.path});
  for (const auto& d : r.warnings) out.push_back({"warning", d.path});
  for (const auto& d : r.not_implemented) out.push_back({"not implemented", d.path});
  for (const auto& n : r.resolved) out.push_back({"note", n.path});
  return out;
}

bool is_file_name(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
}

// The manifest names a key or the block holding it: "zenflow" matches zero_optimization.zenflow.topk_ratio
// only when written "zero_optimization.zenflow". A syntax finding names the file: any diagnostic path that
// contains the file name (the parser may add the directory, line and column) matches it.
bool path_matches(const std::string& expected, const std::string& actual) {
  if (is_file_name(expected)) return actual.find(expected) != std::string::npos;
  if (actual == expected) return true;
  if (actual.size() <= expected.size() || actual.compare(0, expected.size(), expected) != 0) return false;
  const char next = actual[expected.size()];
  return next == '.' || next == '[';
}

std::string describe(const ParseResult& r) {
  std::ostringstream os;
  for (const auto& d : r.errors) os << "\n    " << format_diagnostic("error", d);
  for (const auto& d : r.warnings) os << "\n    " << format_diagnostic("warning", d);
  for (const auto& d : r.not_implemented) os << "\n    " << format_diagnostic("not implemented", d);
  for (const auto& n : r.resolved) os << "\n    " << format_resolution(n);
  return os.str();
}

ParseResult parse_corpus_file(const std::string& file, int world_size, bool strict) {
  ParseOptions options;
  options.world_size = world_size;
  options.world_size_source = "corpus test";
  options.strict = strict;
  return parse_config_file(kCorpusDir + "/" + file, options);
}

// Every difference between what the manifest expects for one file and world size and what the parser gives.
std::vector<std::string> compare(const json& entry, const std::string& ws) {
  const std::string file = entry.at("file").get<std::string>();
  const json& want = entry.at("zero3").at(ws);
  const int world_size = std::stoi(ws);
  std::vector<std::string> problems;
  const std::string where = file + " at world size " + ws;

  const ParseResult normal = parse_corpus_file(file, world_size, false);
  const int got = exit_class(normal);
  if (got != want.at("exit").get<int>()) {
    problems.push_back(where + ": exit " + std::to_string(got) + ", expected " +
                       std::to_string(want.at("exit").get<int>()) + describe(normal));
  }
  const std::vector<Finding> found = findings_of(normal);
  for (const auto& f : want.at("findings")) {
    const std::string kind = f.at(0).get<std::string>();
    const std::string path = f.at(1).get<std::string>();
    bool present = false;
    for (const auto& g : found) present = present || (g.kind == kind && path_matches(path, g.path));
    if (!present) problems.push_back(where + ": no " + kind + " at " + path + describe(normal));
  }

  const ParseResult strict = parse_corpus_file(file, world_size, true);
  const int got_strict = exit_class(strict);
  if (got_strict != want.at("strict_exit").get<int>()) {
    problems.push_back(where + ": strict exit " + std::to_string(got_strict) + ", expected " +
                       std::to_string(want.at("strict_exit").get<int>()) + describe(strict));
  }
  return problems;
}

// DeepSpeed's verdict that zero3 answers to: after the HF Trainer fills "auto" when the file has any
// (DeepSpeed itself fails on unfilled batch "auto"), else the file as DeepSpeed reads it.
const json& reference_verdict(const json& entry, const std::string& ws) {
  const json& ds = entry.at("deepspeed").at(ws);
  return ds.contains("hf") ? ds.at("hf") : ds;
}

}  // namespace

TEST_CASE("corpus: every file parses to the manifest's exit and findings", "[config][corpus]") {
  const json manifest = load_manifest();
  for (const auto& entry : manifest.at("entries")) {
    for (const auto& [ws, expected] : entry.at("zero3").items()) {
      (void)expected;
      for (const auto& problem : compare(entry, ws)) FAIL_CHECK(problem);
    }
  }
}

TEST_CASE("corpus: zero3's expected verdict follows DeepSpeed's unless a difference is stated", "[config][corpus]") {
  const json manifest = load_manifest();
  for (const auto& entry : manifest.at("entries")) {
    const std::string file = entry.at("file").get<std::string>();
    const bool deliberate = entry.contains("difference");
    bool differs_somewhere = false;
    for (const auto& [ws, ds] : entry.at("deepspeed").items()) {
      (void)ds;
      const std::string where = file + " at world size " + ws;
      INFO(where);
      REQUIRE(entry.at("zero3").contains(ws));
      const bool ds_rejects = reference_verdict(entry, ws).at("verdict") == "reject";
      const int zero3_exit = entry.at("zero3").at(ws).at("exit").get<int>();
      const bool differs = ds_rejects != (zero3_exit == 2);
      differs_somewhere = differs_somewhere || differs;
      if (differs && !deliberate) {
        FAIL_CHECK(where + ": DeepSpeed " + (ds_rejects ? "rejects" : "accepts") + " but zero3 is expected to exit " +
                   std::to_string(zero3_exit) + ", and the entry states no difference");
      }
    }
    if (deliberate && !differs_somewhere) FAIL_CHECK(file + ": states a difference but agrees with DeepSpeed");
  }
}

TEST_CASE("corpus: the manifest lists every corpus file, each with four world sizes", "[config][corpus]") {
  const json manifest = load_manifest();
  std::set<std::string> listed;
  for (const auto& entry : manifest.at("entries")) {
    const std::string file = entry.at("file").get<std::string>();
    INFO(file);
    CHECK(listed.insert(file).second);
    CHECK(std::filesystem::exists(kCorpusDir + "/" + file));
    CHECK_FALSE(entry.at("pattern").get<std::string>().empty());
    for (const char* ws : {"1", "2", "4", "8"}) {
      CHECK(entry.at("deepspeed").contains(ws));
      CHECK(entry.at("zero3").contains(ws));
    }
  }
  for (const auto& f : std::filesystem::directory_iterator(kCorpusDir)) {
    const std::string name = f.path().filename().string();
    if (f.path().extension() == ".json" && name != "manifest.json") {
      INFO(name);
      CHECK(listed.count(name) == 1);
    }
  }
}
