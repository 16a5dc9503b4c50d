// Invalid configs: each must be rejected with an error naming the offending JSON path (and saying what is
// wrong). One row per rule; the base config around each mistake is otherwise valid.
#include <catch2/catch.hpp>
#include <string>

#include "test_config_helpers.hpp"
#include "zero3/core/error.hpp"

using namespace zero3::config;
using zero3::config::testing::dump;
using zero3::config::testing::has;
using zero3::config::testing::parse;

namespace {

struct Case {
  const char* name;
  const char* json;
  const char* path;  // exact Diagnostic::path of the expected error
  const char* text;  // must occur in its message
  int world_size = 1;
};

// Wraps a fragment in a valid stage-3 config: {"train_batch_size": 8, <fragment>}.
#define Z3 R"("train_batch_size": 8, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 3})"

const Case kCases[] = {
    // ---- zero_optimization
    {"stage out of range", R"({"train_batch_size": 8, "zero_optimization": {"stage": 4}})", "zero_optimization.stage",
     "must be in [0, 3]"},
    {"stage as string, strict",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": "3"}, "zero3": {"strict": true}})",
     "zero_optimization.stage", "DeepSpeed's pydantic model converts it"},
    {"stage as an unreadable string", R"({"train_batch_size": 8, "zero_optimization": {"stage": "three"}})",
     "zero_optimization.stage", "expected an integer"},
    {"stage fractional", R"({"train_batch_size": 8, "zero_optimization": {"stage": 2.5}})", "zero_optimization.stage",
     "fractional"},
    {"negative bucket", R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_size": -1}})",
     "zero_optimization.reduce_bucket_size", "must be > 0"},
    {"zero bucket (DeepSpeed: greater than 0)",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_size": 0}})",
     "zero_optimization.reduce_bucket_size", "must be > 0"},
    {"compute_grad_norm off with stage 3",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "compute_grad_norm": false}})",
     "zero_optimization.compute_grad_norm", "stage 1 or 2"},
    {"keep_in_fp32_modules not a list", R"({"train_batch_size": 8, "data_types": {"keep_in_fp32_modules": "norm"}})",
     "data_types.keep_in_fp32_modules", "list of name patterns"},
    {"fractional bucket", R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_size": 5.5}})",
     "zero_optimization.reduce_bucket_size", "5.5 (a fractional number)"},
    {"bucket beyond int64", R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "sub_group_size": 1e30}})",
     "zero_optimization.sub_group_size", "1e+30 is out of range (0 .. 9223372036854775807, a 64-bit integer)"},
    {"offload device gpu",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}})",
     "zero_optimization.offload_param.device", "\"none\", \"cpu\", \"nvme\""},
    {"offload device uppercase",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "CPU"}}})",
     "zero_optimization.offload_optimizer.device", "the string \"CPU\""},
    {"nvme without path",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}}})",
     "zero_optimization.offload_optimizer.nvme_path", "required when device is \"nvme\""},
    {"ratio above 1",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})",
     "zero_optimization.offload_optimizer.ratio", "must be in [0, 1]"},
    {"partial offload below stage 3",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu", "ratio": 0.5}}})",
     "zero_optimization.offload_optimizer.ratio", "needs stage 3"},
    {"misspelt zero key", R"({)" Z3 R"(, "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_sz": 5e7}})",
     "zero_optimization.stage3_prefetch_bucket_sz", "did you mean 'stage3_prefetch_bucket_size'?"},
    {"misspelt offload key",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memmory": true}}})",
     "zero_optimization.offload_param.pin_memmory", "did you mean 'pin_memory'?"},
    {"alias and primary both",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 1, "prefetch_bucket_size": 2}})",
     "zero_optimization.prefetch_bucket_size", "alias"},
    {"cpu_offload with offload_optimizer",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "cpu_offload": true, "offload_optimizer": {"device": "cpu"}}})",
     "zero_optimization.cpu_offload", "both given"},
    {"fp16 gather key with its replacement",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true, "stage3_gather_16bit_weights_on_model_save": true}})",
     "zero_optimization.stage3_gather_fp16_weights_on_model_save", "both given"},
    {"zero_optimization null", R"({"train_batch_size": 8, "zero_optimization": null})", "zero_optimization",
     "expected an object, got null"},
    {"legacy_stage1", R"({"train_batch_size": 8, "zero_optimization": {"stage": 1, "legacy_stage1": true}})",
     "zero_optimization.legacy_stage1", "not supported"},
    {"offload block as string",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "offload_optimizer": "cpu"}})",
     "zero_optimization.offload_optimizer", "expected an object or null"},
    // ---- optimizer
    {"negative lr", R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": -1e-3}}})",
     "optimizer.params.lr", "must be >= 0"},
    {"one beta", R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9]}}})",
     "optimizer.params.betas", "list of 2 numbers"},
    {"beta2 equal to 1", R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"betas": [0.9, 1.0]}}})",
     "optimizer.params.betas[1]", "must be in [0, 1)"},
    {"betas as string", R"({"train_batch_size": 8, "optimizer": {"type": "Lion", "params": {"betas": "0.9,0.99"}}})",
     "optimizer.params.betas", "the string"},
    {"max_grad_norm in params",
     R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})",
     "optimizer.params.max_grad_norm", "gradient_clipping"},
    {"unknown optimizer type", R"({"train_batch_size": 8, "optimizer": {"type": "AdamX"}})", "optimizer.type",
     "unknown optimizer type \"AdamX\""},
    {"unknown optimizer param",
     R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"learning_rate": 1e-3}}})",
     "optimizer.params.learning_rate", "unknown key"},
    {"optimizer without type", R"({"train_batch_size": 8, "optimizer": {"params": {"lr": 1e-3}}})", "optimizer.type",
     "required key is missing"},
    {"eps is not a Lion param", R"({"train_batch_size": 8, "optimizer": {"type": "Lion", "params": {"eps": 1e-8}}})",
     "optimizer.params.eps", "it is a key of"},
    {"adamw_mode misspelt",
     R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"adamw_mode": false}}})",
     "optimizer.params.adamw_mode", "did you mean 'adam_w_mode'?"},
    {"optimizer null", R"({"train_batch_size": 8, "optimizer": null})", "optimizer", "expected an object"},
    {"one-bit optimizer with ZeRO",
     R"({"train_batch_size": 8, "optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 3}})",
     "optimizer.type", "incompatible with ZeRO"},
    {"untested optimizer with ZeRO",
     R"({"train_batch_size": 8, "optimizer": {"type": "Lamb"}, "zero_optimization": {"stage": 3}})", "optimizer.type",
     "zero_allow_untested_optimizer"},
    {"auto where not accepted",
     R"({"train_batch_size": 8, "optimizer": {"type": "Adam", "params": {"bias_correction": "auto"}}})",
     "optimizer.params.bias_correction", "\"auto\" is not accepted here"},
    // ---- scheduler
    {"unknown scheduler type", R"({)" Z3 R"(, "scheduler": {"type": "WarmupCosine"}})", "scheduler.type",
     "did you mean 'WarmupCosineLR'?"},
    {"scheduler type wrong case", R"({)" Z3 R"(, "scheduler": {"type": "warmuplr"}})", "scheduler.type",
     "case-sensitive"},
    {"decay without total",
     R"({)" Z3 R"(, "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
     "scheduler.params.total_num_steps", "required key is missing"},
    {"one cycle without max", R"({)" Z3 R"(, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4}}})",
     "scheduler.params.cycle_max_lr", "required key is missing"},
    {"total_num_steps is not a WarmupLR param",
     R"({)" Z3 R"(, "scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 100}}})",
     "scheduler.params.total_num_steps", "it is a key of"},
    {"warmup_type cosine, strict",
     R"({)" Z3
     R"(, "scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}, "zero3": {"strict": true}})",
     "scheduler.params.warmup_type", "log is used, as DeepSpeed does"},
    {"warmup steps zero", R"({)" Z3 R"(, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 0}}})",
     "scheduler.params.warmup_num_steps", "must be > 0"},
    // ---- fp16 / bf16
    {"loss_scale_window zero", R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale_window": 0}})",
     "fp16.loss_scale_window", "must be > 0 with dynamic loss scaling"},
    {"negative loss scale", R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": -1}})",
     "fp16.loss_scale", "must be >= 0"},
    {"loss scale as bool", R"({"train_batch_size": 8, "fp16": {"enabled": true, "loss_scale": true}})",
     "fp16.loss_scale", "expected a number"},
    {"enabled as a word pydantic refuses", R"({"train_batch_size": 8, "fp16": {"enabled": "si"}})", "fp16.enabled",
     "expected true or false"},
    {"fp16 and bf16", R"({"train_batch_size": 8, "fp16": {"enabled": true}, "bf16": {"enabled": true}})",
     "bf16.enabled", "both true"},
    {"bf16 check_overflow (old key)", R"({"train_batch_size": 8, "bf16": {"enabled": true, "check_overflow": true}})",
     "bf16.check_overflow", "unknown key"},
    {"bfloat16 and bf16, strict",
     R"({"train_batch_size": 8, "bf16": {"enabled": true}, "bfloat16": {"enabled": true}, "zero3": {"strict": true}})",
     "bfloat16", "DeepSpeed ignores it when 'bf16' is also given"},
    {"bf16 optimizer states alone",
     R"({"train_batch_size": 8, "bf16": {"enabled": true, "bf16_optimizer_states": true}})",
     "bf16.bf16_optimizer_states", "bf16_master_weights_and_grads"},
    {"bf16 master weights in an fp32 job", R"({)" Z3 R"(, "bf16": {"bf16_master_weights_and_grads": true}})",
     "bf16.bf16_master_weights_and_grads", "needs bf16.enabled: true"},
    {"bf16 master weights in an fp16 job",
     R"({)" Z3 R"(, "fp16": {"enabled": true}, "bf16": {"bf16_master_weights_and_grads": true}})",
     "bf16.bf16_master_weights_and_grads", "needs bf16.enabled: true"},
    {"bf16 master weights under the old block name",
     R"({)" Z3 R"(, "bfloat16": {"enabled": false, "bf16_master_weights_and_grads": true}})",
     "bfloat16.bf16_master_weights_and_grads", "needs bfloat16.enabled: true"},
    {"fp16 master weights in a bf16 job",
     R"({)" Z3 R"(, "bf16": {"enabled": true}, "fp16": {"fp16_master_weights_and_grads": true}})",
     "fp16.fp16_master_weights_and_grads", "needs fp16.enabled: true"},
    {"bf16 master weights at stage 0",
     R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 0},
         "bf16": {"enabled": true, "bf16_master_weights_and_grads": true}})",
     "bf16.bf16_master_weights_and_grads", "needs ZeRO stage 1, 2 or 3, got stage 0"},
    {"fp16 master weights without zero_optimization",
     R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"},
         "fp16": {"enabled": true, "fp16_master_weights_and_grads": true}})",
     "fp16.fp16_master_weights_and_grads", "needs ZeRO stage 1, 2 or 3"},
    {"both master-weight keys", R"({)" Z3 R"(, "bf16": {"enabled": true, "bf16_master_weights_and_grads": true},
         "fp16": {"fp16_master_weights_and_grads": true}})",
     "fp16.fp16_master_weights_and_grads", "both true"},
    // ---- batch and top level
    {"micro batch zero", R"({"train_micro_batch_size_per_gpu": 0})", "train_micro_batch_size_per_gpu", "must be > 0"},
    {"negative accumulation", R"({"train_batch_size": 8, "gradient_accumulation_steps": -2})",
     "gradient_accumulation_steps", "must be > 0"},
    {"batch rule", R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 3})", "train_batch_size",
     "32 != train_micro_batch_size_per_gpu (3) * gradient_accumulation_steps (5, inferred as 32 // 3 // 2) * world "
     "size (2, from --world-size)",
     2},
    {"no batch size", R"({"gradient_accumulation_steps": 4})", "train_batch_size", "neither"},
    {"micro batch inferred as zero", R"({"train_batch_size": 1})", "train_micro_batch_size_per_gpu",
     "inferred as 1 // 2 = 0", 2},
    {"misspelt top-level key, strict", R"({"train_batch_size": 8, "train_batch_sizes": 8, "zero3": {"strict": true}})",
     "train_batch_sizes", "did you mean 'train_batch_size'?"},
    {"top-level key in the wrong block, strict",
     R"({"train_batch_size": 8, "offload_optimizer": {"device": "cpu"}, "zero3": {"strict": true}})",
     "offload_optimizer", "it is a key of 'zero_optimization'"},
    {"misspelt zero_optimization key",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "reduce_bucket_sz": 5}})",
     "zero_optimization.reduce_bucket_sz", "DeepSpeedZeroConfig: extra inputs are not permitted"},
    {"negative clipping", R"({"train_batch_size": 8, "gradient_clipping": -1.0})", "gradient_clipping", "must be >= 0"},
    {"steps_per_print zero", R"({"train_batch_size": 8, "steps_per_print": 0})", "steps_per_print", "must be > 0"},
    {"communication dtype fp8", R"({"train_batch_size": 8, "communication_data_type": "fp8"})",
     "communication_data_type", "\"fp32\", \"fp16\" or \"bf16\""},
    {"prescale with stage 3", R"({)" Z3 R"(, "prescale_gradients": true})", "prescale_gradients", "must be false"},
    {"predivide with stage 3", R"({)" Z3 R"(, "gradient_predivide_factor": 2.0})", "gradient_predivide_factor",
     "must be 1.0"},
    {"allreduce sum with stage 3", R"({)" Z3 R"(, "gradient_allreduce_op": "SUM"})", "gradient_allreduce_op",
     "not allowed with ZeRO stage 3"},
    // ---- other blocks
    {"grad accum dtype fp64", R"({"train_batch_size": 8, "data_types": {"grad_accum_dtype": "fp64"}})",
     "data_types.grad_accum_dtype", "unknown dtype"},
    {"param dtype conflicts",
     R"({"train_batch_size": 8, "bf16": {"enabled": true}, "data_types": {"param_dtype": "fp32"}})",
     "data_types.param_dtype", "conflicts"},
    {"tag validation", R"({"train_batch_size": 8, "checkpoint": {"tag_validation": "strict"}})",
     "checkpoint.tag_validation", "\"Ignore\", \"Warn\", \"Fail\""},
    {"monitor enabled as a number", R"({"train_batch_size": 8, "tensorboard": {"enabled": 2}})", "tensorboard.enabled",
     "expected true or false"},
    {"csv monitor unknown key", R"({"train_batch_size": 8, "csv_monitor": {"enabled": true, "path": "x"}})",
     "csv_monitor.path", "unknown key"},
    {"comet key misspelt", R"({"train_batch_size": 8, "comet": {"enabled": false, "api": "k"}})", "comet.api",
     "unknown key"},
    {"activation checkpointing doc spelling, strict",
     R"({"train_batch_size": 8, "activation_checkpointing": {"partitioned_activations": true}, "zero3": {"strict": true}})",
     "activation_checkpointing.partitioned_activations", "did you mean 'partition_activations'?"},
    {"flops profile_step zero", R"({"train_batch_size": 8, "flops_profiler": {"profile_step": 0}})",
     "flops_profiler.profile_step", "must be > 0"},
    {"amp, removed in DeepSpeed 0.19.8", R"({"train_batch_size": 8, "amp": {"enabled": false}})", "amp",
     "removed in DeepSpeed 0.19.8"},
    {"MiCS, removed in DeepSpeed 0.19.8",
     R"({"train_batch_size": 8, "zero_optimization": {"stage": 3, "mics_shard_size": -1}})",
     "zero_optimization.mics_shard_size", "removed in DeepSpeed 0.19.8"},
    {"aio thread_count and intra_op_parallelism, strict",
     R"({"train_batch_size": 8, "aio": {"thread_count": 2, "intra_op_parallelism": 4}, "zero3": {"strict": true}})",
     "aio.thread_count", "intra_op_parallelism is given"},
    {"elasticity, removed in DeepSpeed 0.19.8", R"({"train_batch_size": 8, "elasticity": {"enabled": false}})",
     "elasticity", "even when the feature is off"},
    {"pipeline stages not a number", R"({"train_batch_size": 8, "pipeline": {"stages": "two"}})", "pipeline.stages",
     "expected \"auto\" or an integer"},
    {"duplicate nested key",
     R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "lr": 2e-3}}})",
     "optimizer.params.lr", "duplicate key"},
    // ---- zero3 block
    {"heads do not divide hidden",
     R"({"train_batch_size": 8, "zero3": {"model": {"layers": 2, "hidden_size": 64, "heads": 5, "vocab_size": 64, "seq_len": 32}}})",
     "zero3.model.heads", "not divisible"},
    {"zero layers",
     R"({"train_batch_size": 8, "zero3": {"model": {"layers": 0, "hidden_size": 64, "heads": 4, "vocab_size": 64, "seq_len": 32}}})",
     "zero3.model.layers", "must be > 0"},
    {"gpt without seq_len",
     R"({"train_batch_size": 8, "zero3": {"model": {"layers": 2, "hidden_size": 64, "heads": 4, "vocab_size": 64}}})",
     "zero3.model.seq_len", "required key is missing"},
    {"heldout fraction 1", R"({"train_batch_size": 8, "zero3": {"data": {"heldout_fraction": 1.0}}})",
     "zero3.data.heldout_fraction", "must be in (0, 1)"},
    {"bad data source", R"({"train_batch_size": 8, "zero3": {"data": {"source": "file:x.bin"}}})", "zero3.data.source",
     "synthetic:markov"},
    {"run without steps", R"({"train_batch_size": 8, "zero3": {"run": {"log_interval": 5}}})", "zero3.run.steps",
     "required key is missing"},
    {"comm backend gloo", R"({"train_batch_size": 8, "zero3": {"comm": {"backend": "gloo"}}})", "zero3.comm.backend",
     "\"auto\", \"mpi\", \"nccl\""},
    {"comm timeout zero", R"({"train_batch_size": 8, "zero3": {"comm": {"timeout_s": 0}}})", "zero3.comm.timeout_s",
     "must be > 0"},
    {"alert level info", R"({"train_batch_size": 8, "zero3": {"alerts": {"level": "info"}}})", "zero3.alerts.level",
     "\"warning\", \"error\""},
    {"alert command a list", R"({"train_batch_size": 8, "zero3": {"alerts": {"command": ["sh"]}}})",
     "zero3.alerts.command", "expected a string"},
    {"device gpu", R"({"train_batch_size": 8, "zero3": {"device": "gpu"}})", "zero3.device",
     "\"auto\", \"host\", \"cuda\""},
    {"zero3 unknown key", R"({"train_batch_size": 8, "zero3": {"seeds": 1}})", "zero3.seeds", "did you mean 'seed'?"},
    {"pinned budget negative", R"({"train_batch_size": 8, "zero3": {"pinned_memory_budget_gb": -1}})",
     "zero3.pinned_memory_budget_gb", "a number > 0 or \"auto\""},
    {"nonfinite policy ignore", R"({"train_batch_size": 8, "zero3": {"nonfinite": {"policy": "ignore"}}})",
     "zero3.nonfinite.policy", "\"skip\", \"abort\""},
    {"nonfinite max_consecutive zero", R"({"train_batch_size": 8, "zero3": {"nonfinite": {"max_consecutive": 0}}})",
     "zero3.nonfinite.max_consecutive", "must be > 0"},
    {"spike ratio threshold 1",
     R"({"train_batch_size": 8, "zero3": {"spike": {"detector": "ratio", "threshold": 1.0}}})", "zero3.spike.threshold",
     "must be > 1"},
    {"spike action restart", R"({"train_batch_size": 8, "zero3": {"spike": {"action": "restart"}}})",
     "zero3.spike.action", "\"rollback\""},
    {"spike window 1", R"({"train_batch_size": 8, "zero3": {"spike": {"window": 1}}})", "zero3.spike.window",
     "must be >= 2"},
};

}  // namespace

