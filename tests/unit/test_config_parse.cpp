// Valid configs parse to the typed values DeepSpeed would use. Every expected value below is worked out by
// hand from the config text, DeepSpeed's defaults and batch rule (https://www.deepspeed.ai/docs/config-json/,
// deepspeed/runtime/config.py) and the HF formulas of docs/config.md, not copied from output.
#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <limits>

#include "test_config_helpers.hpp"

using namespace zero3::config;
using zero3::DType;
using zero3::config::testing::dump;
using zero3::config::testing::has;
using zero3::config::testing::parse;
using zero3::config::testing::resolution;

namespace {

ParseResult parse_fixture(const std::string& relative, int world_size) {
  ParseOptions opts;
  opts.world_size = world_size;
  opts.world_size_source = "--world-size";
  return parse_config_file(std::string(ZERO3_CONFIG_FIXTURES) + "/" + relative, opts);
}

}  // namespace

TEST_CASE("DeepSpeedExamples-style config with explicit values", "[config][valid]") {
  const ParseResult r = parse_fixture("exit0/deepspeedexamples_explicit.json", 2);
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.runnable());
  const Config& c = *r.config;
  // Only train_batch_size given: gas = 1, micro batch = 16 // 2.
  CHECK(c.batch.train_batch_size == 16);
  CHECK(c.batch.train_micro_batch_size_per_gpu == 8);
  CHECK(c.batch.gradient_accumulation_steps == 1);
  CHECK(c.batch.world_size == 2);
  CHECK(c.steps_per_print == 2000);
  CHECK(c.gradient_clipping == 1.0);
  CHECK_FALSE(c.prescale_gradients);
  REQUIRE(c.optimizer);
  CHECK(c.optimizer->type == OptimizerType::adam);
  CHECK(c.optimizer->lr == 0.001);
  CHECK(c.optimizer->betas[0] == 0.8);
  CHECK(c.optimizer->betas[1] == 0.999);
  CHECK(c.optimizer->eps == 1e-8);
  CHECK(c.optimizer->weight_decay == 3e-7);
  CHECK(c.optimizer->decoupled_weight_decay);  // Adam with adam_w_mode absent is AdamW (DeepSpeed)
  REQUIRE(c.scheduler);
  CHECK(c.scheduler->type == SchedulerType::warmup_lr);
  CHECK(c.scheduler->warmup_min_lr == 0.0);
  CHECK(c.scheduler->warmup_max_lr == 0.001);
  CHECK(c.scheduler->warmup_num_steps == 1000);
  CHECK(c.scheduler->warmup_type == WarmupType::log);
  CHECK(c.fp16.enabled);
  CHECK(c.fp16.dynamic_loss_scale());
  CHECK(c.fp16.loss_scale_window == 500);
  CHECK(c.fp16.hysteresis == 2);
  CHECK(c.fp16.min_loss_scale == 1);
  CHECK(c.fp16.initial_scale_power == 15);
  CHECK(c.model_dtype() == DType::f16);
  CHECK(c.communication_data_type == DType::f16);
  CHECK(c.zero.stage == 3);
  CHECK(c.zero.allgather_bucket_size == 50'000'000);
  CHECK(c.zero.reduce_bucket_size == 50'000'000);
  CHECK(c.zero.overlap_comm);
  CHECK(c.zero.reduce_scatter);
  CHECK(c.zero.prefetch_bucket_size == 50'000'000);  // code default 5e7, not the docs' 5e8
  CHECK(c.zero.param_persistence_threshold == 100'000);
  CHECK_FALSE(c.zero.offload_optimizer.enabled());
  CHECK(has(r.warnings, "zero_optimization.cpu_offload", "deprecated"));
}

