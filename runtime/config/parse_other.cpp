// DeepSpeed's other top-level blocks: features zero3 does not implement (pipeline, hybrid engine, DeepCompile,
// autotuning, ...; the ones DeepSpeed 0.19.8 removed are rejected in parse_removed.cpp). They are accepted so that real
// DeepSpeed configs load; where zero3 knows the block's keys they are checked, and a block that switches its feature on
// is reported as not implemented.
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

constexpr std::array<FeatureBlock, 10> kBlocks = {{
    {"torch_autocast", true, Trigger::enabled, "torch autocast"},
    {"hybrid_engine", true, Trigger::enabled, "the hybrid (RLHF) engine"},
    {"compile", true, Trigger::enabled, "DeepCompile"},  // switch key: deepcompile
    {"timers", true, Trigger::enabled, ""},              // no feature to report
    {"data_efficiency", false, Trigger::enabled, "data efficiency"},
    {"autotuning", false, Trigger::enabled, "autotuning"},
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
  parse_pipeline(top, cx);
  for (const auto& b : kBlocks) parse_feature_block(top, cx, b);
}

}  // namespace zero3::config::detail