TEST_CASE("invalid configs are rejected with the JSON path of the mistake", "[config][invalid]") {
  STATIC_REQUIRE(sizeof(kCases) / sizeof(kCases[0]) >= 40);
  for (const Case& c : kCases) {
    INFO("case: " << c.name);
    const ParseResult r = parse(c.json, c.world_size);
    INFO(dump(r));
    CHECK_FALSE(r.ok());
    CHECK_FALSE(r.config.has_value());
    CHECK(has(r.errors, c.path, c.text));
  }
}

TEST_CASE("values DeepSpeed's pydantic blocks convert are read the same, with a warning", "[config][lint]") {
  // pydantic's lax mode, as DeepSpeed's strict blocks (zero_optimization, fp16, bf16, the monitors) use it.
  const ParseResult r = parse(
      R"({"train_batch_size": 8, "optimizer": {"type": "AdamW"},
          "zero_optimization": {"stage": " 3 ", "reduce_bucket_size": "5_000_000", "contiguous_gradients": "yes",
                                "offload_optimizer": {"device": "cpu", "ratio": "1e0"}},
          "fp16": {"enabled": "off", "initial_scale_power": "12.0"}})");
  INFO(dump(r));
  REQUIRE(r.ok());
  CHECK(r.config->zero.stage == 3);
  CHECK(r.config->zero.reduce_bucket_size == 5'000'000);
  CHECK(r.config->zero.offload_optimizer.ratio == 1.0);
  CHECK_FALSE(r.config->fp16.enabled);
  CHECK(r.config->fp16.initial_scale_power == 12);
  for (const char* path :
       {"zero_optimization.stage", "zero_optimization.reduce_bucket_size", "zero_optimization.contiguous_gradients",
        "zero_optimization.offload_optimizer.ratio", "fp16.enabled", "fp16.initial_scale_power"}) {
    CHECK(has(r.warnings, path, "DeepSpeed's pydantic model converts it"));
  }
  // What pydantic refuses stays an error: a fraction, an exponent for an integer, a word for a boolean.
  const ParseResult bad = parse(
      R"({"train_batch_size": 8, "zero_optimization": {"stage": "2.5", "reduce_bucket_size": "5e8",
          "contiguous_gradients": "maybe"}})");
  CHECK(has(bad.errors, "zero_optimization.stage", "expected an integer"));
  CHECK(has(bad.errors, "zero_optimization.reduce_bucket_size", "expected an integer"));
  CHECK(has(bad.errors, "zero_optimization.contiguous_gradients", "true or false"));
  // Blocks DeepSpeed reads as plain dicts hand the string on; zero3 does not guess there.
  CHECK(has(parse(R"({"train_batch_size": 8, "gradient_clipping": "1.0"})").errors, "gradient_clipping", "a number"));
}

