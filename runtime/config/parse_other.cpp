// DeepSpeed's other top-level blocks: features zero3 does not implement (amp, pipeline, elasticity, sparse
// attention, compression, ...). They are accepted so that real DeepSpeed configs load; where zero3 knows
// the block's keys they are checked, and a block that switches its feature on is reported as not implemented.
#include <fmt/format.h>

#include <array>

#include "parse_blocks.hpp"

namespace zero3::config::detail {

namespace {

enum class Trigger : std::uint8_t {
  enabled,    // the block's "enabled" is true
  present,    // the block is present (DeepSpeed switches the feature on by its presence)
  non_empty,  // the block has at least one key
};

struct FeatureBlock {
  std::string_view name;
  bool keys_known;  // the schema lists the block's keys; otherwise its contents are not looked at
  Trigger trigger;
  std::string_view what;
};

constexpr std::array<FeatureBlock, 18> kBlocks = {{
    {"torch_autocast", true, Trigger::enabled, "torch autocast"},
    {"elasticity", true, Trigger::enabled, "elastic training"},
    {"sparse_attention", true, Trigger::present, "sparse attention"},
    {"hybrid_engine", true, Trigger::enabled, "the hybrid (RLHF) engine"},
    {"eigenvalue", true, Trigger::enabled, "eigenvalue computation"},
    {"progressive_layer_drop", true, Trigger::enabled, "progressive layer drop"},
    {"nebula", true, Trigger::enabled, "Nebula checkpointing"},
    {"compile", true, Trigger::enabled, "DeepCompile"},  // switch key: deepcompile
    {"timers", true, Trigger::enabled, ""},              // no feature to report
    {"compression_training", false, Trigger::non_empty, "compression training"},
    {"data_efficiency", false, Trigger::enabled, "data efficiency"},
    {"curriculum_learning", false, Trigger::enabled, "curriculum learning"},
    {"autotuning", false, Trigger::enabled, "autotuning"},
    {"quantize_training", false, Trigger::enabled, "quantization-aware training"},
    {"datastates_ckpt", false, Trigger::non_empty, "DataStates checkpointing"},
    {"weight_quantization", false, Trigger::non_empty, "weight quantization"},
    {"tensor_parallel", false, Trigger::non_empty, "tensor parallelism"},
    {"expert_parallel", false, Trigger::enabled, "expert parallelism"},
}};

void parse_feature_block(ObjectReader& top, Context& cx, const FeatureBlock& b) {
  const Json* j = top.get_object(b.name);
  if (j == nullptr) return;
  bool on = false;
  if (b.keys_known) {
    ObjectReader r(*j, std::string(b.name), b.name, cx.sink);
    if (b.name == "compile") {
      r.get_bool("deepcompile", on);
    } else if (b.name == "timers") {
      if (const Json* t = r.get_object("throughput")) {
        ObjectReader tr(*t, r.path_of("throughput"), "timers.throughput", cx.sink);
        bool flag = true;
        tr.get_bool("enabled", flag);
        tr.get_bool("synchronized", flag);
        tr.finish();
      }
    } else if (b.trigger == Trigger::enabled) {
      r.get_bool("enabled", on);
    }
    r.skip_known();
    r.finish();
  } else if (b.trigger == Trigger::enabled) {
    auto it = j->find("enabled");
    if (it != j->end() && !it->is_boolean()) {
      cx.sink.error(join_path(b.name, "enabled"), fmt::format("expected true or false, got {}", describe(*it)));
    } else {
      on = it != j->end() && it->get<bool>();
    }
  }
  if (b.trigger == Trigger::present) on = true;
  if (b.trigger == Trigger::non_empty) on = !j->empty();
  if (on && !b.what.empty()) {
    const std::string path = b.trigger == Trigger::enabled
                                 ? join_path(b.name, b.name == "compile" ? "deepcompile" : "enabled")
                                 : std::string(b.name);
    cx.sink.not_implemented(
        path, fmt::format("{} is not implemented{}", b.what, b.keys_known ? "" : " (block contents are not checked)"));
  }
  if (b.name == "elasticity" && on) {
    const bool batch_given = top.has("train_batch_size") || top.has("train_micro_batch_size_per_gpu") ||
                             top.has("gradient_accumulation_steps");
    const auto ignore = j->find("ignore_non_elastic_batch_info");
    const bool ignoring = ignore != j->end() && ignore->is_boolean() && ignore->get<bool>();
    if (batch_given && !ignoring) {
      cx.sink.error("elasticity.enabled",
                    "elasticity overwrites the batch keys, which are also given (DeepSpeed "
                    "raises unless ignore_non_elastic_batch_info is true)");
    }
  }
}

void parse_amp(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("amp");
  if (j == nullptr) return;
  auto it = j->find("enabled");
  if (it == j->end()) {
    cx.sink.error("amp.enabled", "required key is missing (DeepSpeed reads it without a default)");
    return;
  }
  if (!it->is_boolean()) {
    cx.sink.error("amp.enabled", fmt::format("expected true or false, got {}", describe(*it)));
    return;
  }
  if (!it->get<bool>()) return;
  if (cx.config.zero.stage > 0) {
    cx.sink.error("amp.enabled", "Apex AMP is incompatible with ZeRO (DeepSpeed asserts)");
  } else if (cx.config.fp16.enabled || cx.config.bf16.enabled) {
    cx.sink.error("amp.enabled", "Apex AMP cannot be combined with fp16 or bf16 (DeepSpeed asserts)");
  } else {
    cx.sink.not_implemented("amp.enabled", "Apex AMP is not implemented (its other keys are not checked)");
  }
}

void parse_pipeline(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("pipeline");
  if (j == nullptr) return;
  ObjectReader r(*j, "pipeline", "pipeline", cx.sink);
  if (const Json* stages = r.raw("stages")) {
    if (stages->is_number_integer() && stages->get<std::int64_t>() > 1) {
      r.not_implemented("stages", "pipeline parallelism is not implemented");
    } else if (!(stages->is_number_integer() && stages->get<std::int64_t>() >= 1) && !r.is_auto("stages")) {
      r.error("stages", fmt::format("expected \"auto\" or an integer >= 1, got {}", describe(*stages)));
    }
  }
  r.skip_known();
  r.finish();
}

}  // namespace

void parse_other_ds_blocks(ObjectReader& top, Context& cx) {
  parse_amp(top, cx);
  parse_pipeline(top, cx);
  for (const auto& b : kBlocks) parse_feature_block(top, cx, b);
}

}  // namespace zero3::config::detail
