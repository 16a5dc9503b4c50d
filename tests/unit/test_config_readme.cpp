// configs/README.md's key table is the one rendered from the schema rows: a change to a key's type, range,
// default or note in runtime/config/schema.cpp fails here until the README is regenerated. Also: the type
// column is rendered from the rows' ranges, and each row's default is what the parser leaves for an absent key.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "zero3/config/key_table.hpp"
#include "zero3/config/model_types.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/config/schema.hpp"

using namespace zero3::config;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// The first line where two texts differ, both sides shown.
std::string first_difference(const std::string& want, const std::string& have) {
  std::istringstream a(want), b(have);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool more_a = static_cast<bool>(std::getline(a, la));
    const bool more_b = static_cast<bool>(std::getline(b, lb));
    if (!more_a && !more_b) return "no difference";
    if (!more_a || !more_b || la != lb) {
      return "line " + std::to_string(line) + " of the table:\n  rendered: " + (more_a ? la : "(end)") +
             "\n  README:   " + (more_b ? lb : "(end)");
    }
  }
}

}  // namespace

TEST_CASE("configs/README.md holds the key table rendered from the schema", "[config][schema]") {
  const std::string path = std::string(ZERO3_SOURCE_DIR) + "/configs/README.md";
  const MarkedSection section = marked_key_table(read_file(path));
  INFO(path << " must hold the lines '" << kKeyTableBegin << "' and '" << kKeyTableEnd << "'");
  REQUIRE(section.found);
  const std::string rendered = key_table_markdown();
  INFO(path << "'s key table is stale: regenerate it with tools/gen-config-keys.sh (after building the zero3 "
               "target), or `zero3 config keys --markdown` between the markers\n"
            << first_difference(rendered, section.text));
  CHECK(section.text == rendered);
}

TEST_CASE("the marked section is found only between both markers, in order", "[config][schema]") {
  const std::string begin(kKeyTableBegin), end(kKeyTableEnd);
  CHECK(marked_key_table("prose\n" + begin + "\n### a\n| x |\n" + end + "\nmore").text == "### a\n| x |\n");
  CHECK_FALSE(marked_key_table("prose\n" + begin + "\n### a\n").found);
  CHECK_FALSE(marked_key_table(end + "\n" + begin + "\n").found);
  CHECK_FALSE(marked_key_table("no markers").found);
}

TEST_CASE("a key's type text is rendered from its range", "[config][schema]") {
  CHECK(type_text(int_min(1)) == "int > 0");
  CHECK(type_text(int_min(0).or_null()) == "int >= 0 or null");
  CHECK(type_text(int_in(0, 3)) == "int in [0, 3]");
  CHECK(type_text(num_above(0)) == "number > 0");
  CHECK(type_text(num_half_open(0, 1)) == "number in [0, 1)");
  CHECK(type_text(num_open(0, 1)) == "number in (0, 1)");
  CHECK(type_text(int_min(2).named("even int")) == "even int >= 2");
  CHECK(type_text("bool") == "bool");
  const KeySpec* bucket = find_key("zero_optimization", "reduce_bucket_size");
  REQUIRE(bucket != nullptr);
  CHECK(type_text(bucket->type) == "int > 0");
}

TEST_CASE("a row's default is the value the parser leaves when the key is absent", "[config][schema]") {
  // Blocks written out in full by the resolved config once a document names them: Adam, WarmupCosineLR,
  // OneCycle and LRRangeTest show their own params; the others are written whenever the document parses.
  const std::vector<std::pair<std::string_view, std::string>> documents = {
      {"optimizer.params (Adam/AdamW)", R"({"train_batch_size": 8, "optimizer": {"type": "Adam"}})"},
      {"optimizer.params (Lion)", R"({"train_batch_size": 8, "optimizer": {"type": "Lion"}})"},
      {"optimizer.params (Adagrad)", R"({"train_batch_size": 8, "optimizer": {"type": "Adagrad"}})"},
      {"scheduler.params (WarmupLR)", R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR"}})"},
      {"scheduler.params (WarmupCosineLR)",
       R"({"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 9}}})"},
      {"scheduler.params (OneCycle)",
       R"({"train_batch_size": 8, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0, "cycle_max_lr": 1}}})"},
      {"scheduler.params (LRRangeTest)", R"({"train_batch_size": 8, "scheduler": {"type": "LRRangeTest"}})"},
      {"", R"({"train_batch_size": 8, "zero_optimization": {"offload_param": {}, "offload_optimizer": {}}})"},
  };
  int compared = 0;
  for (const auto& [block_of_doc, text] : documents) {
    const ParseResult r = parse_config_text(text);
    REQUIRE(r.config);
    const nlohmann::json written = nlohmann::json::parse(to_json(*r.config));
    for (const KeySpec& k : known_keys()) {
      if (!block_of_doc.empty() && k.block != block_of_doc) continue;
      if (block_of_doc.empty() && k.block.find(" (") != std::string_view::npos) continue;
      // Defaults written as JSON (5e8, true, "none", 0.001); "inferred", "stage == 3" and the like are words.
      const nlohmann::json want = nlohmann::json::parse(k.default_value, nullptr, /*allow_exceptions=*/false);
      if (want.is_discarded() || want.is_null() || want.is_object()) continue;  // a block: its keys have rows
      std::string block(k.block.substr(0, k.block.find(" (")));
      for (std::size_t dot; (dot = block.find('.')) != std::string::npos;) block[dot] = '/';
      const auto at = nlohmann::json::json_pointer(block.empty() ? "" : "/" + block) / std::string(k.key);
      if (!written.contains(at)) continue;
      INFO(k.block << " / " << k.key << ": row " << k.default_value << ", written " << written[at].dump());
      if (want.is_number()) {
        CHECK(written[at].is_number());
        const double have = written[at].get<double>(), expected = want.get<double>();
        CHECK(have == Approx(expected).epsilon(1e-12));
      } else {
        CHECK(written[at] == want);
      }
      ++compared;
    }
  }
  CHECK(compared > 100);
}