TEST_CASE("keys DeepSpeed ignores are warnings, and errors in strict mode", "[config][invalid][lint]") {
  // DeepSpeed ignores unknown top-level keys and unknown keys of the blocks it reads as plain dicts.
  const std::string json =
      R"({"train_batch_size": 8, "_comment": "x", "train_batch_sizes": 8, "zero_optimization": {"stage": 3},
          "activation_checkpointing": {"partition_activations": false, "contigous_memory_optimization": false},
          "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}})";
  const ParseResult lenient = parse(json);
  INFO(dump(lenient));
  REQUIRE(lenient.ok());
  CHECK(lenient.errors.empty());
  CHECK(has(lenient.warnings, "_comment", "ignored, as DeepSpeed ignores unknown keys at the top level"));
  CHECK(has(lenient.warnings, "train_batch_sizes", "did you mean 'train_batch_size'?"));
  CHECK(has(lenient.warnings, "activation_checkpointing.contigous_memory_optimization",
            "did you mean 'contiguous_memory_optimization'?"));

  ParseOptions strict;
  strict.world_size = 1;
  strict.strict = true;
  const ParseResult linted = parse_config_text(json, strict);
  INFO(dump(linted));
  CHECK_FALSE(linted.ok());
  CHECK_FALSE(linted.config.has_value());
  CHECK(has(linted.errors, "_comment", "[an error under --strict]"));
  CHECK(has(linted.errors, "train_batch_sizes", "did you mean"));
  CHECK(has(linted.errors, "activation_checkpointing.contigous_memory_optimization", "did you mean"));
  CHECK_FALSE(has(linted.warnings, "_comment"));
  // Only the lint findings move; the rest of the report is unchanged.
  CHECK(linted.errors.size() == lenient.warnings.size() - linted.warnings.size());
}

