// Keys DeepSpeed 0.19.8 removed are errors at their path whatever their value; tensor_parallel and
// weight_quantization are checked as DeepSpeed's strict models check them (unknown keys rejected) and
// reported as not implemented only when they switch their feature on.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "test_config_helpers.hpp"
#include "zero3/config/schema.hpp"

using namespace zero3::config;
using namespace zero3::config::testing;
using nlohmann::json;

namespace {

const char* const kRemovedTop[] = {"amp",
                                   "nebula",
                                   "compression_training",
                                   "quantize_training",
                                   "sparse_gradients",
                                   "eigenvalue",
                                   "sparse_attention",
                                   "elasticity",
                                   "graph_harvesting",
                                   "curriculum_learning",
                                   "progressive_layer_drop"};
const char* const kRemovedZero[] = {"mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"};

// A runnable stage-3 config, to which each case adds one thing.
json base() {
  return json::parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3}})");
}

// Values a removed key may carry: off, empty, null, a full block as older DeepSpeed docs wrote it.
json values_for(const std::string& key) {
  json full = {{"enabled", true}};
  if (key == "elasticity") full.update({{"max_train_batch_size", 2000}, {"micro_batch_sizes", {2, 4}}});
  if (key == "sparse_attention") full = {{"mode", "fixed"}, {"block", 16}};
  if (key == "mics_shard_size") full = 8;
  if (key == "sparse_gradients" || key == "graph_harvesting" || key == "mics_hierarchical_params_gather") full = true;
  return json::array({json::object(), false, nullptr, full, {{"enabled", false}}});
}

void check_removed(const json& doc, const std::string& path) {
  INFO(doc.dump());
  const ParseResult r = parse_config_text(doc.dump());
  INFO(dump(r));
  CHECK_FALSE(r.ok());
  CHECK(has(r.errors, path, "removed in DeepSpeed 0.19.8"));
  CHECK(has(r.errors, path, "delete the key"));
  // One error, at the key: nothing inside the value is looked at.
  CHECK(r.errors.size() == 1);
}

}  // namespace

TEST_CASE("removed top-level keys are errors whatever their value", "[config][removed]") {
  for (const std::string key : kRemovedTop) {
    for (const json& v : values_for(key)) {
      json doc = base();
      doc[key] = v;
      check_removed(doc, key);
    }
  }
}

TEST_CASE("removed zero_optimization keys are errors whatever their value", "[config][removed]") {
  for (const std::string key : kRemovedZero) {
    for (const json& v : values_for(key)) {
      json doc = base();
      doc["zero_optimization"][key] = v;
      check_removed(doc, "zero_optimization." + key);
    }
  }
}

TEST_CASE("removed keys: the message says what to use instead", "[config][removed]") {
  const struct {
    const char* key;
    const char* advice;
  } cases[] = {
      {"amp", "torch_autocast"},
      {"curriculum_learning", "data_efficiency.data_sampling.curriculum_learning"},
      {"elasticity", "gradient_accumulation_steps"},
  };
  for (const auto& c : cases) {
    json doc = base();
    doc[c.key] = json::object();
    const ParseResult r = parse_config_text(doc.dump());
    INFO(dump(r));
    CHECK(has(r.errors, c.key, c.advice));
  }
  SECTION("every removed key is reported, not just the first") {
    json doc = base();
    for (const std::string key : kRemovedTop) doc[key] = false;
    for (const std::string key : kRemovedZero) doc["zero_optimization"][key] = nullptr;
    const ParseResult r = parse_config_text(doc.dump());
    CHECK(r.errors.size() == std::size(kRemovedTop) + std::size(kRemovedZero));
  }
}

TEST_CASE("removed keys stay in the key table as rejected", "[config][removed][schema]") {
  for (const std::string key : kRemovedTop) {
    const KeySpec* k = find_key("", key);
    REQUIRE(k != nullptr);
    CHECK(k->support == Support::rejected);
    CHECK_THAT(std::string(k->note), Catch::Contains("removed in DeepSpeed 0.19.8"));
  }
  for (const std::string key : kRemovedZero) {
    const KeySpec* k = find_key("zero_optimization", key);
    REQUIRE(k != nullptr);
    CHECK(k->support == Support::rejected);
  }
  // Their sub-keys are gone: nothing inside a removed block is read any more.
  for (const KeySpec& k : known_keys()) {
    for (const std::string key : kRemovedTop) CHECK(k.block != key);
  }
}

