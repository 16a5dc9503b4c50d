// The rules: DeepSpeed's batch rule and its inference rows, "auto" resolution, aliases and deprecated
// keys, not-implemented detection (only when a feature is switched on), stage < 3, and the key table
// itself (every known key is read by the parser, every block rejects unknown keys).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "test_config_helpers.hpp"
#include "zero3/config/schema.hpp"

using namespace zero3::config;
using zero3::config::testing::dump;
using zero3::config::testing::has;
using zero3::config::testing::parse;
using zero3::config::testing::resolution;

namespace {

constexpr const char* kStage3 = R"("optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3})";

std::string with_batch(const std::string& batch_keys) {
  return "{" + batch_keys + ", " + kStage3 + "}";
}

}  // namespace

TEST_CASE("batch rule: each inference row of DeepSpeed's table", "[config][batch]") {
  struct Row {
    const char* keys;
    std::int64_t tb, mb, gas;
    const char* inferred_path;  // a key that was inferred, or ""
    const char* how;
  };
  // World size 2 throughout; the expected values are the floor divisions of DeepSpeed's batch rule
  // (deepspeed/runtime/config.py, _set_batch_related_parameters).
  const Row rows[] = {
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2)", 16, 4, 2, "",
       ""},
      {R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 4)", 16, 4, 2, "gradient_accumulation_steps",
       "inferred as 16 // 4 // 2"},
      {R"("train_batch_size": 16, "gradient_accumulation_steps": 2)", 16, 4, 2, "train_micro_batch_size_per_gpu",
       "inferred as 16 // 2 // 2"},
      {R"("train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2)", 16, 4, 2, "train_batch_size",
       "inferred as 4 * 2 * 2"},
      {R"("train_batch_size": 16)", 16, 8, 1, "train_micro_batch_size_per_gpu", "inferred as 16 // 2"},
      {R"("train_micro_batch_size_per_gpu": 4)", 8, 4, 1, "train_batch_size", "inferred as 4 * 2"},
  };
  for (const Row& row : rows) {
    INFO(row.keys);
    const ParseResult r = parse(with_batch(row.keys), 2);
    INFO(dump(r));
    REQUIRE(r.ok());
    CHECK(r.config->batch.train_batch_size == row.tb);
    CHECK(r.config->batch.train_micro_batch_size_per_gpu == row.mb);
    CHECK(r.config->batch.gradient_accumulation_steps == row.gas);
    CHECK(r.config->batch.world_size == 2);
    if (*row.inferred_path) {
      const Resolution* res = resolution(r, row.inferred_path);
      REQUIRE(res != nullptr);
      CHECK_THAT(res->reason, Catch::Contains(row.how));
    } else {
      CHECK(r.resolved.empty());
    }
  }
  SECTION("neither train_batch_size nor micro batch") {
    for (const char* keys : {R"("gradient_accumulation_steps": 2)", R"("steps_per_print": 5)"}) {
      const ParseResult r = parse(with_batch(keys), 2);
      CHECK(has(r.errors, "train_batch_size", "neither train_batch_size nor train_micro_batch_size_per_gpu"));
    }
  }
}

TEST_CASE("batch rule: failures name every factor and the world size's origin", "[config][batch]") {
  SECTION("tb=32, mb=3, W=2 (floor division gives 30 != 32)") {
    const ParseResult r = parse(with_batch(R"("train_batch_size": 32, "train_micro_batch_size_per_gpu": 3)"), 2);
    REQUIRE(r.errors.size() == 1);
    CHECK(format_diagnostic("error", r.errors[0]) ==
          "error: train_batch_size: 32 != train_micro_batch_size_per_gpu (3) * gradient_accumulation_steps (5, "
          "inferred as 32 // 3 // 2) * world size (2, from --world-size)");
  }
  SECTION("all three given, world size from the launcher") {
    const ParseResult r = parse(
        with_batch(R"("train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1)"),
        2, "OMPI_COMM_WORLD_SIZE");
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].message ==
          "10 != train_micro_batch_size_per_gpu (4) * gradient_accumulation_steps (1) * world "
          "size (2, from OMPI_COMM_WORLD_SIZE)");
  }
  SECTION("default world size") {
    ParseOptions opts;  // no world size: 1, "default"
    const ParseResult r = parse_config_text(
        with_batch(R"("train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1)"),
        opts);
    REQUIRE(r.errors.size() == 1);
    CHECK_THAT(r.errors[0].message, Catch::EndsWith("world size (1, default)"));
  }
  SECTION("inferred micro batch of zero") {
    const ParseResult r = parse(with_batch(R"("train_batch_size": 3, "gradient_accumulation_steps": 2)"), 2);
    CHECK(has(r.errors, "train_micro_batch_size_per_gpu", "inferred as 3 // 2 // 2 = 0; must be > 0"));
  }
}