TEST_CASE("hjson syntax is a warning, and an error under zero3.strict or --strict", "[config][lint]") {
  const std::string body = R"("train_batch_size": 8,  // a comment
  "zero_optimization": {"stage": 3,},)";
  const ParseResult lenient = parse("{" + body + "}");
  INFO(dump(lenient));
  REQUIRE(lenient.ok());
  CHECK(has(lenient.warnings, "<config>", "line 1"));
  CHECK(has(lenient.warnings, "<config>", "line 2"));
  const ParseResult by_setting = parse("{" + body + R"("zero3": {"strict": true}})");
  CHECK_FALSE(by_setting.ok());
  CHECK(has(by_setting.errors, "<config>", "[an error under zero3.strict]"));
  ParseOptions strict;
  strict.strict = true;
  const ParseResult by_option = parse_config_text("{" + body + "}", strict);
  CHECK_FALSE(by_option.ok());
  CHECK(has(by_option.errors, "<config>", "line 1"));
}

TEST_CASE("all errors of a config are reported in one pass", "[config][invalid]") {
  const ParseResult r = parse(R"({
    "train_batch_size": 8,
    "optimizer": {"type": "Adam", "params": {"lr": -0.1, "betas": [0.9, 1.5], "max_grad_norm": 1.0}},
    "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 0}},
    "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}, "offload_optimizer": {"ratio": 1.5}},
    "fp16": {"enabled": true}, "bf16": {"enabled": true},
    "zero3": {"seeds": 3}
  })");
  INFO(dump(r));
  CHECK(has(r.errors, "optimizer.params.lr"));
  CHECK(has(r.errors, "optimizer.params.betas[1]"));
  CHECK(has(r.errors, "optimizer.params.max_grad_norm"));
  CHECK(has(r.errors, "scheduler.params.total_num_steps"));
  CHECK(has(r.errors, "scheduler.params.warmup_num_steps"));
  CHECK(has(r.errors, "zero_optimization.offload_param.nvme_path"));
  CHECK(has(r.errors, "zero_optimization.offload_optimizer.ratio"));
  CHECK(has(r.errors, "bf16.enabled"));
  CHECK(has(r.errors, "zero3.seeds"));
  CHECK(r.errors.size() == 9);
}