TEST_CASE("DeepSpeed docs-style config with 5e8-style floats", "[config][valid]") {
  const ParseResult r = parse_fixture("exit0/ds_docs_floats.json", 2);
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.runnable());
  const Config& c = *r.config;
  CHECK(c.batch.train_micro_batch_size_per_gpu == 2);
  CHECK(c.batch.gradient_accumulation_steps == 4);
  CHECK(c.batch.train_batch_size == 16);  // 2 * 4 * 2
  CHECK(c.zero.max_live_parameters == 1'000'000'000);
  CHECK(c.zero.max_reuse_distance == 1'000'000'000);
  CHECK(c.zero.prefetch_bucket_size == 10'000'000);
  CHECK(c.zero.param_persistence_threshold == 100'000);
  CHECK(c.zero.reduce_bucket_size == 10'000'000);
  CHECK(c.zero.sub_group_size == 1'000'000'000'000);
  CHECK(c.zero.offload_optimizer.device == OffloadDevice::cpu);
  CHECK(c.zero.offload_param.device == OffloadDevice::cpu);
  CHECK(c.zero.offload_param.pin_memory);
  CHECK(c.optimizer->type == OptimizerType::adamw);
  CHECK(c.optimizer->lr == 1e-4);
  CHECK(c.optimizer->weight_decay == 0.01);
  CHECK(c.optimizer->betas == std::array<double, 2>{0.9, 0.999});
  CHECK(c.bf16.enabled);
  CHECK(c.communication_data_type == DType::bf16);
  CHECK(c.aio.block_size == 1'048'576);
  CHECK(c.aio.queue_depth == 8);
  CHECK_FALSE(c.tensorboard.enabled);
  CHECK(c.tensorboard.output_path == "log/");
  CHECK(c.tensorboard.job_name == "docs");
  CHECK(c.flops_profiler.module_depth == -1);
  CHECK(r.not_implemented.empty());
}

TEST_CASE("HF Trainer-style config full of \"auto\"", "[config][valid][auto]") {
  const ParseResult r = parse_fixture("exit0/hf_trainer_zero3_auto.json", 4);
  INFO(dump(r));
  REQUIRE(r.ok());
  const Config& c = *r.config;
  // "auto" takes what the HF Trainer fills in from transformers' TrainingArguments defaults:
  // per_device_train_batch_size 8, gradient_accumulation_steps 1, learning_rate 5e-5, adam betas (0.9, 0.999),
  // adam_epsilon 1e-8, weight_decay 0, max_grad_norm 1.0, warmup_steps 0; train batch = 8 * 1 * 4 ranks.
  CHECK(c.batch.train_micro_batch_size_per_gpu == 8);
  CHECK(c.batch.gradient_accumulation_steps == 1);
  CHECK(c.batch.train_batch_size == 32);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.optimizer->type == OptimizerType::adamw);
  CHECK(c.optimizer->lr == 5e-5);
  CHECK(c.optimizer->betas == std::array<double, 2>{0.9, 0.999});
  CHECK(c.optimizer->eps == 1e-8);
  CHECK(c.optimizer->weight_decay == 0.0);
  CHECK(c.scheduler->type == SchedulerType::warmup_decay_lr);
  CHECK(c.scheduler->total_num_steps == 1000);  // zero3.run.steps
  CHECK_FALSE(c.scheduler->total_num_steps_from_run);
  CHECK(c.scheduler->warmup_num_steps == 1);  // HF's 0 (no warmup), raised to DeepSpeed's least
  CHECK(c.scheduler->warmup_min_lr == 0.0);
  CHECK(c.scheduler->warmup_max_lr == 5e-5);  // the optimizer lr
  CHECK_FALSE(c.fp16.enabled);
  CHECK_FALSE(c.bf16.enabled);
  CHECK(c.communication_data_type == DType::f32);
  // HF formulas with hidden_size 768: 768^2 = 589824; int(0.9 * 589824) = int(530841.6); 10 * 768.
  CHECK(c.zero.reduce_bucket_size == 589'824);
  CHECK(c.zero.prefetch_bucket_size == 530'841);
  CHECK(c.zero.param_persistence_threshold == 7'680);
  CHECK(c.zero.offload_optimizer.device == OffloadDevice::cpu);
  CHECK(c.zero.offload_param.device == OffloadDevice::cpu);
  CHECK(c.zero.gather_16bit_weights_on_model_save);
  // Every "auto" is recorded.
  for (const char* path :
       {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
        "optimizer.params.lr", "optimizer.params.betas", "optimizer.params.eps", "optimizer.params.weight_decay",
        "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr", "scheduler.params.warmup_num_steps",
        "scheduler.params.total_num_steps", "fp16.enabled", "bf16.enabled", "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold"}) {
    INFO(path);
    CHECK(resolution(r, path) != nullptr);
  }
  CHECK(resolution(r, "zero_optimization.reduce_bucket_size")->value == "589824");
  // Everything it asks for runs (the 16-bit weights gathered at save are zero3 train's model.safetensors).
  CHECK(r.not_implemented.empty());
}

TEST_CASE("comments, pydantic field names and the bfloat16 block", "[config][valid]") {
  const ParseResult r = parse_fixture("exit0/comments_and_aliases.json", 1);
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.runnable());
  const Config& c = *r.config;
  CHECK(c.optimizer->type == OptimizerType::lion);
  CHECK(c.optimizer->betas == std::array<double, 2>{0.9, 0.99});
  CHECK(c.zero.prefetch_bucket_size == 2'000'000);
  CHECK(c.zero.param_persistence_threshold == 1'000);
  CHECK(c.zero.max_live_parameters == 30'000'000);
  CHECK(c.zero.max_reuse_distance == 40'000'000);
  CHECK(c.zero.model_persistence_threshold == 50'000'000);
  CHECK(c.bf16.enabled);
  CHECK(has(r.warnings, "bfloat16", "deprecated"));
  CHECK(c.csv_monitor.enabled);
  CHECK(c.csv_monitor.output_path == "csv/");
  CHECK(c.checkpoint.tag_validation == TagValidation::fail);  // "fail" matched case-insensitively
}

TEST_CASE("defaults of a minimal stage-3 config follow DeepSpeed 0.19.6", "[config][valid]") {
  const ParseResult r =
      parse(R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3}})");
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.runnable());
  CHECK(r.warnings.empty());
  const Config& c = *r.config;
  CHECK(c.batch.train_micro_batch_size_per_gpu == 8);
  CHECK(c.batch.gradient_accumulation_steps == 1);
  CHECK(c.gradient_clipping == 1.0);
  CHECK_FALSE(c.steps_per_print.has_value());
  CHECK_FALSE(c.wall_clock_breakdown);
  CHECK(c.gradient_predivide_factor == 1.0);
  CHECK(c.communication_data_type == DType::f32);
  CHECK(c.optimizer->lr == 1e-3);
  CHECK(c.optimizer->eps == 1e-8);
  CHECK(c.optimizer->bias_correction);
  CHECK(c.optimizer->fp32_optimizer_states);
  CHECK_FALSE(c.scheduler.has_value());
  CHECK_FALSE(c.fp16.enabled);
  CHECK(c.fp16.loss_scale == 0.0);
  CHECK(c.fp16.initial_scale_power == 16);
  CHECK(c.fp16.loss_scale_window == 1000);
  CHECK(c.fp16.hysteresis == 2);
  CHECK(c.fp16.min_loss_scale == 1);
  CHECK(c.bf16.check_grad_overflow);
  CHECK_FALSE(c.bf16.immediate_grad_update);
  const ZeroConfig& z = c.zero;
  CHECK(z.overlap_comm);  // null resolves to stage == 3
  CHECK(z.contiguous_gradients);
  CHECK(z.reduce_scatter);
  CHECK(z.reduce_bucket_size == 500'000'000);
  CHECK(z.sub_group_size == 1'000'000'000);
  CHECK(z.prefetch_bucket_size == 50'000'000);
  CHECK(z.param_persistence_threshold == 100'000);
  CHECK(z.model_persistence_threshold == std::numeric_limits<std::int64_t>::max());
  CHECK(z.max_live_parameters == 1'000'000'000);
  CHECK(z.max_reuse_distance == 1'000'000'000);
  CHECK(z.offload_param.device == OffloadDevice::none);
  CHECK(z.offload_param.pin_memory);
  CHECK(z.offload_param.buffer_count == 5);
  CHECK(z.offload_param.buffer_size == 100'000'000);
  CHECK(z.offload_param.max_in_cpu == 1'000'000'000);
  CHECK(z.offload_optimizer.buffer_count == 4);
  CHECK(z.offload_optimizer.ratio == 1.0);
  CHECK(z.zero_hpz_partition_size == 1);
  CHECK(c.aio.block_size == 1'048'576);
  CHECK(c.aio.intra_op_parallelism == 1);
  CHECK(c.checkpoint.tag_validation == TagValidation::warn);
  CHECK(c.flops_profiler.top_modules == 1);
  CHECK(c.zero3.seed == 42);
  CHECK(c.zero3.device == DeviceChoice::automatic);
  CHECK(c.zero3.comm.backend == CommBackend::automatic);
  CHECK(c.zero3.data.source == "synthetic:markov");
  CHECK_FALSE(c.zero3.model.has_value());
  CHECK_FALSE(c.zero3.run.has_value());
  CHECK_FALSE(c.zero3.pinned_memory_budget_gb.has_value());
}

TEST_CASE("optimizer types and their defaults", "[config][valid]") {
  SECTION("Adam with adam_w_mode false is classic Adam (L2)") {
    auto r = parse(R"({"train_batch_size": 8, "optimizer": {"type": "adam", "params": {"adam_w_mode": false}}})");
    REQUIRE(r.ok());
    CHECK(r.config->optimizer->type == OptimizerType::adam);
    CHECK_FALSE(r.config->optimizer->decoupled_weight_decay);
  }
  SECTION("AdamW ignores adam_w_mode false, with a warning") {
    auto r = parse(R"({"train_batch_size": 8, "optimizer": {"type": "ADAMW", "params": {"adam_w_mode": false}}})");
    REQUIRE(r.ok());
    CHECK(r.config->optimizer->type == OptimizerType::adamw);
    CHECK(r.config->optimizer->decoupled_weight_decay);
    CHECK(has(r.warnings, "optimizer.params.adam_w_mode"));
  }
  SECTION("Adagrad defaults: lr 1e-2, eps 1e-10") {
    auto r = parse(R"({"train_batch_size": 8, "optimizer": {"type": "Adagrad"}})");
    REQUIRE(r.ok());
    CHECK(r.config->optimizer->type == OptimizerType::adagrad);
    CHECK(r.config->optimizer->lr == 1e-2);
    CHECK(r.config->optimizer->eps == 1e-10);
  }
  SECTION("Lion defaults") {
    auto r = parse(R"({"train_batch_size": 8, "optimizer": {"type": "Lion", "params": {"weight_decay": 0.1}}})");
    REQUIRE(r.ok());
    CHECK(r.config->optimizer->lr == 1e-3);
    CHECK(r.config->optimizer->betas == std::array<double, 2>{0.9, 0.999});
    CHECK(r.config->optimizer->weight_decay == 0.1);
  }
}

TEST_CASE("16-bit optimizer storage: master and state dtypes, and the fp32 accumulators said", "[config][valid]") {
  const std::string z3 = R"("train_batch_size": 8, "zero_optimization": {"stage": 3}, )";
  SECTION("bf16 master weights and states; fp32_optimizer_states follows") {
    auto r = parse("{" + z3 + R"("optimizer": {"type": "AdamW"},
                   "bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true}})");
    INFO(dump(r));
    REQUIRE(r.runnable());
    CHECK(r.config->master_dtype() == zero3::DType::bf16);
    CHECK(r.config->optimizer_state_dtype() == zero3::DType::bf16);
    CHECK_FALSE(r.config->optimizer->fp32_optimizer_states);  // DeepSpeed builds its CPU Adam so
    // DeepSpeed's key says "and grads": the accumulators stay fp32, and the parse says so in one line.
    CHECK(has(r.warnings, "bf16.bf16_master_weights_and_grads", "gradients are still accumulated in fp32"));
    CHECK(r.warnings.size() == 1);
  }
  SECTION("bf16 master weights, fp32 states (on the device as well as offloaded)") {
    auto r = parse("{" + z3 + R"("optimizer": {"type": "Lion"}, "bf16": {"enabled": true,
                   "bf16_master_weights_and_grads": true}})");
    INFO(dump(r));
    REQUIRE(r.runnable());
    CHECK(r.config->master_dtype() == zero3::DType::bf16);
    CHECK(r.config->optimizer_state_dtype() == zero3::DType::f32);
    CHECK(r.config->optimizer->fp32_optimizer_states);
    CHECK(has(r.warnings, "bf16.bf16_master_weights_and_grads", "master weights stored in bf16"));
  }
  SECTION("fp16 master weights") {
    auto r = parse("{" + z3 + R"("optimizer": {"type": "AdamW"}, "fp16": {"enabled": true,
                   "fp16_master_weights_and_grads": true}})");
    INFO(dump(r));
    REQUIRE(r.runnable());
    CHECK(r.config->master_dtype() == zero3::DType::f16);
    CHECK(r.config->optimizer_state_dtype() == zero3::DType::f32);
    CHECK(has(r.warnings, "fp16.fp16_master_weights_and_grads", "gradients are still accumulated in fp32"));
  }
  SECTION("fp32 storage by default, and fp32_optimizer_states false alone is not implemented") {
    auto r = parse("{" + z3 + R"("optimizer": {"type": "AdamW"}, "bf16": {"enabled": true}})");
    REQUIRE(r.runnable());
    CHECK(r.config->master_dtype() == zero3::DType::f32);
    CHECK(r.config->optimizer_state_dtype() == zero3::DType::f32);
    CHECK(r.warnings.empty());
    auto alone = parse("{" + z3 + R"("optimizer": {"type": "AdamW", "params": {"fp32_optimizer_states": false}},
                       "bf16": {"enabled": true}})");
    CHECK(has(alone.not_implemented, "optimizer.params.fp32_optimizer_states", "bf16.bf16_optimizer_states"));
  }
  SECTION("fp32_optimizer_states true beside bf16 states is overridden, with a warning") {
    auto r = parse("{" + z3 + R"("optimizer": {"type": "AdamW", "params": {"fp32_optimizer_states": true}},
                   "bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true}})");
    REQUIRE(r.runnable());
    CHECK_FALSE(r.config->optimizer->fp32_optimizer_states);
    CHECK(has(r.warnings, "optimizer.params.fp32_optimizer_states", "overridden by bf16.bf16_optimizer_states"));
  }
}

TEST_CASE("scheduler types and their defaults", "[config][valid]") {
  const std::string head = R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 3e-4}}, )";
  SECTION("WarmupLR without warmup_max_lr takes the optimizer lr") {
    auto r = parse(head + R"("scheduler": {"type": "WarmupLR"}})");
    REQUIRE(r.ok());
    CHECK(r.config->scheduler->warmup_max_lr == 3e-4);
    CHECK(r.config->scheduler->warmup_num_steps == 1000);
    CHECK(resolution(r, "scheduler.params.warmup_max_lr") != nullptr);
  }
  SECTION("WarmupDecayLR keeps its own 0.001 default") {
    auto r = parse(head + R"("scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 500}}})");
    REQUIRE(r.ok());
    CHECK(r.config->scheduler->warmup_max_lr == 0.001);
    CHECK(r.config->scheduler->total_num_steps == 500);
  }
  SECTION("WarmupCosineLR") {
    auto r = parse(
        head +
        R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 500, "warmup_num_steps": 50}}})");
    REQUIRE(r.ok());
    CHECK(r.config->scheduler->cos_min_ratio == 1e-4);
    CHECK(r.config->scheduler->warmup_min_ratio == 0.0);
    CHECK(r.config->scheduler->warmup_num_steps == 50);
  }
  SECTION("OneCycle second phase defaults to the first") {
    auto r = parse(
        head +
        R"("scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 100, "cycle_first_stair_count": 4, "cycle_second_step_size": null}}})");
    REQUIRE(r.ok());
    const SchedulerConfig& s = *r.config->scheduler;
    CHECK(s.cycle_second_step_size == 100);
    CHECK(s.cycle_second_stair_count == 4);
    CHECK(s.cycle_momentum);
    CHECK(s.cycle_min_mom == 0.8);
    CHECK(s.cycle_max_mom == 0.9);
  }
  SECTION("LRRangeTest") {
    auto r = parse(head + R"("scheduler": {"type": "LRRangeTest", "params": {"lr_range_test_staircase": true}}})");
    REQUIRE(r.ok());
    const SchedulerConfig& s = *r.config->scheduler;
    CHECK(s.lr_range_test_min_lr == 1e-3);
    CHECK(s.lr_range_test_step_size == 2000);
    CHECK(s.lr_range_test_step_rate == 1.0);
    CHECK(s.lr_range_test_staircase);
  }
}