TEST_CASE("\"auto\" batch keys", "[config][batch][auto]") {
  SECTION("train_batch_size auto with micro batch and accumulation: mb * gas * W") {
    const ParseResult r = parse(
        with_batch(
            R"("train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2)"),
        3);
    REQUIRE(r.ok());
    CHECK(r.config->batch.train_batch_size == 24);
    CHECK_THAT(resolution(r, "train_batch_size")->reason, Catch::Contains("\"auto\""));
  }
  SECTION("micro batch auto is inferred from the others") {
    const ParseResult r = parse(
        with_batch(
            R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2)"),
        2);
    REQUIRE(r.ok());
    CHECK(r.config->batch.train_micro_batch_size_per_gpu == 4);
  }
  SECTION("accumulation auto is inferred from the others") {
    const ParseResult r = parse(
        with_batch(
            R"("train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto")"),
        2);
    REQUIRE(r.ok());
    CHECK(r.config->batch.gradient_accumulation_steps == 2);
  }
  SECTION("all three auto: HF Trainer's defaults, micro batch 8 and accumulation 1") {
    const ParseResult r = parse(
        with_batch(
            R"("train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto")"),
        3);
    REQUIRE(r.ok());
    CHECK(r.config->batch.train_batch_size == 24);  // 8 * 1 * 3 ranks
    CHECK(r.config->batch.train_micro_batch_size_per_gpu == 8);
    CHECK(r.config->batch.gradient_accumulation_steps == 1);
    CHECK(r.resolved.size() == 3);
  }
}

TEST_CASE("\"auto\" elsewhere", "[config][auto]") {
  SECTION("gradient_clipping auto is 1.0") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "gradient_clipping": "auto"})");
    REQUIRE(r.ok());
    CHECK(r.config->gradient_clipping == 1.0);
    CHECK(resolution(r, "gradient_clipping")->value == "1.0");
  }
  SECTION("stage auto is 3") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": "auto"}})");
    REQUIRE(r.ok());
    CHECK(r.config->zero.stage == 3);
  }
  SECTION("bucket sizes from zero3.model.hidden_size, 4096 gives a fractional 0.9*h*h") {
    const ParseResult r = parse(R"({"train_batch_size": 8,
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                              "stage3_param_persistence_threshold": "auto"},
        "zero3": {"model": {"layers": 1, "hidden_size": 4096, "heads": 32, "vocab_size": 100, "seq_len": 8}}})");
    REQUIRE(r.ok());
    CHECK(r.config->zero.reduce_bucket_size == 16'777'216);    // 4096^2
    CHECK(r.config->zero.prefetch_bucket_size == 15'099'494);  // int(15099494.4), DeepSpeed issue 6525's value
    CHECK(r.config->zero.param_persistence_threshold == 40'960);
  }
  SECTION("bucket sizes without a model: the DeepSpeed defaults") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3,
        "reduce_bucket_size": "auto", "prefetch_bucket_size": "auto", "param_persistence_threshold": "auto"}})");
    REQUIRE(r.ok());
    CHECK(r.config->zero.reduce_bucket_size == 500'000'000);
    CHECK(r.config->zero.prefetch_bucket_size == 50'000'000);
    CHECK(r.config->zero.param_persistence_threshold == 100'000);
    CHECK_THAT(resolution(r, "zero_optimization.prefetch_bucket_size")->reason, Catch::Contains("DeepSpeed default"));
  }
  SECTION("pydantic blocks: auto is the DeepSpeed default") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale_window": "auto"},
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "auto", "pin_memory": "auto"}}})");
    REQUIRE(r.ok());
    CHECK(r.config->fp16.loss_scale_window == 1000);
    CHECK(r.config->zero.offload_optimizer.device == OffloadDevice::none);
    CHECK(resolution(r, "zero_optimization.offload_optimizer.device")->value == "\"none\"");
    CHECK(resolution(r, "fp16.loss_scale_window")->value == "1000");
  }
  SECTION("scheduler warmup_max_lr auto is the optimizer lr") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adagrad"},
        "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 10, "warmup_max_lr": "auto"}}})");
    REQUIRE(r.ok());
    CHECK(r.config->scheduler->warmup_max_lr == 0.01);
  }
  SECTION("scheduler step counts from zero3.run.steps") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"},
        "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": "auto", "warmup_num_steps": "auto"}},
        "zero3": {"run": {"steps": 5}}})");
    REQUIRE(r.ok());
    CHECK(r.config->scheduler->total_num_steps == 5);
    CHECK(r.config->scheduler->warmup_num_steps == 1);  // 5 / 10 rounds to 0, at least 1
  }
  SECTION("upper-case AUTO is not auto") {
    const ParseResult r =
        parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_size": "AUTO"}})");
    CHECK(has(r.errors, "zero_optimization.reduce_bucket_size", "expected an integer"));
  }
}