TEST_CASE("documents that are not a JSON object", "[config][invalid]") {
  ParseOptions opts;
  opts.source_name = "cfg.json";
  SECTION("empty") {
    auto r = parse_config_text("", opts);
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].path == "cfg.json");
    CHECK_THAT(r.errors[0].message, Catch::Contains("empty file"));
  }
  SECTION("whitespace only") {
    auto r = parse_config_text("  \n\t\n", opts);
    REQUIRE(r.errors.size() == 1);
    CHECK_THAT(r.errors[0].message, Catch::Contains("empty file"));
  }
  SECTION("syntax error reports line and column") {
    // The stray comma is the 14th byte of line 3.
    auto r = parse_config_text("{\n  \"a\": 1,\n  \"b\": [1, 2,, 3]\n}\n", opts);
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].path == "cfg.json");
    CHECK_THAT(r.errors[0].message, Catch::Contains("line 3, column 14"));
  }
  SECTION("truncated document") {
    auto r = parse_config_text("{\"train_batch_size\": 8,\n", opts);
    REQUIRE(r.errors.size() == 1);
    CHECK_THAT(r.errors[0].message, Catch::Contains("line 2, column 1"));
  }
  SECTION("error on the first line") {
    // hjson (so zero3) takes 'single quotes', but not a key without its ':' (the 21st byte).
    auto r = parse_config_text("{\"train_batch_size\" 8}", opts);
    REQUIRE(r.errors.size() == 1);
    CHECK_THAT(r.errors[0].message, Catch::Contains("line 1, column 21"));
  }
  SECTION("top level array, string, number, null") {
    for (const char* doc : {"[1, 2]", "\"config\"", "8", "null"}) {
      auto r = parse_config_text(doc, opts);
      REQUIRE(r.errors.size() == 1);
      CHECK_THAT(r.errors[0].message, Catch::Contains("must be a JSON object"));
    }
  }
  SECTION("missing file") {
    auto r = parse_config_file("/nonexistent/dir/cfg.json");
    REQUIRE(r.errors.size() == 1);
    CHECK(r.errors[0].path == "/nonexistent/dir/cfg.json");
    CHECK_THAT(r.errors[0].message, Catch::Contains("cannot open"));
  }
}

