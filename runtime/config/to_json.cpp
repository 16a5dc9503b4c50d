// The resolved Config written back as DeepSpeed JSON: every field explicit, DeepSpeed's key names (the
// stage3_* spellings), only the params the chosen optimizer and scheduler types take, and the "zero3"
// block. Feeding the output to the parser gives the same Config. Also the enum spellings.
#include <fmt/format.h>

#include "json_reader.hpp"
#include "zero3/config/model_types.hpp"
#include "zero3/config/parse.hpp"

namespace zero3::config {

std::string_view to_string(OffloadDevice v) {
  switch (v) {
    case OffloadDevice::none:
      return "none";
    case OffloadDevice::cpu:
      return "cpu";
    case OffloadDevice::nvme:
      return "nvme";
  }
  return "?";
}
std::string_view to_string(OptimizerType v) {
  switch (v) {
    case OptimizerType::adam:
      return "Adam";
    case OptimizerType::adamw:
      return "AdamW";
    case OptimizerType::lion:
      return "Lion";
    case OptimizerType::adagrad:
      return "Adagrad";
  }
  return "?";
}
std::string_view to_string(SchedulerType v) {
  switch (v) {
    case SchedulerType::warmup_lr:
      return "WarmupLR";
    case SchedulerType::warmup_decay_lr:
      return "WarmupDecayLR";
    case SchedulerType::warmup_cosine_lr:
      return "WarmupCosineLR";
    case SchedulerType::one_cycle:
      return "OneCycle";
    case SchedulerType::lr_range_test:
      return "LRRangeTest";
  }
  return "?";
}
std::string_view to_string(WarmupType v) {
  return v == WarmupType::linear ? "linear" : "log";
}
std::string_view to_string(TagValidation v) {
  switch (v) {
    case TagValidation::ignore:
      return "Ignore";
    case TagValidation::warn:
      return "Warn";
    case TagValidation::fail:
      return "Fail";
  }
  return "?";
}
std::string_view to_string(CommBackend v) {
  switch (v) {
    case CommBackend::automatic:
      return "auto";
    case CommBackend::mpi:
      return "mpi";
    case CommBackend::nccl:
      return "nccl";
  }
  return "?";
}
std::string_view to_string(AccumulationPolicy v) {
  return v == AccumulationPolicy::memory ? "memory" : "fixed";
}

std::string_view to_string(NonfinitePolicy v) {
  return v == NonfinitePolicy::abort ? "abort" : "skip";
}

std::string_view to_string(SpikeDetector v) {
  return v == SpikeDetector::ratio ? "ratio" : "zscore";
}

std::string_view to_string(SpikeAction v) {
  switch (v) {
    case SpikeAction::skip:
      return "skip";
    case SpikeAction::reset_moments:
      return "reset_moments";
    case SpikeAction::rollback:
      return "rollback";
  }
  return "?";
}

std::string_view to_string(DeviceChoice v) {
  switch (v) {
    case DeviceChoice::automatic:
      return "auto";
    case DeviceChoice::host:
      return "host";
    case DeviceChoice::cuda:
      return "cuda";
  }
  return "?";
}

namespace {

using detail::Json;

Json str(std::string_view s) {
  return Json(std::string(s));
}
template <typename T>
Json optional(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}
Json optional_dtype(const std::optional<DType>& t) {
  return t ? str(dtype_name(*t)) : Json(nullptr);
}

Json optimizer_json(const OptimizerConfig& o) {
  Json p = Json::object();
  p["lr"] = o.lr;
  switch (o.type) {
    case OptimizerType::adam:
    case OptimizerType::adamw:
      p["betas"] = {o.betas[0], o.betas[1]};
      p["eps"] = o.eps;
      p["weight_decay"] = o.weight_decay;
      p["bias_correction"] = o.bias_correction;
      p["adam_w_mode"] = o.decoupled_weight_decay;
      p["torch_adam"] = o.torch_adam;
      p["fp32_optimizer_states"] = o.fp32_optimizer_states;
      p["set_grad_none"] = o.set_grad_none;
      break;
    case OptimizerType::lion:
      p["betas"] = {o.betas[0], o.betas[1]};
      p["weight_decay"] = o.weight_decay;
      p["fp32_optimizer_states"] = o.fp32_optimizer_states;
      p["set_grad_none"] = o.set_grad_none;
      break;
    case OptimizerType::adagrad:
      p["eps"] = o.eps;
      p["weight_decay"] = o.weight_decay;
      p["fp32_optimizer_states"] = o.fp32_optimizer_states;
      break;
  }
  Json j = Json::object();
  j["type"] = str(to_string(o.type));
  j["params"] = std::move(p);
  j["legacy_fusion"] = o.legacy_fusion;
  return j;
}

Json scheduler_json(const SchedulerConfig& s) {
  Json p = Json::object();
  switch (s.type) {
    case SchedulerType::warmup_decay_lr:
      p["total_num_steps"] = s.total_num_steps_from_run ? Json("auto") : Json(s.total_num_steps);
      [[fallthrough]];
    case SchedulerType::warmup_lr:
      p["warmup_min_lr"] = s.warmup_min_lr;
      p["warmup_max_lr"] = s.warmup_max_lr;
      p["warmup_num_steps"] = s.warmup_num_steps;
      p["warmup_type"] = str(to_string(s.warmup_type));
      break;
    case SchedulerType::warmup_cosine_lr:
      p["total_num_steps"] = s.total_num_steps_from_run ? Json("auto") : Json(s.total_num_steps);
      p["warmup_min_ratio"] = s.warmup_min_ratio;
      p["warmup_num_steps"] = s.warmup_num_steps;
      p["cos_min_ratio"] = s.cos_min_ratio;
      p["warmup_type"] = str(to_string(s.warmup_type));
      break;
    case SchedulerType::one_cycle:
      p["cycle_min_lr"] = s.cycle_min_lr;
      p["cycle_max_lr"] = s.cycle_max_lr;
      p["decay_lr_rate"] = s.decay_lr_rate;
      p["cycle_first_step_size"] = s.cycle_first_step_size;
      p["cycle_second_step_size"] = s.cycle_second_step_size;
      p["cycle_first_stair_count"] = s.cycle_first_stair_count;
      p["cycle_second_stair_count"] = s.cycle_second_stair_count;
      p["decay_step_size"] = s.decay_step_size;
      p["cycle_momentum"] = s.cycle_momentum;
      p["cycle_min_mom"] = s.cycle_min_mom;
      p["cycle_max_mom"] = s.cycle_max_mom;
      p["decay_mom_rate"] = s.decay_mom_rate;
      break;
    case SchedulerType::lr_range_test:
      p["lr_range_test_min_lr"] = s.lr_range_test_min_lr;
      p["lr_range_test_step_size"] = s.lr_range_test_step_size;
      p["lr_range_test_step_rate"] = s.lr_range_test_step_rate;
      p["lr_range_test_staircase"] = s.lr_range_test_staircase;
      break;
  }
  p["last_batch_iteration"] = s.last_batch_iteration;
  Json j = Json::object();
  j["type"] = str(to_string(s.type));
  j["params"] = std::move(p);
  return j;
}

Json offload_json(const OffloadConfig& o, bool optimizer) {
  Json j = Json::object();
  j["device"] = str(to_string(o.device));
  j["nvme_path"] = optional(o.nvme_path);
  j["pin_memory"] = o.pin_memory;
  j["buffer_count"] = o.buffer_count;
  if (optimizer) {
    j["pipeline_read"] = o.pipeline_read;
    j["pipeline_write"] = o.pipeline_write;
    j["fast_init"] = o.fast_init;
    j["ratio"] = o.ratio;
    j["super_offload"] = o.super_offload;
    j["cpuadam_cores_perc"] = o.cpuadam_cores_perc;
  } else {
    j["buffer_size"] = o.buffer_size;
    j["max_in_cpu"] = o.max_in_cpu;
  }
  return j;
}

Json zero_json(const ZeroConfig& z) {
  Json j = Json::object();
  j["stage"] = z.stage;
  j["contiguous_gradients"] = z.contiguous_gradients;
  j["overlap_comm"] = z.overlap_comm;
  j["reduce_scatter"] = z.reduce_scatter;
  j["reduce_bucket_size"] = z.reduce_bucket_size;
  j["allgather_bucket_size"] = z.allgather_bucket_size;
  j["load_from_fp32_weights"] = z.load_from_fp32_weights;
  j["sub_group_size"] = z.sub_group_size;
  j["stage3_prefetch_bucket_size"] = z.prefetch_bucket_size;
  j["stage3_param_persistence_threshold"] = z.param_persistence_threshold;
  j["stage3_model_persistence_threshold"] = z.model_persistence_threshold;
  j["stage3_max_live_parameters"] = z.max_live_parameters;
  j["stage3_max_reuse_distance"] = z.max_reuse_distance;
  j["stage3_gather_16bit_weights_on_model_save"] = z.gather_16bit_weights_on_model_save;
  j["stage3_module_granularity_threshold"] = z.module_granularity_threshold;
  j["stage3_use_all_reduce_for_fetch_params"] = z.use_all_reduce_for_fetch_params;
  j["stage3_allgather_sequential"] = z.allgather_sequential;
  j["offload_param"] = offload_json(z.offload_param, false);
  j["offload_optimizer"] = offload_json(z.offload_optimizer, true);
  j["zero_hpz_partition_size"] = z.zero_hpz_partition_size;
  j["zero_quantized_weights"] = z.zero_quantized_weights;
  j["zero_quantized_nontrainable_weights"] = z.zero_quantized_nontrainable_weights;
  j["zero_quantized_gradients"] = z.zero_quantized_gradients;
  return j;
}

Json monitor_json(const MonitorConfig& m) {
  Json j = Json::object();
  j["enabled"] = m.enabled;
  j["output_path"] = m.output_path;
  j["job_name"] = m.job_name;
  return j;
}

Json zero3_json(const Zero3Settings& s) {
  Json j = Json::object();
  j["seed"] = s.seed;
  j["strict"] = s.strict;
  j["single_rank_in_place"] = s.single_rank_in_place;
  j["pinned_memory_budget_gb"] = s.pinned_memory_budget_gb ? Json(*s.pinned_memory_budget_gb) : str("auto");
  if (s.model) {
    Json m = Json::object();
    m["type"] = str(to_string(s.model->type));
    m["layers"] = s.model->layers;
    m["hidden_size"] = s.model->hidden_size;
    m["heads"] = s.model->heads;
    m["vocab_size"] = s.model->vocab_size;
    m["seq_len"] = s.model->seq_len;
    if (!s.model->init_from.empty()) m["init_from"] = s.model->init_from;
    m["activation_checkpointing"] = str(to_string(s.model->activation_checkpointing));
    if (model_type_spec(s.model->type).decoder_options) {
      m["kv_heads"] = s.model->kv_heads;
      m["head_dim"] = s.model->head_dim;
      m["intermediate_size"] = s.model->intermediate_size;
      m["rope_theta"] = s.model->rope_theta;
      m["rms_norm_eps"] = s.model->rms_norm_eps;
      m["qkv_bias"] = s.model->qkv_bias;
      m["o_bias"] = s.model->o_bias;
      m["tie_word_embeddings"] = s.model->tie_word_embeddings;
    }
    j["model"] = std::move(m);
  }
  j["data"] = {
      {"source", s.data.source}, {"markov_order", s.data.markov_order}, {"heldout_fraction", s.data.heldout_fraction}};
  if (s.run) j["run"] = {{"steps", s.run->steps}, {"log_interval", s.run->log_interval}};
  j["comm"] = {{"timeout_s", s.comm.timeout_s},
               {"first_step_timeout_s", s.comm.first_step_timeout()},
               {"flight_records", s.comm.flight_records},
               {"desync_check", s.comm.desync_check},
               {"backend", str(to_string(s.comm.backend))}};
  j["alerts"] = {{"command", s.alerts.command}, {"level", s.alerts.errors_only ? "error" : "warning"}};
  j["nonfinite"] = {{"policy", str(to_string(s.nonfinite.policy))}, {"max_consecutive", s.nonfinite.max_consecutive}};
  const SpikeSettings& sp = s.spike;
  j["spike"] = {{"enabled", sp.enabled},
                {"detector", str(to_string(sp.detector))},
                {"threshold", sp.threshold},
                {"window", sp.window},
                {"warmup_steps", sp.warmup_steps},
                {"action", str(to_string(sp.action))},
                {"rewarm_steps", sp.rewarm_steps},
                {"skip_batches", sp.skip_batches},
                {"max_consecutive", sp.max_consecutive}};
  const AccumulationSettings& ac = s.accumulation;
  j["accumulation"] = {
      {"policy", str(to_string(ac.policy))}, {"high", ac.high}, {"low", ac.low}, {"rounds", ac.rounds}};
  j["device"] = str(to_string(s.device));
  return j;
}

}  // namespace

std::string to_json(const Config& c, int indent) {
  Json j = Json::object();
  j["train_batch_size"] = c.batch.train_batch_size;
  j["train_micro_batch_size_per_gpu"] = c.batch.train_micro_batch_size_per_gpu;
  j["gradient_accumulation_steps"] = c.batch.gradient_accumulation_steps;
  j["gradient_clipping"] = c.gradient_clipping;
  j["steps_per_print"] = optional(c.steps_per_print);
  j["wall_clock_breakdown"] = c.wall_clock_breakdown;
  j["memory_breakdown"] = c.memory_breakdown;
  j["communication_data_type"] = str(dtype_name(c.communication_data_type));
  j["prescale_gradients"] = c.prescale_gradients;
  j["gradient_predivide_factor"] = c.gradient_predivide_factor;
  j["zero_allow_untested_optimizer"] = c.zero_allow_untested_optimizer;
  if (c.optimizer) j["optimizer"] = optimizer_json(*c.optimizer);
  if (c.scheduler) j["scheduler"] = scheduler_json(*c.scheduler);
  j["fp16"] = {{"enabled", c.fp16.enabled},
               {"auto_cast", c.fp16.auto_cast},
               {"loss_scale", c.fp16.loss_scale},
               {"initial_scale_power", c.fp16.initial_scale_power},
               {"loss_scale_window", c.fp16.loss_scale_window},
               {"hysteresis", c.fp16.hysteresis},
               {"consecutive_hysteresis", c.fp16.consecutive_hysteresis},
               {"min_loss_scale", c.fp16.min_loss_scale},
               {"fp16_master_weights_and_grads", c.fp16.fp16_master_weights_and_grads}};
  j["bf16"] = {{"enabled", c.bf16.enabled},
               {"immediate_grad_update", c.bf16.immediate_grad_update},
               {"check_grad_overflow", c.bf16.check_grad_overflow},
               {"bf16_master_weights_and_grads", c.bf16.bf16_master_weights_and_grads},
               {"bf16_optimizer_states", c.bf16.bf16_optimizer_states}};
  j["zero_optimization"] = zero_json(c.zero);
  j["aio"] = {{"block_size", c.aio.block_size},
              {"queue_depth", c.aio.queue_depth},
              {"intra_op_parallelism", c.aio.intra_op_parallelism},
              {"single_submit", c.aio.single_submit},
              {"overlap_events", c.aio.overlap_events},
              {"use_gds", c.aio.use_gds}};
  j["checkpoint"] = {{"tag_validation", str(to_string(c.checkpoint.tag_validation))},
                     {"load_universal", c.checkpoint.load_universal},
                     {"use_node_local_storage", c.checkpoint.use_node_local_storage}};
  j["data_types"] = {{"grad_accum_dtype", optional_dtype(c.data_types.grad_accum_dtype)},
                     {"param_dtype", optional_dtype(c.data_types.param_dtype)},
                     {"buffer_dtype", optional_dtype(c.data_types.buffer_dtype)}};
  j["csv_monitor"] = monitor_json(c.csv_monitor);
  j["tensorboard"] = monitor_json(c.tensorboard);
  j["wandb"] = {{"enabled", c.wandb.enabled},
                {"group", optional(c.wandb.group)},
                {"team", optional(c.wandb.team)},
                {"project", c.wandb.project}};
  const auto& a = c.activation_checkpointing;
  j["activation_checkpointing"] = {{"partition_activations", a.partition_activations},
                                   {"cpu_checkpointing", a.cpu_checkpointing},
                                   {"contiguous_memory_optimization", a.contiguous_memory_optimization},
                                   {"number_checkpoints", optional(a.number_checkpoints)},
                                   {"synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary},
                                   {"profile", a.profile}};
  const auto& f = c.flops_profiler;
  j["flops_profiler"] = {{"enabled", f.enabled},
                         {"recompute_fwd_factor", f.recompute_fwd_factor},
                         {"profile_step", f.profile_step},
                         {"module_depth", f.module_depth},
                         {"top_modules", f.top_modules},
                         {"detailed", f.detailed},
                         {"output_file", optional(f.output_file)}};
  j["zero3"] = zero3_json(c.zero3);
  return j.dump(indent);
}

}  // namespace zero3::config