TEST_CASE("the zero3 block", "[config][valid]") {
  auto r = parse(R"({"train_batch_size": 8, "zero3": {
      "seed": 7, "pinned_memory_budget_gb": 1.5, "device": "host",
      "model": {"type": "mlp", "layers": 3, "hidden_size": 32, "vocab_size": 16},
      "data": {"source": "tokens:/data/train.bin", "markov_order": 3, "heldout_fraction": 0.25},
      "run": {"steps": 50, "log_interval": 5},
      "comm": {"timeout_s": 12.5, "backend": "mpi"},
      "alerts": {"command": "cat >> /tmp/alerts", "level": "error"}}})");
  INFO(dump(r));
  REQUIRE(r.ok());
  const Zero3Settings& s = r.config->zero3;
  CHECK(s.seed == 7);
  CHECK(s.pinned_memory_budget_gb == 1.5);
  CHECK(s.device == DeviceChoice::host);
  REQUIRE(s.model);
  CHECK(s.model->type == ModelType::mlp);
  CHECK(s.model->layers == 3);
  CHECK(s.model->hidden_size == 32);
  CHECK(s.model->seq_len == 1);  // mlp default
  CHECK(s.data.source == "tokens:/data/train.bin");
  CHECK(s.data.markov_order == 3);
  CHECK(s.data.heldout_fraction == 0.25);
  REQUIRE(s.run);
  CHECK(s.run->steps == 50);
  CHECK(s.run->log_interval == 5);
  CHECK(s.comm.timeout_s == 12.5);
  CHECK(s.comm.backend == CommBackend::mpi);
  CHECK(s.alerts.command == "cat >> /tmp/alerts");
  CHECK(s.alerts.errors_only);
  const auto defaults = parse(R"({"train_batch_size": 8, "zero3": {"alerts": {"command": "x"}}})");
  REQUIRE(defaults.ok());
  CHECK_FALSE(defaults.config->zero3.alerts.errors_only);  // "warning"
}