TEST_CASE("aliases of the stage3_* keys map to the same field", "[config][aliases]") {
  struct Alias {
    const char* key;
    std::int64_t ZeroConfig::*field;
  };
  const Alias aliases[] = {
      {"prefetch_bucket_size", &ZeroConfig::prefetch_bucket_size},
      {"stage3_prefetch_bucket_size", &ZeroConfig::prefetch_bucket_size},
      {"param_persistence_threshold", &ZeroConfig::param_persistence_threshold},
      {"stage3_param_persistence_threshold", &ZeroConfig::param_persistence_threshold},
      {"model_persistence_threshold", &ZeroConfig::model_persistence_threshold},
      {"stage3_model_persistence_threshold", &ZeroConfig::model_persistence_threshold},
      {"max_live_parameters", &ZeroConfig::max_live_parameters},
      {"stage3_max_live_parameters", &ZeroConfig::max_live_parameters},
      {"max_reuse_distance", &ZeroConfig::max_reuse_distance},
      {"stage3_max_reuse_distance", &ZeroConfig::max_reuse_distance},
  };
  for (const Alias& a : aliases) {
    INFO(a.key);
    const ParseResult r =
        parse(std::string(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, ")") + a.key + R"(": 12345}})");
    REQUIRE(r.ok());
    CHECK(r.config->zero.*a.field == 12345);
  }
  const ParseResult r =
      parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "allgather_sequential": true}})");
  REQUIRE(r.ok());
  CHECK(r.config->zero.allgather_sequential);
  CHECK(has(r.not_implemented, "zero_optimization.allgather_sequential"));
}

TEST_CASE("deprecated keys are mapped with a warning", "[config][deprecated]") {
  SECTION("cpu_offload") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "cpu_offload": true}})");
    REQUIRE(r.ok());
    CHECK(r.config->zero.offload_optimizer.device == OffloadDevice::cpu);
    CHECK(has(r.warnings, "zero_optimization.cpu_offload", "deprecated"));
  }
  SECTION("cpu_offload_param") {
    const ParseResult r =
        parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "cpu_offload_param": true}})");
    REQUIRE(r.ok());
    CHECK(r.config->zero.offload_param.device == OffloadDevice::cpu);
    CHECK(has(r.warnings, "zero_optimization.cpu_offload_param", "deprecated"));
  }
  SECTION("cpu_offload_use_pin_memory only warns") {
    const ParseResult r =
        parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "cpu_offload_use_pin_memory": true}})");
    REQUIRE(r.ok());
    CHECK(has(r.warnings, "zero_optimization.cpu_offload_use_pin_memory", "no effect"));
  }
  SECTION("stage3_gather_fp16_weights_on_model_save") {
    const ParseResult r = parse(
        R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})");
    REQUIRE(r.ok());
    CHECK(r.config->zero.gather_16bit_weights_on_model_save);
    CHECK(has(r.warnings, "zero_optimization.stage3_gather_fp16_weights_on_model_save", "deprecated"));
  }
  SECTION("bfloat16 block") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "bfloat16": {"enabled": true}})");
    REQUIRE(r.ok());
    CHECK(r.config->bf16.enabled);
    CHECK(has(r.warnings, "bfloat16"));
  }
  SECTION("aio.thread_count becomes intra_op_parallelism") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "aio": {"thread_count": 4}})");
    REQUIRE(r.ok());
    CHECK(r.config->aio.intra_op_parallelism == 4);
    CHECK(has(r.warnings, "aio.thread_count", "intra_op_parallelism"));
  }
  SECTION("zero_optimization as a boolean") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": true})");
    REQUIRE(r.ok());
    CHECK(r.config->zero.stage == 1);
    CHECK(has(r.warnings, "zero_optimization", "deprecated"));
    CHECK(has(r.not_implemented, "zero_optimization.stage"));
  }
}