TEST_CASE("tensor_parallel: DeepSpeed's strict TPTrainingConfig", "[config][tensor_parallel]") {
  auto with = [](const char* block) {
    json doc = base();
    doc["tensor_parallel"] = json::parse(block);
    return parse_config_text(doc.dump());
  };
  SECTION("known keys with their feature off are fine and runnable") {
    const ParseResult r = with(R"({"autotp_size": 1, "tp_overlap_comm": false, "vocab_parallel_lm_head": null,
        "vocab_parallel_ce_backend": "liger", "injection_policy_tuple": null, "partition_config": {"x": 1},
        "preset_model": "llama", "keep_module_on_host": true, "kernel_inject": false,
        "tp": {"tp_size": 1, "tp_grain_size": 64, "mpu": null, "tp_group": null}})");
    INFO(dump(r));
    REQUIRE(r.ok());
    CHECK(r.runnable());
    CHECK(r.warnings.empty());
  }
  SECTION("an unknown key is an error naming DeepSpeed's model") {
    const ParseResult r = with(R"({"autotp_sise": 2})");
    CHECK(has(r.errors, "tensor_parallel.autotp_sise", "did you mean 'autotp_size'?"));
    CHECK(has(r.errors, "tensor_parallel.autotp_sise", "TPTrainingConfig"));
  }
  SECTION("an unknown key in tp, under either spelling, names TPConfig") {
    for (const char* alias : {"tp", "tensor_parallel"}) {
      const ParseResult r = with((std::string(R"({")") + alias + R"(": {"size": 2}})").c_str());
      const std::string path = std::string("tensor_parallel.") + alias + ".size";
      INFO(dump(r));
      CHECK(has(r.errors, path, "TPConfig"));
    }
  }
  SECTION("tp and its alias together are an error at the field name, as in DeepSpeed") {
    CHECK(has(with(R"({"tp": {}, "tensor_parallel": {}})").errors, "tensor_parallel.tensor_parallel"));
    CHECK(has(with(R"({"kernel_inject": true, "replace_with_kernel_inject": false})").errors,
              "tensor_parallel.replace_with_kernel_inject"));
  }
  SECTION("types are checked") {
    CHECK(has(with(R"({"autotp_size": "two"})").errors, "tensor_parallel.autotp_size", "integer"));
    CHECK(has(with(R"({"vocab_parallel_ce_backend": "cuda"})").errors, "tensor_parallel.vocab_parallel_ce_backend"));
    CHECK(has(with(R"({"partition_config": []})").errors, "tensor_parallel.partition_config", "an object"));
    CHECK(has(with(R"({"injection_policy_tuple": "x"})").errors, "tensor_parallel.injection_policy_tuple"));
    CHECK(has(with(R"({"vocab_parallel_lm_head": 1})").errors, "tensor_parallel.vocab_parallel_lm_head"));
    CHECK(has(with(R"({"tp": null})").errors, "tensor_parallel.tp", "an object"));
  }
  SECTION("dtype: DeepSpeed wants a torch.dtype object, so any JSON value but \"auto\" is an error") {
    CHECK(has(with(R"({"dtype": "fp16"})").errors, "tensor_parallel.dtype", "torch.dtype"));
    CHECK(with(R"({"dtype": "auto"})").ok());
  }
  SECTION("autotp_size > 1 or tp.tp_size > 1: not implemented") {
    const ParseResult a = with(R"({"autotp_size": 2})");
    REQUIRE(a.ok());
    CHECK(has(a.not_implemented, "tensor_parallel.autotp_size"));
    const ParseResult b = with(R"({"tp": {"tp_size": 4}})");
    REQUIRE(b.ok());
    CHECK(has(b.not_implemented, "tensor_parallel.tp.tp_size"));
  }
  SECTION("null is an error (DeepSpeed unpacks it as keyword arguments)") {
    json doc = base();
    doc["tensor_parallel"] = nullptr;
    CHECK(has(parse_config_text(doc.dump()).errors, "tensor_parallel"));
  }
}

TEST_CASE("weight_quantization: DeepSpeed's strict WeightQuantConfig, on by presence",
          "[config][weight_quantization]") {
  auto with = [](const char* block) {
    json doc = base();
    doc["weight_quantization"] = json::parse(block);
    return parse_config_text(doc.dump());
  };
  SECTION("present with enabled false: fine and runnable") {
    const ParseResult r = with(R"({"enabled": false, "num_bits": 4, "q_type": "asymmetric", "q_groups": 2,
        "quantized_initialization": {}, "post_init_quant": {"x": 1}})");
    INFO(dump(r));
    REQUIRE(r.ok());
    CHECK(r.runnable());
  }
  SECTION("present, enabled by default or explicitly: not implemented") {
    const ParseResult empty = with("{}");
    REQUIRE(empty.ok());
    CHECK(has(empty.not_implemented, "weight_quantization"));
    const ParseResult on = with(R"({"enabled": true})");
    REQUIRE(on.ok());
    CHECK(has(on.not_implemented, "weight_quantization.enabled"));
  }
  SECTION("an unknown key is an error naming DeepSpeed's model") {
    const ParseResult r = with(R"({"enabled": false, "bits": 4})");
    CHECK(has(r.errors, "weight_quantization.bits", "WeightQuantConfig"));
  }
  SECTION("types are checked") {
    CHECK(has(with(R"({"enabled": false, "q_type": "sym"})").errors, "weight_quantization.q_type"));
    CHECK(has(with(R"({"enabled": false, "quantized_initialization": null})").errors,
              "weight_quantization.quantized_initialization"));
    CHECK(has(with(R"({"enabled": "maybe"})").errors, "weight_quantization.enabled"));  // "no" pydantic reads as false
  }
}

TEST_CASE("compile.autoep_non_moe and disable_python_gc are known", "[config][keys]") {
  json doc = base();
  doc["compile"] = {{"autoep_non_moe", true}};
  doc["disable_python_gc"] = true;
  const ParseResult r = parse_config_text(doc.dump());
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.runnable());
  CHECK(r.warnings.empty());
  doc["disable_python_gc"] = "yes";
  CHECK(has(parse_config_text(doc.dump()).errors, "disable_python_gc", "true or false"));
}