TEST_CASE("the zero3 nonfinite and spike blocks", "[config][valid]") {
  auto d = parse(R"({"train_batch_size": 8})");
  REQUIRE(d.ok());
  const Zero3Settings& def = d.config->zero3;
  CHECK(def.nonfinite.policy == NonfinitePolicy::skip);  // on by default
  CHECK(def.nonfinite.max_consecutive == 10);
  CHECK_FALSE(def.spike.enabled);  // off by default
  CHECK(def.spike.detector == SpikeDetector::zscore);
  CHECK(def.spike.threshold == 6.0);
  auto r = parse(R"({"train_batch_size": 8, "zero3": {
      "nonfinite": {"policy": "abort", "max_consecutive": 3},
      "spike": {"enabled": true, "detector": "ratio", "window": 20, "warmup_steps": 5, "action": "rollback",
                "rewarm_steps": 7, "skip_batches": 9, "max_consecutive": 4}}})");
  INFO(dump(r));
  REQUIRE(r.ok());
  const Zero3Settings& s = r.config->zero3;
  CHECK(s.nonfinite.policy == NonfinitePolicy::abort);
  CHECK(s.nonfinite.max_consecutive == 3);
  CHECK(s.spike.enabled);
  CHECK(s.spike.detector == SpikeDetector::ratio);
  CHECK(s.spike.threshold == 2.0);  // the ratio detector's default
  CHECK(s.spike.window == 20);
  CHECK(s.spike.warmup_steps == 5);
  CHECK(s.spike.action == SpikeAction::rollback);
  CHECK(s.spike.rewarm_steps == 7);
  CHECK(s.spike.skip_batches == 9);
  CHECK(s.spike.max_consecutive == 4);
  auto z = parse(R"({"train_batch_size": 8, "zero3": {"spike": {"threshold": 4.5, "action": "reset_moments"}}})");
  REQUIRE(z.ok());
  CHECK(z.config->zero3.spike.threshold == 4.5);
  CHECK(z.config->zero3.spike.action == SpikeAction::reset_moments);
}

