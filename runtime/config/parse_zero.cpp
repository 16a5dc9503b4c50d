// zero_optimization (with offload_param / offload_optimizer and the deprecated spellings) and aio: DeepSpeed's
// https://www.deepspeed.ai/docs/config-json/ ("ZeRO Optimizations for FP16 Training", "Parameter offloading",
// "Optimizer offloading", "Asynchronous I/O") and deepspeed/runtime/zero/config.py, offload_config.py. zero3
// runs stage 3 with CPU offload and NVMe offload of the optimizer; NVMe offload of params, ZeRO++, MiCS, ZenFlow and
// the other stage-3 variants are accepted and reported as not implemented when switched on.
#include <fmt/format.h>

#include "parse_blocks.hpp"

namespace zero3::config::detail {

namespace {

constexpr std::string_view kZero = "zero_optimization";

void parse_offload(ObjectReader& zr, Context& cx, std::string_view key, OffloadConfig& o, bool optimizer) {
  const Json* j = zr.get_object(key, /*null_ok=*/true);
  if (j == nullptr) return;
  ObjectReader r(*j, zr.path_of(key),
                 optimizer ? "zero_optimization.offload_optimizer" : "zero_optimization.offload_param", cx.sink);
  std::string device;
  r.get_choice("device", device, {"none", "cpu", "nvme"});
  o.device = device == "cpu" ? OffloadDevice::cpu : device == "nvme" ? OffloadDevice::nvme : OffloadDevice::none;
  r.get_optional_string("nvme_path", o.nvme_path);
  r.get_bool("pin_memory", o.pin_memory);
  r.get_int("buffer_count", o.buffer_count);
  if (optimizer) {
    r.get_bool("pipeline_read", o.pipeline_read);
    r.get_bool("pipeline_write", o.pipeline_write);
    r.get_bool("fast_init", o.fast_init);
    r.get_number("ratio", o.ratio);
    o.super_offload = r.not_implemented_if_true("super_offload", "SuperOffload is not implemented");
    r.get_number("cpuadam_cores_perc", o.cpuadam_cores_perc);
  } else {
    r.get_int("buffer_size", o.buffer_size);
    r.get_int("max_in_cpu", o.max_in_cpu);
  }
  if (o.device == OffloadDevice::nvme) {
    if (!o.nvme_path || o.nvme_path->empty()) r.error("nvme_path", "required when device is \"nvme\"");
    if (optimizer && !(o.pipeline_read && o.pipeline_write)) {
      r.sink().lint(r.path_of("device"),
                    "NVMe offload with pipeline_read or pipeline_write false (DeepSpeed's default): the step waits "
                    "for each slice's read or write; set both true to overlap the disk with the CPU step");
    }
  } else if (optimizer && (o.pipeline_read || o.pipeline_write)) {
    r.sink().lint(r.path_of(o.pipeline_read ? "pipeline_read" : "pipeline_write"),
                  "ignored: pipelining applies to device \"nvme\" only");
  }
  r.finish();
}

// A deprecated boolean that stands for an offload block (cpu_offload -> offload_optimizer {device: cpu}).
void deprecated_offload_flag(ObjectReader& r, std::string_view old_key, std::string_view new_key, OffloadConfig& o) {
  const Json* j = r.raw(old_key);
  if (j == nullptr || j->is_null()) return;
  if (!j->is_boolean()) {
    r.error(old_key, fmt::format("expected true, false or null, got {}", describe(*j)));
    return;
  }
  if (r.has(new_key)) {
    r.error(old_key, fmt::format("deprecated '{}' and its replacement '{}' are both given; keep '{}'", old_key, new_key,
                                 new_key));
    return;
  }
  r.warning(old_key, fmt::format("deprecated; use \"{}\": {{\"device\": \"cpu\"}}{}", new_key,
                                 j->get<bool>() ? " (mapped)" : ""));
  if (j->get<bool>()) o.device = OffloadDevice::cpu;
}

// An "auto" bucket size from zero3.model.hidden_size (the HF Trainer formulas), else the DeepSpeed default.
void auto_from_hidden(ObjectReader& r, Context& cx, std::string_view key, std::int64_t& out, std::string_view formula,
                      std::int64_t (*compute)(std::int64_t)) {
  if (cx.config.zero3.model) {
    const std::int64_t h = cx.config.zero3.model->hidden_size;
    out = compute(h);
    r.sink().resolved(r.path_of(key), json_text(out),
                      fmt::format("\"auto\": {} with zero3.model.hidden_size = {}", formula, h));
  } else {
    r.sink().resolved(r.path_of(key), json_text(out),
                      "\"auto\": the DeepSpeed default (no zero3.model.hidden_size to compute it from)");
  }
}

void parse_stage3_keys(ObjectReader& r, Context& cx, ZeroConfig& z) {
  auto key = r.pick("stage3_prefetch_bucket_size", "prefetch_bucket_size");
  if (r.get_int(key, z.prefetch_bucket_size) == Got::automatic) {
    auto_from_hidden(r, cx, key, z.prefetch_bucket_size, "int(0.9 * h * h)",
                     [](std::int64_t h) { return static_cast<std::int64_t>(0.9 * static_cast<double>(h * h)); });
  }
  key = r.pick("stage3_param_persistence_threshold", "param_persistence_threshold");
  if (r.get_int(key, z.param_persistence_threshold) == Got::automatic) {
    auto_from_hidden(r, cx, key, z.param_persistence_threshold, "10 * h", [](std::int64_t h) { return 10 * h; });
  }
  r.get_int(r.pick("stage3_model_persistence_threshold", "model_persistence_threshold"), z.model_persistence_threshold);
  r.get_int(r.pick("stage3_max_live_parameters", "max_live_parameters"), z.max_live_parameters);
  r.get_int(r.pick("stage3_max_reuse_distance", "max_reuse_distance"), z.max_reuse_distance);

  key = r.pick("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save");
  const bool new_given = r.has(key);
  r.get_bool(key, z.gather_16bit_weights_on_model_save);
  constexpr std::string_view kOld = "stage3_gather_fp16_weights_on_model_save";
  if (r.has(kOld)) {
    bool old = false;
    if (r.get_bool(kOld, old) == Got::value) {
      if (new_given) {
        r.error(kOld,
                fmt::format("deprecated '{}' and its replacement '{}' are both given; keep '{}'", kOld, key, key));
      } else {
        r.warning(kOld, "deprecated; use stage3_gather_16bit_weights_on_model_save (value mapped)");
        z.gather_16bit_weights_on_model_save = old;
      }
    }
  }
  key = r.pick("stage3_module_granularity_threshold", "module_granularity_threshold");
  if (r.get_int(key, z.module_granularity_threshold) == Got::value && z.module_granularity_threshold > 0) {
    r.not_implemented(key, "fetching modules as one unit by granularity is not implemented");
  }
  key = r.pick("stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params");
  z.use_all_reduce_for_fetch_params =
      r.not_implemented_if_true(key, "fetching parameters by all-reduce is not implemented");
  key = r.pick("stage3_allgather_sequential", "allgather_sequential");
  z.allgather_sequential = r.not_implemented_if_true(key, "sequential unbucketed all-gather is not implemented");
}

void parse_zero_variants(ObjectReader& r, Context& cx, ZeroConfig& z) {
  if (r.get_int("zero_hpz_partition_size", z.zero_hpz_partition_size) == Got::value && z.zero_hpz_partition_size > 1) {
    r.not_implemented("zero_hpz_partition_size", "ZeRO++ hierarchical partitioning (hpZ) is not implemented");
  }
  z.zero_quantized_weights =
      r.not_implemented_if_true("zero_quantized_weights", "ZeRO++ quantized weights (qwZ) are not implemented");
  z.zero_quantized_nontrainable_weights = r.not_implemented_if_true(
      "zero_quantized_nontrainable_weights", "quantized non-trainable weights are not implemented");
  z.zero_quantized_gradients =
      r.not_implemented_if_true("zero_quantized_gradients", "ZeRO++ quantized gradients (qgZ) are not implemented");
  reject_removed_zero_keys(r);
  r.not_implemented_if_true("pipeline_loading_checkpoint", "pipelined checkpoint loading is not implemented");
  if (const Json* zen = r.get_object("zenflow", /*null_ok=*/true)) {
    ObjectReader zr(*zen, r.path_of("zenflow"), "zero_optimization.zenflow", cx.sink);
    zr.skip_known();
    zr.finish();
    r.not_implemented("zenflow", "ZenFlow is not implemented");
  }
  if (const Json* leaf = r.get_object("leaf_module")) {
    ObjectReader lr(*leaf, r.path_of("leaf_module"), "zero_optimization.leaf_module", cx.sink);
    for (std::string_view k : {"classes", "names", "name_suffixes"}) {
      const Json* v = lr.raw(k);
      if (v == nullptr || v->is_string()) continue;
      const bool strings =
          v->is_array() && std::all_of(v->begin(), v->end(), [](const Json& e) { return e.is_string(); });
      if (!strings) lr.error(k, fmt::format("expected a string or a list of strings, got {}", describe(*v)));
    }
    lr.finish();
  }
  bool ignored = false;
  for (std::string_view k :
       {"use_multi_rank_bucket_allreduce", "allgather_partitions", "round_robin_gradients", "ignore_unused_parameters",
        "memory_efficient_linear", "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
        "save_muon_momentum_buffer_in_memory", "parameter_alignment"}) {
    r.get_bool(k, ignored);
  }
  bool grad_norm{};
  if (r.get_bool("compute_grad_norm", grad_norm) == Got::value && !grad_norm && z.stage != 1 && z.stage != 2) {
    r.error("compute_grad_norm", "false is supported only with ZeRO stage 1 or 2 (DeepSpeed's validator rejects it)");
  }
}

}  // namespace

void parse_zero_optimization(ObjectReader& top, Context& cx) {
  ZeroConfig& z = cx.config.zero;
  const Json* j = top.raw("zero_optimization");
  if (j != nullptr && j->is_boolean()) {
    z.stage = j->get<bool>() ? 1 : 0;
    top.warning("zero_optimization",
                fmt::format("deprecated boolean form: means stage {}; write {{\"stage\": 3}}", z.stage));
  } else if (j != nullptr && !j->is_object()) {
    top.error("zero_optimization",
              fmt::format("expected an object, got {}{}", describe(*j),
                          j->is_null() ? " (DeepSpeed fails on null; remove the key or use {})" : ""));
    return;
  }
  if (j != nullptr && j->is_object()) {
    ObjectReader r(*j, std::string(kZero), kZero, cx.sink);
    std::int64_t stage = 0;
    if (r.get_int("stage", stage) == Got::automatic) {
      stage = 3;
      r.sink().resolved(r.path_of("stage"), "3", "\"auto\": zero3 runs ZeRO stage 3 (DeepSpeed would use 0)");
    }
    z.stage = static_cast<int>(stage);
    r.get_bool("contiguous_gradients", z.contiguous_gradients);
    z.overlap_comm = z.stage == 3;
    if (const Json* oc = r.raw("overlap_comm"); oc != nullptr && !oc->is_null()) {
      if (oc->is_boolean()) {
        z.overlap_comm = oc->get<bool>();
      } else if (r.is_auto("overlap_comm")) {
        r.sink().resolved(r.path_of("overlap_comm"), json_text(z.overlap_comm), "\"auto\": DeepSpeed's stage == 3");
      } else {
        r.get_bool("overlap_comm", z.overlap_comm);  // pydantic's conversions ("true"), else a type error
      }
    }
    if (r.get_bool("reduce_scatter", z.reduce_scatter) == Got::value && !z.reduce_scatter && z.stage == 3) {
      r.not_implemented("reduce_scatter", "false (all-reduce of gradients) is not implemented; zero3 reduce-scatters");
    }
    if (r.get_int("reduce_bucket_size", z.reduce_bucket_size) == Got::automatic) {
      auto_from_hidden(r, cx, "reduce_bucket_size", z.reduce_bucket_size, "h * h",
                       [](std::int64_t h) { return h * h; });
    }
    r.get_int("allgather_bucket_size", z.allgather_bucket_size);
    r.get_bool("load_from_fp32_weights", z.load_from_fp32_weights);
    bool elastic = false;
    if (r.get_bool("elastic_checkpoint", elastic) == Got::value && elastic && z.stage == 3) {
      r.warning("elastic_checkpoint", "ZeRO-3 elastic checkpointing is deprecated in DeepSpeed; ignored");
    }
    bool legacy = false;
    if (r.get_bool("legacy_stage1", legacy) == Got::value && legacy) {
      r.error("legacy_stage1", "true is not supported (DeepSpeed raises: the legacy stage 1 was removed)");
    }
    r.get_int("sub_group_size", z.sub_group_size);
    parse_stage3_keys(r, cx, z);
    parse_offload(r, cx, "offload_param", z.offload_param, /*optimizer=*/false);
    parse_offload(r, cx, "offload_optimizer", z.offload_optimizer, /*optimizer=*/true);
    deprecated_offload_flag(r, "cpu_offload", "offload_optimizer", z.offload_optimizer);
    deprecated_offload_flag(r, "cpu_offload_param", "offload_param", z.offload_param);
    if (const Json* pin = r.raw("cpu_offload_use_pin_memory"); pin != nullptr && !pin->is_null()) {
      if (!pin->is_boolean()) {
        r.error("cpu_offload_use_pin_memory", fmt::format("expected true, false or null, got {}", describe(*pin)));
      } else {
        r.warning("cpu_offload_use_pin_memory", "deprecated and has no effect; use offload_*.pin_memory");
      }
    }
    parse_zero_variants(r, cx, z);
    if (z.offload_optimizer.ratio < 1.0 && z.stage != 3) {
      cx.sink.error(r.path_of("offload_optimizer") + ".ratio",
                    "partial offloading (ratio < 1) needs stage 3 (DeepSpeed asserts)");
    }
    if (z.offload_param.enabled() && z.stage != 3) {
      cx.sink.warning(r.path_of("offload_param"), "ignored below stage 3 (as in DeepSpeed)");
    }
    if (z.offload_param.device == OffloadDevice::nvme &&
        (z.offload_optimizer.device == OffloadDevice::none || z.offload_optimizer.ratio < 1.0)) {
      cx.sink.not_implemented(r.path_of("offload_param") + ".device",
                              "\"nvme\" with the optimizer step on the device: NVMe offload of params needs "
                              "offload_optimizer.device \"cpu\" or \"nvme\" (ratio 1)");
    }
    r.finish();
  }
  if (z.stage != 3) {
    cx.sink.not_implemented("zero_optimization.stage",
                            fmt::format("stage {}{}: valid DeepSpeed, but not runnable: zero3 trains with ZeRO stage 3 "
                                        "only (set \"zero_optimization\": {{\"stage\": 3}})",
                                        z.stage, j == nullptr ? " (no zero_optimization block)" : ""));
  }
}

void parse_aio(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("aio", /*null_ok=*/true);
  if (j == nullptr) return;
  ObjectReader r(*j, "aio", "aio", cx.sink);
  AioConfig& a = cx.config.aio;
  r.get_int("block_size", a.block_size);
  r.get_int("queue_depth", a.queue_depth);
  const bool replacement = r.has("intra_op_parallelism");
  r.get_int("intra_op_parallelism", a.intra_op_parallelism);
  if (r.has("thread_count")) {
    std::int64_t threads = 1;
    if (r.get_int("thread_count", threads) == Got::value) {
      // DeepSpeed ignores the key since v0.16.4, so both are lint: it is what DeepSpeed would drop.
      if (replacement) {
        r.sink().lint(r.path_of("thread_count"),
                      "ignored: DeepSpeed renamed it intra_op_parallelism in v0.16.4 and ignores it, and "
                      "intra_op_parallelism is given; delete it");
      } else {
        a.intra_op_parallelism = threads;
        r.sink().lint(r.path_of("thread_count"),
                      "renamed intra_op_parallelism in DeepSpeed v0.16.4, which now ignores it; zero3 "
                      "uses it as intra_op_parallelism");
      }
    }
  }
  r.get_bool("single_submit", a.single_submit);
  r.get_bool("overlap_events", a.overlap_events);
  a.use_gds = r.not_implemented_if_true("use_gds", "GPUDirect Storage is not implemented");
  r.finish();
}

}  // namespace zero3::config::detail