TEST_CASE("not implemented: reported only when a feature is switched on", "[config][not_implemented]") {
  const std::string head = R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"}, )";
  struct On {
    const char* fragment;
    const char* path;
  };
  const On on[] = {
      // NVMe offload of params with the optimizer on the device
      {R"("zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}})",
       "zero_optimization.offload_param.device"},
      {R"("zero_optimization": {"stage": 3, "zero_quantized_weights": true})",
       "zero_optimization.zero_quantized_weights"},
      {R"("zero_optimization": {"stage": 3, "zero_quantized_gradients": true})",
       "zero_optimization.zero_quantized_gradients"},
      {R"("zero_optimization": {"stage": 3, "zero_hpz_partition_size": 8})",
       "zero_optimization.zero_hpz_partition_size"},
      {R"("zero_optimization": {"stage": 3, "zenflow": {"topk_ratio": 0.1}})", "zero_optimization.zenflow"},
      {R"("zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "super_offload": true}})",
       "zero_optimization.offload_optimizer.super_offload"},
      {R"("zero_optimization": {"stage": 3}, "wandb": {"enabled": true})", "wandb.enabled"},
      {R"("zero_optimization": {"stage": 3}, "comet": {"enabled": true})", "comet.enabled"},
      {R"("zero_optimization": {"stage": 3}, "comms_logger": {"enabled": true})", "comms_logger.enabled"},
      {R"("zero_optimization": {"stage": 3}, "flops_profiler": {"enabled": true})", "flops_profiler.enabled"},
      {R"("zero_optimization": {"stage": 3}, "activation_checkpointing": {"partition_activations": true})",
       "activation_checkpointing.partition_activations"},
      {R"("zero_optimization": {"stage": 3}, "pipeline": {"stages": 2})", "pipeline.stages"},
      {R"("zero_optimization": {"stage": 3}, "compile": {"deepcompile": true})", "compile.deepcompile"},
      {R"("zero_optimization": {"stage": 3}, "tensor_parallel": {"autotp_size": 2})", "tensor_parallel.autotp_size"},
      {R"("zero_optimization": {"stage": 3}, "weight_quantization": {"num_bits": 4})", "weight_quantization"},
      {R"("zero_optimization": {"stage": 3}, "data_efficiency": {"enabled": true, "seed": 1})",
       "data_efficiency.enabled"},
      {R"("zero_optimization": {"stage": 3}, "torch_autocast": {"enabled": true})", "torch_autocast.enabled"},
      {R"("zero_optimization": {"stage": 3}, "checkpoint": {"load_universal": true})", "checkpoint.load_universal"},
      {R"("zero_optimization": {"stage": 3}, "sequence_parallel_size": 2)", "sequence_parallel_size"},
      {R"("zero_optimization": {"stage": 3}, "aio": {"use_gds": true})", "aio.use_gds"},
      {R"("zero_optimization": {"stage": 1})", "zero_optimization.stage"},
  };
  for (const On& o : on) {
    INFO(o.fragment);
    const ParseResult r = parse(head + o.fragment + "}");
    INFO(dump(r));
    REQUIRE(r.ok());
    CHECK_FALSE(r.runnable());
    CHECK(has(r.not_implemented, o.path));
  }
  SECTION("the same blocks with their features off are runnable") {
    const ParseResult r = parse(head + R"(
      "zero_optimization": {"stage": 3, "offload_param": {"device": "none"}, "zero_quantized_weights": false,
                            "zero_hpz_partition_size": 1, "zenflow": null,
                            "offload_optimizer": {"device": "cpu", "super_offload": false}},
      "tensorboard": {"enabled": false, "output_path": "tb"}, "wandb": {"enabled": false, "project": "p"},
      "comet": {"enabled": false}, "flops_profiler": {"enabled": false},
      "activation_checkpointing": {"partition_activations": false, "cpu_checkpointing": false},
      "tensor_parallel": {"autotp_size": 0, "tp": {"tp_size": 1}}, "weight_quantization": {"enabled": false},
      "pipeline": {"stages": "auto"}, "compile": {"deepcompile": false},
      "data_efficiency": {"enabled": false}, "torch_autocast": {"enabled": false},
      "checkpoint": {"load_universal": false}, "aio": {"use_gds": false}, "sequence_parallel_size": 1})");
    INFO(dump(r));
    REQUIRE(r.ok());
    CHECK(r.runnable());
  }
  SECTION("no optimizer block") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3}})");
    REQUIRE(r.ok());
    CHECK(has(r.not_implemented, "optimizer"));
  }
  SECTION("comms_logger present but disabled: a warning about DeepSpeed's quirk") {
    const ParseResult r = parse(head + R"("zero_optimization": {"stage": 3}, "comms_logger": {"enabled": false}})");
    REQUIRE(r.ok());
    CHECK(r.runnable());
    CHECK(has(r.warnings, "comms_logger"));
  }
  SECTION("an optimizer DeepSpeed knows but zero3 lacks; its params are not checked") {
    const ParseResult r = parse(R"({"train_batch_size": 8, "zero_allow_untested_optimizer": true,
        "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}, "zero_optimization": {"stage": 3}})");
    REQUIRE(r.ok());
    CHECK(has(r.not_implemented, "optimizer.type", "SGD"));
  }
  SECTION("a torch scheduler") {
    const ParseResult r = parse(
        head + R"("zero_optimization": {"stage": 3}, "scheduler": {"type": "StepLR", "params": {"step_size": 10}}})");
    REQUIRE(r.ok());
    CHECK(has(r.not_implemented, "scheduler.type", "StepLR"));
  }
}

