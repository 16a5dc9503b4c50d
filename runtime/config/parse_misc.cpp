// Top-level scalars, fp16 / bf16 ("FP16 training options", "BFLOAT16 training options"; deepspeed/runtime/
// precision_config.py) and the small blocks zero3 implements or records: checkpoint, data_types, csv_monitor and
// the other monitors, activation_checkpointing, flops_profiler ("Checkpoint options", "Data Type options",
// "Monitoring Module", "Activation Checkpointing", "Flops Profiler"), all on
// https://www.deepspeed.ai/docs/config-json/.
#include <fmt/format.h>

#include <array>

#include "parse_blocks.hpp"

namespace zero3::config::detail {

namespace {

void parse_fp16(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("fp16");
  if (j == nullptr) return;
  ObjectReader r(*j, "fp16", "fp16", cx.sink);
  Fp16Config& f = cx.config.fp16;
  if (r.get_bool("enabled", f.enabled) == Got::automatic) {
    f.enabled = false;
    r.sink().resolved(r.path_of("enabled"), "false", "\"auto\": off (zero3 has no --fp16 flag to take it from)");
  }
  f.auto_cast = r.not_implemented_if_true("auto_cast", "casting forward inputs to fp16 is not implemented");
  r.get_number("loss_scale", f.loss_scale);
  r.get_int("initial_scale_power", f.initial_scale_power);
  r.get_int("loss_scale_window", f.loss_scale_window);
  r.get_int("hysteresis", f.hysteresis);
  r.get_bool("consecutive_hysteresis", f.consecutive_hysteresis);
  r.get_int("min_loss_scale", f.min_loss_scale);
  if (f.dynamic_loss_scale()) {
    if (f.loss_scale_window <= 0) {
      r.error("loss_scale_window", fmt::format("must be > 0 with dynamic loss scaling, got {}", f.loss_scale_window));
    }
    if (f.min_loss_scale <= 0) {
      r.error("min_loss_scale", fmt::format("must be > 0 with dynamic loss scaling, got {}", f.min_loss_scale));
    }
  }
  r.get_bool("fp16_master_weights_and_grads", f.fp16_master_weights_and_grads);
  r.finish();
}

void parse_bf16(ObjectReader& top, Context& cx) {
  std::string_view name = "bf16";
  if (top.has("bfloat16")) {
    if (top.has("bf16")) {
      top.sink().lint("bfloat16",
                      "ignored, as DeepSpeed ignores it when 'bf16' is also given (bfloat16 is bf16's old name); "
                      "keep one");
      top.skip("bfloat16");
    } else {
      top.warning("bfloat16", "deprecated block name; use \"bf16\"");
      name = "bfloat16";
    }
  }
  const Json* j = top.get_object(name);
  if (j == nullptr) return;
  ObjectReader r(*j, std::string(name), "bf16", cx.sink);
  Bf16Config& b = cx.config.bf16;
  if (r.get_bool("enabled", b.enabled) == Got::automatic) {
    b.enabled = false;
    r.sink().resolved(r.path_of("enabled"), "false", "\"auto\": off (zero3 has no --bf16 flag to take it from)");
  }
  r.get_bool("immediate_grad_update", b.immediate_grad_update);
  r.get_bool("check_grad_overflow", b.check_grad_overflow);
  r.get_bool("bf16_master_weights_and_grads", b.bf16_master_weights_and_grads);
  r.get_bool("bf16_optimizer_states", b.bf16_optimizer_states);
  if (b.bf16_optimizer_states && !b.bf16_master_weights_and_grads) {
    r.error("bf16_optimizer_states", "needs bf16_master_weights_and_grads: true (DeepSpeed asserts)");
  }
  r.finish();
}

constexpr std::array<std::string_view, 13> kDtypeSpellings = {
    "fp16",          "float16", "half",     "torch.float16",  "fp32", "float32",   "float",
    "torch.float32", "bf16",    "bfloat16", "torch.bfloat16", "int8", "torch.int8"};

void parse_data_types(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("data_types");
  if (j == nullptr) return;
  ObjectReader r(*j, "data_types", "data_types", cx.sink);
  DataTypesConfig& d = cx.config.data_types;
  for (auto [key, slot] : {std::pair{"grad_accum_dtype", &d.grad_accum_dtype}, std::pair{"param_dtype", &d.param_dtype},
                           std::pair{"buffer_dtype", &d.buffer_dtype}}) {
    std::optional<std::string> s;
    if (r.get_optional_string(key, s) != Got::value) continue;
    if (std::find(kDtypeSpellings.begin(), kDtypeSpellings.end(), *s) == kDtypeSpellings.end()) {
      r.error(key, fmt::format("unknown dtype \"{}\" (fp32/float32/float, fp16/float16/half, bf16/bfloat16, "
                               "optionally with 'torch.')",
                               *s));
    } else if (auto t = parse_dtype(*s)) {
      *slot = *t;
    } else {
      r.error(key, fmt::format("\"{}\" is not a training dtype zero3 supports (fp32, fp16, bf16)", *s));
    }
  }
  const DType model = cx.config.model_dtype();
  if (d.param_dtype && *d.param_dtype != model) {
    r.error("param_dtype", fmt::format("{} conflicts with the model dtype {} set by fp16/bf16 (DeepSpeed asserts)",
                                       dtype_name(*d.param_dtype), dtype_name(model)));
  }
  // Name patterns of buffers kept in fp32 under fp16/bf16 (DeepSpeed 0.19.8); zero3's models have no buffers.
  if (const Json* keep = r.raw("keep_in_fp32_modules"); keep != nullptr && !r.is_auto("keep_in_fp32_modules")) {
    const bool names =
        keep->is_array() && std::all_of(keep->begin(), keep->end(), [](const Json& e) { return e.is_string(); });
    if (!names) {
      r.error("keep_in_fp32_modules",
              fmt::format("must be \"auto\" or a list of name patterns, got {} (DeepSpeed raises)", describe(*keep)));
    }
  }
  r.finish();
}

void parse_checkpoint(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("checkpoint");
  if (j == nullptr) return;
  ObjectReader r(*j, "checkpoint", "checkpoint", cx.sink);
  CheckpointConfig& c = cx.config.checkpoint;
  std::string mode;
  r.get_choice("tag_validation", mode, {"Ignore", "Warn", "Fail"}, /*ignore_case=*/true);
  c.tag_validation = mode == "Ignore" ? TagValidation::ignore
                     : mode == "Fail" ? TagValidation::fail
                                      : TagValidation::warn;
  c.load_universal = r.not_implemented_if_true("load_universal", "loading Universal Checkpoints is not implemented");
  c.use_node_local_storage =
      r.not_implemented_if_true("use_node_local_storage", "node-local checkpoint storage is not implemented");
  bool serialization{};
  r.get_bool("checkpoint_serialization", serialization);
  if (const Json* pw = r.get_object("parallel_write")) {
    ObjectReader pr(*pw, r.path_of("parallel_write"), "checkpoint.parallel_write", cx.sink);
    bool stage = false;
    pr.get_bool("pipeline_stage", stage);
    pr.finish();
  }
  if (const Json* w = r.get_object("writer", /*null_ok=*/true)) {
    ObjectReader wr(*w, r.path_of("writer"), "checkpoint.writer", cx.sink);
    wr.skip_known();
    wr.finish();
    r.not_implemented("writer", "the fast checkpoint writer is not implemented");
  }
  r.finish();
}

void parse_monitor(ObjectReader& top, Context& cx, std::string_view name, MonitorConfig& m, bool implemented) {
  const Json* j = top.get_object(name);
  if (j == nullptr) return;
  ObjectReader r(*j, std::string(name), name, cx.sink);
  r.get_bool("enabled", m.enabled);
  r.get_string("output_path", m.output_path);
  r.get_string("job_name", m.job_name);
  if (m.enabled && !implemented) r.not_implemented("enabled", fmt::format("the {} monitor is not implemented", name));
  r.finish();
}

void parse_monitors(ObjectReader& top, Context& cx) {
  parse_monitor(top, cx, "csv_monitor", cx.config.csv_monitor, true);
  parse_monitor(top, cx, "tensorboard", cx.config.tensorboard, true);
  if (const Json* j = top.get_object("wandb")) {
    ObjectReader r(*j, "wandb", "wandb", cx.sink);
    WandbConfig& w = cx.config.wandb;
    w.enabled = r.not_implemented_if_true("enabled", "the wandb monitor is not implemented");
    r.get_optional_string("group", w.group);
    r.get_optional_string("team", w.team);
    r.get_string("project", w.project);
    r.finish();
  }
  if (const Json* j = top.get_object("comet")) {
    ObjectReader r(*j, "comet", "comet", cx.sink);
    r.not_implemented_if_true("enabled", "the comet monitor is not implemented");
    r.skip_known();
    r.finish();
  }
  if (const Json* j = top.get_object("comms_logger")) {
    ObjectReader r(*j, "comms_logger", "comms_logger", cx.sink);
    if (!r.not_implemented_if_true("enabled", "communication logging is not implemented")) {
      cx.sink.warning("comms_logger",
                      "DeepSpeed turns comms logging on by this block's presence, whatever 'enabled' "
                      "says; zero3 follows 'enabled' (false)");
    }
    r.skip_known();
    r.finish();
  }
}

void parse_profilers(ObjectReader& top, Context& cx) {
  if (const Json* j = top.get_object("activation_checkpointing")) {
    ObjectReader r(*j, "activation_checkpointing", "activation_checkpointing", cx.sink);
    ActivationCheckpointingConfig& a = cx.config.activation_checkpointing;
    // This block tunes DeepSpeed's checkpoint() calls in the model code; zero3's models checkpoint by
    // zero3.model.activation_checkpointing (each unit a checkpoint), which the keys below refine where they
    // apply to data parallelism.
    constexpr std::string_view kModelParallel =
        "partitioning the kept activations across model-parallel ranks is not implemented (zero3 is data-parallel; "
        "its checkpointing: zero3.model.activation_checkpointing)";
    a.partition_activations = r.not_implemented_if_true("partition_activations", kModelParallel);
    r.get_bool("cpu_checkpointing", a.cpu_checkpointing);
    const ModelSettings* model = cx.config.zero3.model ? &*cx.config.zero3.model : nullptr;
    if (a.cpu_checkpointing && model != nullptr && model->activation_checkpointing != Recompute::full) {
      r.error("cpu_checkpointing",
              fmt::format("true keeps the inputs full recomputation checkpoints in host memory, and "
                          "zero3.model.activation_checkpointing is \"{}\" (set it to \"full\")",
                          to_string(model->activation_checkpointing)));
    }
    // DeepSpeed copies partitioned activations into one buffer (and asserts partition_activations).
    a.contiguous_memory_optimization = r.not_implemented_if_true(
        "contiguous_memory_optimization",
        "a contiguous buffer for partitioned activations is not implemented (it needs partition_activations)");
    if (r.get_optional_int("number_checkpoints", a.number_checkpoints) == Got::value) {
      r.not_implemented("number_checkpoints",
                        "sizing contiguous_memory_optimization's buffer is not implemented (it needs "
                        "partition_activations)");
    }
    r.get_bool("synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary);
    a.profile = r.not_implemented_if_true("profile", "timing the checkpointed forwards is not implemented");
    r.finish();
  }
  if (const Json* j = top.get_object("flops_profiler")) {
    ObjectReader r(*j, "flops_profiler", "flops_profiler", cx.sink);
    FlopsProfilerConfig& f = cx.config.flops_profiler;
    f.enabled = r.not_implemented_if_true("enabled", "the flops profiler is not implemented");
    r.get_number("recompute_fwd_factor", f.recompute_fwd_factor);
    r.get_int("profile_step", f.profile_step);
    r.get_int("module_depth", f.module_depth);
    r.get_int("top_modules", f.top_modules);
    r.get_bool("detailed", f.detailed);
    r.get_optional_string("output_file", f.output_file);
    r.finish();
    if (f.enabled) cx.config.wall_clock_breakdown = true;  // as DeepSpeed does
  }
}

}  // namespace

void parse_precision(ObjectReader& top, Context& cx) {
  parse_fp16(top, cx);
  parse_bf16(top, cx);
  if (cx.config.fp16.enabled && cx.config.bf16.enabled) {
    cx.sink.error(top.has("bfloat16") && !top.has("bf16") ? "bfloat16.enabled" : "bf16.enabled",
                  "fp16.enabled and bf16.enabled are both true; choose one");
  }
}

void check_optimizer_storage(ObjectReader& top, Context& cx) {
  const Config& c = cx.config;
  const std::string bf16 = top.has("bfloat16") && !top.has("bf16") ? "bfloat16" : "bf16";
  const bool bf16_master = c.bf16.bf16_master_weights_and_grads;
  const bool fp16_master = c.fp16.fp16_master_weights_and_grads;
  if (!bf16_master && !fp16_master) return;
  const std::string key = bf16_master ? bf16 + ".bf16_master_weights_and_grads" : "fp16.fp16_master_weights_and_grads";
  if (bf16_master && fp16_master) {
    cx.sink.error("fp16.fp16_master_weights_and_grads",
                  "and bf16.bf16_master_weights_and_grads are both true; choose one (DeepSpeed asserts)");
  }
  // The master copy is kept in the job's 16-bit dtype; in an fp32 (or the other 16-bit) job it has none.
  if (bf16_master && !c.bf16.enabled) cx.sink.error(key, fmt::format("needs {}.enabled: true", bf16));
  if (fp16_master && !c.fp16.enabled) cx.sink.error(key, "needs fp16.enabled: true");
  if (c.zero.stage < 1 || c.zero.stage > 3) {
    cx.sink.error(key, fmt::format("needs ZeRO stage 1, 2 or 3, got stage {} (DeepSpeed asserts)", c.zero.stage));
  }
  // DeepSpeed's key says "and_grads"; zero3's kernels accumulate into fp32 (kernels::accumulate), so say so.
  cx.sink.warning(key, fmt::format("master weights stored in {}; gradients are still accumulated in fp32 (zero3's "
                                   "gradient accumulators are always fp32)",
                                   dtype_name(c.master_dtype())));
}

void parse_top_scalars(ObjectReader& top, Context& cx) {
  Config& c = cx.config;
  if (top.get_number("gradient_clipping", c.gradient_clipping) == Got::automatic) {
    c.gradient_clipping = 1.0;
    cx.sink.resolved("gradient_clipping", "1.0", "\"auto\": 1.0, the DeepSpeed default (HF's max_grad_norm default)");
  }
  top.get_optional_int("steps_per_print", c.steps_per_print);
  top.get_bool("wall_clock_breakdown", c.wall_clock_breakdown);
  top.get_bool("memory_breakdown", c.memory_breakdown);
  top.get_bool("prescale_gradients", c.prescale_gradients);
  top.get_number("gradient_predivide_factor", c.gradient_predivide_factor);
  std::string op;
  top.get_choice("gradient_allreduce_op", op, {"mean", "sum"}, /*ignore_case=*/true);
  const bool stage3 = c.zero.stage == 3;
  if (stage3 && c.zero.reduce_scatter) {
    if (c.prescale_gradients) {
      top.error("prescale_gradients", "must be false with ZeRO stage 3 and reduce_scatter (DeepSpeed asserts)");
    }
    if (c.gradient_predivide_factor != 1.0) {
      top.error("gradient_predivide_factor", "must be 1.0 with ZeRO stage 3 and reduce_scatter (DeepSpeed asserts)");
    }
  }
  if (stage3 && op == "sum")
    top.error("gradient_allreduce_op", "\"sum\" is not allowed with ZeRO stage 3 (DeepSpeed raises)");

  c.communication_data_type = c.model_dtype();
  std::optional<std::string> comm;
  if (top.get_optional_string("communication_data_type", comm) == Got::value) {
    std::string s = *comm;
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (s == "fp32") {
      c.communication_data_type = DType::f32;
    } else if (s == "fp16") {
      c.communication_data_type = DType::f16;
    } else if (s == "bf16") {
      c.communication_data_type = DType::bf16;
    } else {
      top.error("communication_data_type", fmt::format("expected \"fp32\", \"fp16\" or \"bf16\", got \"{}\"", *comm));
    }
  }
  std::optional<std::string> seq;
  top.get_optional_string("seq_parallel_communication_data_type", seq);

  bool flag = false;
  for (std::string_view k : {"dump_state", "disable_allgather", "zero_force_ds_cpu_optimizer", "dataloader_drop_last",
                             "use_data_before_expert_parallelism"}) {
    top.get_bool(k, flag);
  }
  top.get_bool("zero_allow_untested_optimizer", c.zero_allow_untested_optimizer);
  top.get_bool("disable_python_gc", flag);
  bool managed{};
  if (top.get_bool("managed_gradient_accumulation", managed) == Got::value && !managed) {
    top.not_implemented("managed_gradient_accumulation", "client-managed accumulation boundaries are not implemented");
  }
  std::optional<std::int64_t> vocab;
  top.get_optional_int("vocabulary_size", vocab);
  std::optional<std::string> log_level;
  top.get_optional_string("log_level", log_level);
  std::int64_t sp = 1;
  if (top.get_int("sequence_parallel_size", sp) == Got::value && sp > 1) {
    top.not_implemented("sequence_parallel_size", "sequence parallelism is not implemented");
  }
  std::int64_t allgather_size = 0;
  top.get_int("allgather_size", allgather_size);
}

void parse_misc_blocks(ObjectReader& top, Context& cx) {
  parse_data_types(top, cx);
  parse_checkpoint(top, cx);
  parse_monitors(top, cx);
  parse_profilers(top, cx);
}

}  // namespace zero3::config::detail