TEST_CASE("shipped example configs are runnable at world size 2", "[config][valid][examples]") {
  struct Expect {
    const char* file;
    std::int64_t tb, mb, gas;
    OffloadDevice param, optimizer;
    DType dtype;
  };
  const Expect expected[] = {
      {"zero3-bf16-ondevice.json", 16, 4, 2, OffloadDevice::none, OffloadDevice::none, DType::bf16},
      {"zero3-offload-optimizer.json", 16, 4, 2, OffloadDevice::none, OffloadDevice::cpu, DType::bf16},
      {"zero3-offload-param-optimizer.json", 16, 4, 2, OffloadDevice::cpu, OffloadDevice::cpu, DType::bf16},
      {"zero3-fp16-dynamic.json", 16, 8, 1, OffloadDevice::none, OffloadDevice::cpu, DType::f16},
  };
  for (const auto& e : expected) {
    INFO(e.file);
    ParseOptions opts;
    opts.world_size = 2;
    const ParseResult r = parse_config_file(std::string(ZERO3_CONFIGS_DIR) + "/" + e.file, opts);
    INFO(dump(r));
    REQUIRE(r.ok());
    CHECK(r.runnable());
    const Config& c = *r.config;
    CHECK(c.batch.train_batch_size == e.tb);
    CHECK(c.batch.train_micro_batch_size_per_gpu == e.mb);
    CHECK(c.batch.gradient_accumulation_steps == e.gas);
    CHECK(c.zero.offload_param.device == e.param);
    CHECK(c.zero.offload_optimizer.device == e.optimizer);
    CHECK(c.model_dtype() == e.dtype);
    REQUIRE(c.zero3.model);
    CHECK(c.zero3.model->layers == 2);
    CHECK(c.zero3.model->hidden_size == 64);
    CHECK(c.zero3.model->heads == 4);
    CHECK(c.zero3.model->vocab_size == 64);
    CHECK(c.zero3.model->seq_len == 32);
    REQUIRE(c.zero3.run);
    CHECK(c.zero3.run->steps == 200);
  }
  CHECK(parse_config_file(std::string(ZERO3_CONFIGS_DIR) + "/zero3-fp16-dynamic.json", {2, "", "", false})
            .config->fp16.dynamic_loss_scale());
}

