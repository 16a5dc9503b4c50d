// DeepSpeed's other top-level blocks: features zero3 does not implement (pipeline, hybrid engine, tensor
// parallelism, weight quantization, ...). They are accepted so that real DeepSpeed configs load; where zero3
// knows the block's keys they are checked, and a block that switches its feature on is reported as not
// implemented. Keys of features DeepSpeed 0.19.8 removed are rejected in parse_removed.cpp.
#include <fmt/format.h>

#include <array>
#include <optional>
#include <string>

#include "parse_blocks.hpp"
#include "zero3/core/json_integer.hpp"

namespace zero3::config::detail {

namespace {

enum class Trigger : std::uint8_t {
  enabled,    // the block's "enabled" is true
  non_empty,  // the block has at least one key
};

struct FeatureBlock {
  std::string_view name;
  bool keys_known;  // the schema lists the block's keys; otherwise its contents are not looked at
  Trigger trigger;
  std::string_view what;
};

constexpr std::array<FeatureBlock, 8> kBlocks = {{
    {"torch_autocast", true, Trigger::enabled, "torch autocast"},
    {"hybrid_engine", true, Trigger::enabled, "the hybrid (RLHF) engine"},
    {"compile", true, Trigger::enabled, "DeepCompile"},  // switch key: deepcompile
    {"timers", true, Trigger::enabled, ""},              // no feature to report
    {"data_efficiency", false, Trigger::enabled, "data efficiency"},
    {"autotuning", false, Trigger::enabled, "autotuning"},
    {"datastates_ckpt", false, Trigger::non_empty, "DataStates checkpointing"},
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
  if (b.trigger == Trigger::non_empty) on = !j->empty();
  if (on && !b.what.empty()) {
    const std::string path = b.trigger == Trigger::enabled
                                 ? join_path(b.name, b.name == "compile" ? "deepcompile" : "enabled")
                                 : std::string(b.name);
    cx.sink.not_implemented(
        path, fmt::format("{} is not implemented{}", b.what, b.keys_known ? "" : " (block contents are not checked)"));
  }
}

// A key whose value is null or one JSON kind (contents not looked at); anything else is a type error.
void expect_null_or(ObjectReader& r, std::string_view key, bool (Json::*is_kind)() const noexcept,
                    std::string_view expected) {
  const Json* j = r.raw(key);
  if (j != nullptr && !j->is_null() && !((*j).*is_kind)() && !r.is_auto(key)) {
    r.error(key, fmt::format("expected {} or null, got {}", expected, describe(*j)));
  }
}

// tensor_parallel: DeepSpeed's TPTrainingConfig, with TPConfig nested under "tp" (alias "tensor_parallel").
void parse_tensor_parallel(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("tensor_parallel");
  if (j == nullptr) return;
  ObjectReader r(*j, "tensor_parallel", "tensor_parallel", cx.sink);
  std::int64_t autotp = 0;
  if (r.get_int("autotp_size", autotp) == Got::value && autotp > 1) {
    r.not_implemented("autotp_size", "automatic tensor parallelism (AutoTP) is not implemented");
  }
  if (r.raw("dtype") != nullptr && !r.is_auto("dtype")) {
    r.error("dtype",
            "DeepSpeed's TPTrainingConfig takes a torch.dtype object here and rejects every JSON value except "
            "\"auto\"; delete the key");
  }
  bool flag = false;
  r.get_bool("tp_overlap_comm", flag);
  r.get_bool("keep_module_on_host", flag);
  // Both spellings: DeepSpeed names the field (the second) as the extra input, so pick reports it there.
  r.get_bool(r.pick("kernel_inject", "replace_with_kernel_inject"), flag);
  expect_null_or(r, "vocab_parallel_lm_head", &Json::is_boolean, "true, false");
  std::string backend;
  r.get_choice("vocab_parallel_ce_backend", backend, {"torch", "liger"});
  expect_null_or(r, "injection_policy_tuple", &Json::is_array, "an array");
  expect_null_or(r, "partition_config", &Json::is_object, "an object");
  std::optional<std::string> preset;
  r.get_optional_string("preset_model", preset);
  const std::string_view tp_key = r.pick("tp", "tensor_parallel");
  if (const Json* tp = r.get_object(tp_key)) {
    ObjectReader tr(*tp, r.path_of(tp_key), "tensor_parallel.tp", cx.sink);
    std::int64_t size = 1;
    if (tr.get_int("tp_size", size) == Got::value && size > 1) {
      tr.not_implemented("tp_size", "tensor parallelism is not implemented");
    }
    std::int64_t grain = 1;
    tr.get_int("tp_grain_size", grain);
    tr.skip_known();  // mpu, tp_group: Python objects in DeepSpeed
    tr.finish();
  }
  r.finish();
}

// weight_quantization: DeepSpeed's WeightQuantConfig, built whenever the block is present; "enabled"
// defaults to true, so an empty block turns the feature on.
void parse_weight_quantization(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("weight_quantization");
  if (j == nullptr) return;
  ObjectReader r(*j, "weight_quantization", "weight_quantization", cx.sink);
  bool enabled{};
  const Got got = r.get_bool("enabled", enabled);
  std::int64_t n = 0;
  r.get_int("num_bits", n);
  r.get_int("q_groups", n);
  std::string q_type;
  r.get_choice("q_type", q_type, {"symmetric", "asymmetric"});
  r.get_object("quantized_initialization");
  r.get_object("post_init_quant");
  r.finish();
  if (enabled) {
    cx.sink.not_implemented(got == Got::value ? r.path_of("enabled") : r.path(),
                            "weight quantization is not implemented (the block turns it on unless enabled is false)");
  }
}

void parse_pipeline(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("pipeline");
  if (j == nullptr) return;
  ObjectReader r(*j, "pipeline", "pipeline", cx.sink);
  if (const Json* stages = r.raw("stages")) {
    const std::optional<std::int64_t> n = json_integer(*stages);
    if (n && *n > 1) {
      r.not_implemented("stages", "pipeline parallelism is not implemented");
    } else if (!(n && *n >= 1) && !r.is_auto("stages")) {
      r.error("stages", fmt::format("expected \"auto\" or an integer >= 1, got {}", describe(*stages)));
    }
  }
  r.skip_known();
  r.finish();
}

}  // namespace

void parse_other_ds_blocks(ObjectReader& top, Context& cx) {
  parse_pipeline(top, cx);
  parse_tensor_parallel(top, cx);
  parse_weight_quantization(top, cx);
  for (const auto& b : kBlocks) parse_feature_block(top, cx, b);
}

}  // namespace zero3::config::detail