TEST_CASE("duplicate keys are errors at every depth", "[config][invalid]") {
  const ParseResult r = parse(R"({
    "train_batch_size": 8,
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "device": "none"}},
    "train_batch_size": 16
  })");
  INFO(dump(r));
  CHECK(has(r.errors, "train_batch_size", "duplicate key"));
  CHECK(has(r.errors, "zero_optimization.offload_param.device", "duplicate key"));
  CHECK(r.errors.size() == 2);
}

TEST_CASE("load_config_or_throw lists every problem", "[config][invalid]") {
  try {
    load_config_or_throw(ZERO3_CONFIG_FIXTURES "/exit2/many_errors.json", ParseOptions{2, "--world-size", "", false});
    FAIL("no exception");
  } catch (const zero3::ConfigError& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("error: optimizer.params.lr"));
    CHECK_THAT(what, Catch::Contains("error: zero_optimization.offload_param.nvme_path"));
    CHECK_THAT(what, Catch::Contains("error: bf16.enabled"));
  }
  // Valid but not runnable: refused unless allowed.
  CHECK_THROWS_AS(load_config_or_throw(ZERO3_CONFIG_FIXTURES "/exit1/stage2.json", ParseOptions{2, "", "", false}),
                  zero3::ConfigError);
  CHECK(load_config_or_throw(ZERO3_CONFIG_FIXTURES "/exit1/stage2.json", ParseOptions{2, "", "", true}).zero.stage ==
        2);
}