TEST_CASE("zero3.model.type's row names the model type table's types, in order", "[config][schema]") {
  std::string names;
  for (const ModelTypeSpec& t : model_types()) names += (names.empty() ? "\"" : " | \"") + std::string(t.name) + "\"";
  const KeySpec* type = find_key("zero3.model", "type");
  REQUIRE(type != nullptr);
  CHECK(type_text(type->type) == names);
  CHECK(type->default_value == "\"" + std::string(model_types().front().name) + "\"");
  for (const ModelTypeSpec& t : model_types()) {
    CHECK(find_model_type(t.name) == &t);
    CHECK(to_string(t.type) == t.name);
  }
  CHECK(find_model_type("bert") == nullptr);
}

TEST_CASE("a row's default written as a value is of the row's type and in its range", "[config][schema]") {
  int checked = 0;
  for (const KeySpec& k : known_keys()) {
    const nlohmann::json d = nlohmann::json::parse(k.default_value, nullptr, /*allow_exceptions=*/false);
    if (d.is_discarded() || k.type.kind == ValueType::Kind::text) continue;
    INFO(k.block << " / " << k.key << ": default " << k.default_value << ", type " << type_text(k.type));
    if (d.is_null()) {
      CHECK(k.type.nullable);
      continue;
    }
    REQUIRE(d.is_number());
    const double v = d.get<double>();
    if (k.type.kind == ValueType::Kind::integer) {
      CHECK(row_int(k.block, k.key) == static_cast<std::int64_t>(v));
      CHECK(v == static_cast<double>(static_cast<std::int64_t>(v)));
    }
    CHECK(row_number(k.block, k.key) == v);
    if (k.type.has_min) CHECK((k.type.min_open ? v > k.type.min : v >= k.type.min));
    if (k.type.has_max) CHECK((k.type.max_open ? v < k.type.max : v <= k.type.max));
    ++checked;
  }
  CHECK(checked > 80);
}

TEST_CASE("the config structs take their defaults from the rows", "[config][schema]") {
  // Each struct default, read back against its row; a row changed to another value moves the struct with it.
  const Config c;
  CHECK(c.zero.reduce_bucket_size == row_int(blocks::zero, "reduce_bucket_size"));
  CHECK(c.zero.offload_param.buffer_count == row_int(blocks::offload_param, "buffer_count"));
  CHECK(c.zero.offload_optimizer.buffer_count == row_int(blocks::offload_optimizer, "buffer_count"));
  CHECK(c.zero.offload_param.buffer_count != c.zero.offload_optimizer.buffer_count);
  CHECK(c.zero.offload_param.device == OffloadDevice::none);
  CHECK(c.checkpoint.tag_validation == TagValidation::warn);
  CHECK(c.zero3.comm.backend == CommBackend::automatic);
  CHECK(c.zero3.spike.detector == SpikeDetector::zscore);
  CHECK(c.csv_monitor.job_name == row_string(blocks::csv_monitor, "job_name"));
  CHECK(OptimizerConfig{}.betas == row_number_pair(blocks::adam, "betas"));
  // And the parser leaves the same values for an empty document.
  const ParseResult r = parse_config_text(R"({"train_batch_size": 8})");
  REQUIRE(r.config);
  Config with_batch = c;
  with_batch.batch = r.config->batch;  // the batch rule's resolution, which a struct cannot know
  CHECK(to_json(*r.config) == to_json(with_batch));
}

TEST_CASE("a struct default read from a missing or mistyped row is a named defect", "[config][schema]") {
  CHECK_THROWS_WITH(row_int(blocks::zero, "no_such_key"),
                    Catch::Contains("no_such_key") && Catch::Contains("no such row"));
  CHECK_THROWS_WITH(row_bool(blocks::zero, "reduce_bucket_size"), Catch::Contains("not true or false"));
  CHECK_THROWS_WITH(row_int(blocks::top, "train_batch_size"), Catch::Contains("words"));
  CHECK_THROWS_WITH(row_string(blocks::offload_param, "buffer_count"), Catch::Contains("not a string"));
}