TEST_CASE("stage below 3 is valid but not runnable", "[config][stage]") {
  for (const char* zero : {R"("zero_optimization": {"stage": 0})", R"("zero_optimization": {"stage": 1})",
                           R"("zero_optimization": {"stage": 2})", R"("zero_optimization": {})"}) {
    INFO(zero);
    const ParseResult r =
        parse(std::string(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"}, )") + zero + "}");
    REQUIRE(r.ok());
    CHECK_FALSE(r.runnable());
    REQUIRE(r.not_implemented.size() == 1);
    CHECK(r.not_implemented[0].path == "zero_optimization.stage");
    CHECK_THAT(r.not_implemented[0].message, Catch::Contains("stage 3 only"));
  }
  const ParseResult absent = parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"}})");
  REQUIRE(absent.ok());
  CHECK(has(absent.not_implemented, "zero_optimization.stage", "no zero_optimization block"));
  const ParseResult stage2 = parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 2}})");
  CHECK_FALSE(stage2.config->zero.overlap_comm);  // null resolves to stage == 3
}

TEST_CASE("integral floats are integers; fractional ones are not", "[config][types]") {
  const ParseResult r = parse(R"({"train_batch_size": 8.0, "zero_optimization": {"stage": 3.0,
      "reduce_bucket_size": 5e8, "sub_group_size": 1e12, "stage3_max_live_parameters": 1.5e9}})");
  REQUIRE(r.ok());
  CHECK(r.config->batch.train_batch_size == 8);
  CHECK(r.config->zero.stage == 3);
  CHECK(r.config->zero.reduce_bucket_size == 500'000'000);
  CHECK(r.config->zero.sub_group_size == 1'000'000'000'000);
  CHECK(r.config->zero.max_live_parameters == 1'500'000'000);
  const ParseResult bad =
      parse(R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_size": 5.00001e3}})");
  CHECK(has(bad.errors, "zero_optimization.reduce_bucket_size", "fractional"));
}

// ---- the key table against the parser