TEST_CASE("the resolved config parses back to itself", "[config][valid][to_json]") {
  std::vector<std::string> files;
  for (const auto& dir : {std::string(ZERO3_CONFIGS_DIR), std::string(ZERO3_CONFIG_FIXTURES) + "/exit0",
                          std::string(ZERO3_CONFIG_FIXTURES) + "/exit1"}) {
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() == ".json") files.push_back(entry.path().string());
    }
  }
  REQUIRE(files.size() >= 8);
  for (const auto& f : files) {
    INFO(f);
    ParseOptions opts;
    opts.world_size = 2;
    const ParseResult first = parse_config_file(f, opts);
    REQUIRE(first.ok());
    const std::string json = to_json(*first.config);
    const ParseResult second = parse_config_text(json, opts);
    INFO(dump(second));
    REQUIRE(second.ok());
    CHECK(second.resolved.empty());  // nothing left to resolve
    CHECK(to_json(*second.config) == json);
    CHECK(second.not_implemented.size() == first.not_implemented.size());
  }
}

TEST_CASE("\"auto\" total_num_steps without a run length is left to the run", "[config][valid][auto]") {
  const std::string json =
      R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
          "zero_optimization": {"stage": 3},
          "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_num_steps": 10}}})";
  const ParseResult r = parse(json);
  INFO(dump(r));
  REQUIRE(r.ok());
  const Resolution* note = resolution(r, "scheduler.params.total_num_steps");
  REQUIRE(note != nullptr);
  CHECK(note->value == "\"auto\"");
  CHECK_THAT(note->reason, Catch::Contains("at run time") && Catch::Contains("--steps"));
  Config c = *r.config;
  CHECK(c.scheduler->total_num_steps_from_run);
  // The resolved config keeps the "auto", so it reads back the same.
  const ParseResult again = parse(to_json(c));
  REQUIRE(again.ok());
  CHECK(again.config->scheduler->total_num_steps_from_run);
  // The run fills it in; a config with a number is left alone.
  resolve_run_length(c, 250);
  CHECK(c.scheduler->total_num_steps == 250);
  CHECK_FALSE(c.scheduler->total_num_steps_from_run);
  resolve_run_length(c, 999);
  CHECK(c.scheduler->total_num_steps == 250);
}
