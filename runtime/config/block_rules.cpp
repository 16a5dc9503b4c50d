// The validation rule of each DeepSpeed block, as DeepSpeed's loader applies it (deepspeed/runtime/config.py
// `DeepSpeedConfig._initialize_params` and the readers it calls), checked against DeepSpeed 0.19.8. `since` is
// the first DeepSpeed tag that shipped the rule ("always": every release that reads the block). Presented in
// docs/config.md ("Which blocks are strict").
#include <algorithm>
#include <iterator>

#include "zero3/config/schema.hpp"

namespace zero3::config {

namespace {

using V = Validation;

constexpr BlockRule kRules[] = {
    {"", V::plain_dict, "DeepSpeedConfig (deepspeed/runtime/config.py): get_scalar_param per key", "always"},
    {"optimizer", V::plain_dict, "get_optimizer_name / get_optimizer_params (runtime/config.py)", "always"},
    {"optimizer.params (Adam/AdamW)", V::keyword_args, "FusedAdam / DeepSpeedCPUAdam constructors", "always"},
    {"optimizer.params (Lion)", V::keyword_args, "FusedLion / DeepSpeedCPULion constructors", "always"},
    {"optimizer.params (Adagrad)", V::keyword_args, "DeepSpeedCPUAdagrad constructor", "always"},
    {"scheduler", V::plain_dict, "get_scheduler_name / get_scheduler_params (runtime/config.py)", "always"},
    {"scheduler.params (WarmupLR)", V::keyword_args, "WarmupLR constructor (runtime/lr_schedules.py)", "always"},
    {"scheduler.params (WarmupDecayLR)", V::keyword_args, "WarmupDecayLR constructor", "always"},
    {"scheduler.params (WarmupCosineLR)", V::keyword_args, "WarmupCosineLR constructor", "always"},
    {"scheduler.params (OneCycle)", V::keyword_args, "OneCycle constructor", "always"},
    {"scheduler.params (LRRangeTest)", V::keyword_args, "LRRangeTest constructor", "always"},
    {"zero_optimization", V::strict_model, "DeepSpeedZeroConfig (runtime/zero/config.py)", "0.7.0"},
    {"zero_optimization.offload_param", V::strict_model, "DeepSpeedZeroOffloadParamConfig (zero/offload_config.py)",
     "0.7.0"},
    {"zero_optimization.offload_optimizer", V::strict_model,
     "DeepSpeedZeroOffloadOptimizerConfig (zero/offload_config.py)", "0.7.0"},
    {"zero_optimization.zenflow", V::strict_model, "ZenFlowConfig (runtime/zenflow/zenflow_config.py)", "0.17.5"},
    {"zero_optimization.leaf_module", V::strict_model, "DeepSpeedZeroLeafModuleConfig (zero/leaf_module_config.py)",
     "0.18.0"},
    {"fp16", V::strict_model, "DeepSpeedFP16Config (runtime/precision_config.py)", "0.17.1"},
    {"bf16", V::strict_model, "DeepSpeedBF16Config (runtime/precision_config.py)", "0.17.1"},
    {"tensorboard", V::strict_model, "TensorBoardConfig (monitor/config.py)", "0.6.6"},
    {"wandb", V::strict_model, "WandbConfig (monitor/config.py)", "0.6.6"},
    {"csv_monitor", V::strict_model, "CSVConfig (monitor/config.py)", "0.6.6"},
    {"comet", V::strict_model, "CometConfig (monitor/config.py)", "0.14.3"},
    {"comms_logger", V::strict_model, "CommsLoggerConfig (comm/config.py)", "0.7.0"},
    {"hybrid_engine", V::strict_model, "HybridEngineConfig (runtime/config.py)", "0.9.0"},
    {"compile", V::strict_model, "CompileConfig (compile/config.py)", "0.16.6"},
    {"timers", V::plain_dict, "get_timers_config (utils/config.py)", "always"},
    {"timers.throughput", V::strict_model, "DeepSpeedThroughputTimerConfig (utils/config.py)", "0.14.3"},
    {"activation_checkpointing", V::plain_dict,
     "DeepSpeedActivationCheckpointingConfig (runtime/activation_checkpointing/config.py)", "always"},
    {"flops_profiler", V::plain_dict, "DeepSpeedFlopsProfilerConfig (profiling/config.py)", "always"},
    {"aio", V::plain_dict, "get_aio_config (runtime/swap_tensor/aio_config.py)", "always"},
    {"checkpoint", V::plain_dict, "get_checkpoint_config (runtime/model_checkpointing/config.py)", "always"},
    {"checkpoint.parallel_write", V::plain_dict, "get_checkpoint_parallel_write_pipeline (runtime/config.py)",
     "always"},
    {"checkpoint.writer", V::plain_dict, "get_checkpoint_writer_config (runtime/model_checkpointing/config.py)",
     "always"},
    {"data_types", V::plain_dict, "get_data_types_params (runtime/config.py)", "always"},
    {"pipeline", V::plain_dict, "get_pipeline_config (runtime/config.py)", "always"},
    {"tensor_parallel", V::strict_model, "TPTrainingConfig (runtime/tensor_parallel/config.py)", "0.16.4"},
    {"tensor_parallel.tp", V::strict_model, "TPConfig (runtime/tensor_parallel/config.py)", "0.16.4"},
    {"weight_quantization", V::strict_model, "WeightQuantConfig (inference/config.py)", "0.10.3"},
    {"expert_parallel", V::plain_dict, "parse_autoep_config (module_inject/auto_ep_config.py)", "0.19.2"},
    {"autotuning", V::plain_dict, "DeepSpeedAutotuningConfig (autotuning/config.py)", "always"},
    {"data_efficiency", V::plain_dict, "get_data_efficiency_config (runtime/data_pipeline/config.py)", "always"},
    {"datastates_ckpt", V::plain_dict, "DeepSpeedDataStatesConfig (datastates/config.py)", "0.18.1"},
    {"torch_autocast", V::plain_dict, "get_torch_autocast_* (runtime/config.py)", "always"},
};

}  // namespace

std::span<const BlockRule> block_rules() {
  return kRules;
}

const BlockRule* find_block_rule(std::string_view block) {
  if (block == "zero3" || block.starts_with("zero3.")) {
    static constexpr BlockRule kZero3{"zero3", V::zero3_own, "zero3 only (DeepSpeed never reads it)", "-"};
    return &kZero3;
  }
  auto it = std::find_if(std::begin(kRules), std::end(kRules), [&](const BlockRule& r) { return r.block == block; });
  return it == std::end(kRules) ? nullptr : &*it;
}

std::string_view to_string(Validation v) {
  switch (v) {
    case Validation::strict_model:
      return "strict model: unknown keys rejected";
    case Validation::plain_dict:
      return "plain dict: unknown keys ignored";
    case Validation::keyword_args:
      return "keyword arguments: unknown keys rejected";
    case Validation::zero3_own:
      return "zero3's own: strict";
  }
  return "?";
}

}  // namespace zero3::config