namespace {

using nlohmann::json;

// Where a schema block lives in a document, and what it needs around it.
json document_with(std::string_view block, const std::string& key, const json& value) {
  json doc = json::object();
  json* slot = &doc;
  std::string b(block);
  const auto paren = b.find(" (");
  if (paren != std::string::npos) {  // "optimizer.params (Adam/AdamW)": the type picks the params block
    std::string type = b.substr(paren + 2, b.size() - paren - 3);
    type = type.substr(0, type.find('/'));
    const std::string head = b.substr(0, b.find('.'));
    doc[head] = {{"type", type}, {"params", json::object()}};
    slot = &doc[head]["params"];
  } else if (!b.empty()) {
    std::size_t start = 0;
    while (true) {
      const auto dot = b.find('.', start);
      slot = &(*slot)[b.substr(start, dot - start)];
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    *slot = json::object();
  }
  (*slot)[key] = value;
  return doc;
}

std::string json_path_of(std::string_view block) {
  std::string b(block);
  const auto paren = b.find(" (");
  return paren == std::string::npos ? b : b.substr(0, paren);
}

}  // namespace

TEST_CASE("the key table has no duplicates", "[config][schema]") {
  std::set<std::pair<std::string, std::string>> seen;
  for (const KeySpec& k : known_keys()) {
    INFO(k.block << " / " << k.key);
    CHECK(!k.key.empty());
    CHECK(seen.emplace(std::string(k.block), std::string(k.key)).second);
    CHECK(find_key(k.block, k.key) == &k);
  }
  CHECK(seen.size() > 300);
}

TEST_CASE("every known key is read by the parser, whatever its value", "[config][schema]") {
  const json values[] = {true, false, 0, 1, -1, 2.5, "x", "auto", nullptr, json::array(), json::object(), {1, 2}};
  for (const KeySpec& k : known_keys()) {
    for (const json& v : values) {
      const json doc = document_with(k.block, std::string(k.key), v);
      const ParseResult r = parse_config_text(doc.dump());
      for (const auto& e : r.errors) {
        INFO(doc.dump());
        CHECK_THAT(e.message, !Catch::Contains("internal error"));
      }
    }
  }
}

TEST_CASE("the parser refuses a value just outside a row's range, in the row's words", "[config][schema]") {
  int checked = 0;
  for (const KeySpec& k : known_keys()) {
    const ValueType& t = k.type;
    if (!t.has_range()) continue;
    // The nearest value on the wrong side of a bound: the bound itself where it is excluded.
    json outside;
    if (t.kind == ValueType::Kind::integer) {
      outside = t.has_min ? static_cast<std::int64_t>(t.min) - 1 : static_cast<std::int64_t>(t.max) + 1;
    } else if (t.has_min) {
      outside = t.min_open ? t.min : t.min - 0.5;
    } else {
      outside = t.max_open ? t.max : t.max + 0.5;
    }
    json doc = document_with(k.block, std::string(k.key), outside);
    if (k.block == "zero3.model") doc["zero3"]["model"]["type"] = "llama";  // the type that reads every key
    const ParseResult r = parse_config_text(doc.dump());
    INFO(doc.dump());
    // zenflow's keys are DeepSpeed's and listed with their types, but zero3 does not look inside the block.
    if (k.block == "zero_optimization.zenflow") continue;
    const std::string path =
        json_path_of(k.block).empty() ? std::string(k.key) : json_path_of(k.block) + "." + std::string(k.key);
    CHECK(has(r.errors, path, "must be " + range_text(t)));
    ++checked;
  }
  CHECK(checked > 80);
}

TEST_CASE("every block treats keys it does not know as DeepSpeed does", "[config][schema]") {
  std::set<std::string> blocks;
  for (const KeySpec& k : known_keys()) blocks.insert(std::string(k.block));
  ParseOptions strict;
  strict.strict = true;
  for (const auto& block : blocks) {
    INFO("block: " << block);
    const BlockRule* rule = find_block_rule(block);
    REQUIRE(rule != nullptr);  // every block of the key table has a validation rule
    const json doc = document_with(block, "zz_not_a_key", 1);
    const ParseResult r = parse_config_text(doc.dump());
    const ParseResult linted = parse_config_text(doc.dump(), strict);
    const std::string parent = json_path_of(block);
    const std::string path = parent.empty() ? "zz_not_a_key" : parent + ".zz_not_a_key";
    if (rule->validation == Validation::plain_dict) {
      CHECK(has(r.warnings, path, "ignored, as DeepSpeed ignores unknown keys"));
      CHECK_FALSE(has(r.errors, path));
    } else {
      CHECK(has(r.errors, path, "unknown key"));
    }
    CHECK(has(linted.errors, path, "unknown key"));
  }
}
