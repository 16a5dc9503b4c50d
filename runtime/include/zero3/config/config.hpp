// The typed, fully resolved training configuration that zero3 reads from a DeepSpeed JSON file.
// Every field holds its final value: DeepSpeed defaults are filled in, "auto" is resolved and aliases are
// mapped, so the engine and trainer read these structs and never look at JSON. Produced by
// zero3::config::parse_config_* (parse.hpp); plain values, safe to copy and share between threads.
// A field that a key sets takes its default from the key's schema row (schema.hpp: row_int, row_bool, ...), where
// the parser's getters find it too; a literal here is a value no key states (a required key, a resolved one).
// Units: *_size / *_threshold / *_parameters / *_distance fields count tensor elements, never bytes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "zero3/config/schema.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/recompute.hpp"

namespace zero3::config {

enum class OffloadDevice : std::uint8_t { none, cpu, nvme };
enum class OptimizerType : std::uint8_t { adam, adamw, lion, adagrad };
enum class SchedulerType : std::uint8_t { warmup_lr, warmup_decay_lr, warmup_cosine_lr, one_cycle, lr_range_test };
enum class WarmupType : std::uint8_t { log, linear };
enum class TagValidation : std::uint8_t { ignore, warn, fail };
enum class ModelType : std::uint8_t { gpt, mlp, llama };
enum class CommBackend : std::uint8_t { automatic, mpi, nccl };
enum class DeviceChoice : std::uint8_t { automatic, host, cuda };
enum class NonfinitePolicy : std::uint8_t { skip, abort };
enum class SpikeDetector : std::uint8_t { ratio, zscore };
enum class SpikeAction : std::uint8_t { skip, reset_moments, rollback };
enum class AccumulationPolicy : std::uint8_t { fixed, memory };

// The spellings used in the JSON file ("cpu", "AdamW", "WarmupDecayLR", "Warn", "auto", ...).
std::string_view to_string(OffloadDevice v);
std::string_view to_string(OptimizerType v);
std::string_view to_string(SchedulerType v);
std::string_view to_string(WarmupType v);
std::string_view to_string(TagValidation v);
std::string_view to_string(ModelType v);
std::string_view to_string(CommBackend v);
std::string_view to_string(DeviceChoice v);
std::string_view to_string(NonfinitePolicy v);
std::string_view to_string(SpikeDetector v);
std::string_view to_string(SpikeAction v);
std::string_view to_string(AccumulationPolicy v);

// DeepSpeed's batch rule (train_batch_size == micro batch * gradient accumulation * world size) holds here.
struct BatchConfig {
  std::int64_t train_batch_size = 0;                // samples per optimizer step, all ranks together
  std::int64_t train_micro_batch_size_per_gpu = 0;  // samples per rank per forward/backward
  std::int64_t gradient_accumulation_steps = 0;     // micro-steps per optimizer step; the loss is divided by it
  int world_size = 1;                               // data-parallel ranks the rule was checked against
  std::string world_size_source;                    // where world_size came from: "--world-size", "WORLD_SIZE", ...
};

// optimizer block. Fields a type does not use keep their defaults and are not written by to_json.
struct OptimizerConfig {
  OptimizerType type = OptimizerType::adamw;
  double lr = row_number(blocks::adam, "lr");                            // Adagrad default 1e-2
  std::array<double, 2> betas = row_number_pair(blocks::adam, "betas");  // Adam, AdamW, Lion
  double eps = row_number(blocks::adam, "eps");                          // Adam, AdamW; Adagrad default 1e-10
  double weight_decay = row_number(blocks::adam, "weight_decay");
  bool bias_correction = row_bool(blocks::adam, "bias_correction");  // Adam, AdamW
  bool decoupled_weight_decay = true;  // AdamW-style decay: type == AdamW || params.adam_w_mode (DeepSpeed's engine.py)
  bool fp32_optimizer_states = row_bool(blocks::adam, "fp32_optimizer_states");  // CPU optimizers keep moments in fp32
  bool torch_adam = row_bool(blocks::adam, "torch_adam");             // accepted; zero3 has one Adam implementation
  bool set_grad_none = row_bool(blocks::adam, "set_grad_none");       // accepted; no effect in zero3
  bool legacy_fusion = row_bool(blocks::optimizer, "legacy_fusion");  // accepted; no effect in zero3
};

// scheduler block. The fields used by each type are listed next to them; the others keep their defaults.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::warmup_lr;
  std::int64_t last_batch_iteration =
      row_int(blocks::warmup_lr, "last_batch_iteration");  // all types: resume point, -1 = fresh start
  // WarmupLR, WarmupDecayLR
  double warmup_min_lr = row_number(blocks::warmup_lr, "warmup_min_lr");
  double warmup_max_lr =
      row_number(blocks::warmup_decay_lr,
                 "warmup_max_lr");  // WarmupLR: the optimizer's lr when absent; WarmupDecayLR: 0.001 when absent
  // WarmupLR, WarmupDecayLR, WarmupCosineLR
  std::int64_t warmup_num_steps = row_int(blocks::warmup_lr, "warmup_num_steps");
  WarmupType warmup_type = row_enum<WarmupType, WarmupType::linear>(blocks::warmup_lr, "warmup_type");
  // WarmupDecayLR, WarmupCosineLR (required)
  std::int64_t total_num_steps = 0;
  // "auto" parsed without a run length: total_num_steps is the run's step count, set by resolve_run_length.
  bool total_num_steps_from_run = false;
  // WarmupCosineLR (multiplies the optimizer's lr)
  double warmup_min_ratio = row_number(blocks::warmup_cosine_lr, "warmup_min_ratio");
  double cos_min_ratio = row_number(blocks::warmup_cosine_lr, "cos_min_ratio");
  // OneCycle (cycle_min_lr and cycle_max_lr are required)
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = row_number(blocks::one_cycle, "decay_lr_rate");
  std::int64_t cycle_first_step_size = row_int(blocks::one_cycle, "cycle_first_step_size");
  std::int64_t cycle_second_step_size =
      row_int(blocks::one_cycle, "cycle_first_step_size");  // the first size when absent
  std::int64_t cycle_first_stair_count = row_int(blocks::one_cycle, "cycle_first_stair_count");
  std::int64_t cycle_second_stair_count =
      row_int(blocks::one_cycle, "cycle_first_stair_count");  // the first count when absent
  std::int64_t decay_step_size = row_int(blocks::one_cycle, "decay_step_size");
  bool cycle_momentum = row_bool(blocks::one_cycle, "cycle_momentum");
  double cycle_min_mom = row_number(blocks::one_cycle, "cycle_min_mom");
  double cycle_max_mom = row_number(blocks::one_cycle, "cycle_max_mom");
  double decay_mom_rate = row_number(blocks::one_cycle, "decay_mom_rate");
  // LRRangeTest
  double lr_range_test_min_lr = row_number(blocks::lr_range_test, "lr_range_test_min_lr");
  std::int64_t lr_range_test_step_size = row_int(blocks::lr_range_test, "lr_range_test_step_size");
  double lr_range_test_step_rate = row_number(blocks::lr_range_test, "lr_range_test_step_rate");
  bool lr_range_test_staircase = row_bool(blocks::lr_range_test, "lr_range_test_staircase");
};

// fp16 block. loss_scale 0 selects dynamic loss scaling (deepspeed/runtime/fp16/loss_scaler.py).
struct Fp16Config {
  bool enabled = row_bool(blocks::fp16, "enabled");
  bool auto_cast = row_bool(blocks::fp16, "auto_cast");
  double loss_scale = row_number(blocks::fp16, "loss_scale");
  std::int64_t initial_scale_power = row_int(blocks::fp16, "initial_scale_power");  // initial dynamic scale 2**power
  std::int64_t loss_scale_window = row_int(blocks::fp16, "loss_scale_window");
  std::int64_t hysteresis = row_int(blocks::fp16, "hysteresis");
  bool consecutive_hysteresis = row_bool(blocks::fp16, "consecutive_hysteresis");
  std::int64_t min_loss_scale = row_int(blocks::fp16, "min_loss_scale");
  bool fp16_master_weights_and_grads = row_bool(blocks::fp16, "fp16_master_weights_and_grads");

  bool dynamic_loss_scale() const { return loss_scale == 0.0; }
};

// bf16 block (also read from the deprecated name "bfloat16"). No loss scaling in bf16.
struct Bf16Config {
  bool enabled = row_bool(blocks::bf16, "enabled");
  bool immediate_grad_update = row_bool(blocks::bf16, "immediate_grad_update");
  bool check_grad_overflow = row_bool(
      blocks::bf16, "check_grad_overflow");  // DeepSpeed ZeRO-3 never checks bf16 gradients; kept for the record
  bool bf16_master_weights_and_grads = row_bool(blocks::bf16, "bf16_master_weights_and_grads");
  bool bf16_optimizer_states = row_bool(blocks::bf16, "bf16_optimizer_states");
};

// zero_optimization.offload_param / offload_optimizer. Keys that only one of the two has are marked.
struct OffloadConfig {
  OffloadDevice device = row_enum<OffloadDevice, OffloadDevice::nvme>(blocks::offload_param, "device");
  std::optional<std::string> nvme_path;
  bool pin_memory = row_bool(blocks::offload_param, "pin_memory");
  std::int64_t buffer_count = row_int(blocks::offload_param, "buffer_count");  // param: 5, optimizer: 4
  std::int64_t buffer_size =
      row_int(blocks::offload_param, "buffer_size");  // param only: elements per NVMe swap buffer
  std::int64_t max_in_cpu =
      row_int(blocks::offload_param, "max_in_cpu");  // param only: elements kept in CPU memory with nvme
  bool pipeline_read = row_bool(blocks::offload_optimizer, "pipeline_read");    // optimizer only
  bool pipeline_write = row_bool(blocks::offload_optimizer, "pipeline_write");  // optimizer only
  bool fast_init = row_bool(blocks::offload_optimizer, "fast_init");            // optimizer only
  double ratio =
      row_number(blocks::offload_optimizer, "ratio");  // optimizer only: fraction of sub-groups stepped on the CPU
  bool super_offload = row_bool(blocks::offload_optimizer, "super_offload");                // optimizer only
  double cpuadam_cores_perc = row_number(blocks::offload_optimizer, "cpuadam_cores_perc");  // optimizer only

  bool enabled() const { return device != OffloadDevice::none; }
  // offload_optimizer's defaults differ from offload_param's only in buffer_count (4, one per Adam state).
  static OffloadConfig optimizer_defaults() {
    OffloadConfig o;
    o.buffer_count = row_int(blocks::offload_optimizer, "buffer_count");
    return o;
  }
};

// zero_optimization block (deepspeed/runtime/zero/config.py). Names follow the stage-3 spellings without the
// "stage3_" prefix.
struct ZeroConfig {
  int stage = static_cast<int>(row_int(blocks::zero, "stage"));
  bool contiguous_gradients = row_bool(blocks::zero, "contiguous_gradients");
  bool overlap_comm = true;  // DeepSpeed's null default resolved: stage == 3
  bool reduce_scatter = row_bool(blocks::zero, "reduce_scatter");
  std::int64_t reduce_bucket_size = row_int(blocks::zero, "reduce_bucket_size");
  std::int64_t allgather_bucket_size =
      row_int(blocks::zero, "allgather_bucket_size");  // stages 1-2 only; kept for the record
  bool load_from_fp32_weights = row_bool(blocks::zero, "load_from_fp32_weights");
  std::int64_t sub_group_size = row_int(blocks::zero, "sub_group_size");
  std::int64_t prefetch_bucket_size = row_int(blocks::zero, "prefetch_bucket_size");  // stage3_prefetch_bucket_size
  std::int64_t param_persistence_threshold =
      row_int(blocks::zero, "param_persistence_threshold");  // stage3_param_persistence_threshold
  std::int64_t model_persistence_threshold = INT64_MAX;      // stage3_model_persistence_threshold
  std::int64_t max_live_parameters = row_int(blocks::zero, "max_live_parameters");  // stage3_max_live_parameters
  std::int64_t max_reuse_distance = row_int(blocks::zero, "max_reuse_distance");    // stage3_max_reuse_distance
  bool gather_16bit_weights_on_model_save =
      row_bool(blocks::zero, "gather_16bit_weights_on_model_save");  // stage3_gather_16bit_weights_on_model_save
  std::int64_t module_granularity_threshold =
      row_int(blocks::zero, "module_granularity_threshold");  // stage3_module_granularity_threshold
  bool use_all_reduce_for_fetch_params =
      row_bool(blocks::zero, "use_all_reduce_for_fetch_params");               // stage3_use_all_reduce_for_fetch_params
  bool allgather_sequential = row_bool(blocks::zero, "allgather_sequential");  // stage3_allgather_sequential
  OffloadConfig offload_param;
  OffloadConfig offload_optimizer = OffloadConfig::optimizer_defaults();
  // ZeRO++ switches; zero3 accepts only their "off" values for training (see docs/config.md).
  std::int64_t zero_hpz_partition_size = row_int(blocks::zero, "zero_hpz_partition_size");
  bool zero_quantized_weights = row_bool(blocks::zero, "zero_quantized_weights");
  bool zero_quantized_nontrainable_weights = row_bool(blocks::zero, "zero_quantized_nontrainable_weights");
  bool zero_quantized_gradients = row_bool(blocks::zero, "zero_quantized_gradients");
};

// aio block: NVMe swap settings (only used with an nvme offload device).
struct AioConfig {
  std::int64_t block_size = row_int(blocks::aio, "block_size");  // bytes
  std::int64_t queue_depth = row_int(blocks::aio, "queue_depth");
  std::int64_t intra_op_parallelism = row_int(blocks::aio, "intra_op_parallelism");
  bool single_submit = row_bool(blocks::aio, "single_submit");
  bool overlap_events = row_bool(blocks::aio, "overlap_events");
  bool use_gds = row_bool(blocks::aio, "use_gds");
};

struct CheckpointConfig {
  TagValidation tag_validation = row_enum<TagValidation, TagValidation::fail>(blocks::checkpoint, "tag_validation");
  bool load_universal = row_bool(blocks::checkpoint, "load_universal");
  bool use_node_local_storage = row_bool(blocks::checkpoint, "use_node_local_storage");
};

// data_types block. Unset dtypes follow the model dtype.
struct DataTypesConfig {
  std::optional<DType> grad_accum_dtype;
  std::optional<DType> param_dtype;
  std::optional<DType> buffer_dtype;
};

// csv_monitor / tensorboard (same keys), both implemented (zero3/train/sinks.hpp, tensorboard.hpp).
struct MonitorConfig {
  bool enabled = row_bool(blocks::csv_monitor, "enabled");
  std::string output_path = row_string(blocks::csv_monitor, "output_path");
  std::string job_name = row_string(blocks::csv_monitor, "job_name");
};

struct WandbConfig {
  bool enabled = row_bool(blocks::wandb, "enabled");
  std::optional<std::string> group;
  std::optional<std::string> team;
  std::string project = row_string(blocks::wandb, "project");
};

struct ActivationCheckpointingConfig {
  bool partition_activations = row_bool(blocks::activation_checkpointing, "partition_activations");
  bool cpu_checkpointing = row_bool(blocks::activation_checkpointing, "cpu_checkpointing");
  bool contiguous_memory_optimization = row_bool(blocks::activation_checkpointing, "contiguous_memory_optimization");
  std::optional<std::int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = row_bool(blocks::activation_checkpointing, "synchronize_checkpoint_boundary");
  bool profile = row_bool(blocks::activation_checkpointing, "profile");
};

struct FlopsProfilerConfig {
  bool enabled = row_bool(blocks::flops_profiler, "enabled");
  double recompute_fwd_factor = row_number(blocks::flops_profiler, "recompute_fwd_factor");
  std::int64_t profile_step = row_int(blocks::flops_profiler, "profile_step");
  std::int64_t module_depth = row_int(blocks::flops_profiler, "module_depth");
  std::int64_t top_modules = row_int(blocks::flops_profiler, "top_modules");
  bool detailed = row_bool(blocks::flops_profiler, "detailed");
  std::optional<std::string> output_file;
};

// ---- zero3's own settings: the top-level "zero3" block (DeepSpeed has no such key) ----

struct ModelSettings {
  ModelType type = row_enum<ModelType, ModelType::llama>(blocks::zero3_model, "type");
  std::int64_t layers = 0;
  std::int64_t hidden_size = 0;
  std::int64_t heads = 0;       // gpt: hidden_size % heads == 0
  std::int64_t vocab_size = 0;  // gpt, llama: tokens; mlp: input and output width
  std::int64_t seq_len = 0;     // gpt, llama: context length; mlp: 1 when absent
  // llama only (zero3/models/llama.hpp), from the zero3 block or a Hugging Face config.json (hf_config).
  std::int64_t kv_heads = 0;           // 0: heads
  std::int64_t head_dim = 0;           // 0: hidden_size / heads
  std::int64_t intermediate_size = 0;  // the SwiGLU MLP's inner width
  double rope_theta = row_number(blocks::zero3_model, "rope_theta");
  double rms_norm_eps = row_number(blocks::zero3_model, "rms_norm_eps");
  bool qkv_bias = row_bool(blocks::zero3_model, "qkv_bias");  // q/k/v projections carry biases (Qwen2, attention_bias)
  bool o_bias = row_bool(blocks::zero3_model, "o_bias");      // o_proj carries a bias (attention_bias)
  bool tie_word_embeddings = row_bool(blocks::zero3_model, "tie_word_embeddings");
  std::string hf_config;  // the config.json the shape was read from, "" when none
  // Initial weights from a safetensors checkpoint (a file or a directory), "" for the params' own init.
  std::string init_from;
  Recompute activation_checkpointing =
      row_enum<Recompute, Recompute::selective>(blocks::zero3_model, "activation_checkpointing");
};

struct DataSettings {
  std::string source =
      row_string(blocks::zero3_data, "source");  // "synthetic:markov", "tokens:<file>" or "raw16:<file>"
  std::int64_t markov_order = row_int(blocks::zero3_data, "markov_order");
  double heldout_fraction = row_number(blocks::zero3_data, "heldout_fraction");  // in (0, 1)
};

struct RunSettings {
  std::int64_t steps = 0;  // optimizer steps in the run
  std::int64_t log_interval = row_int(blocks::zero3_run, "log_interval");
};

struct CommSettings {
  double timeout_s = row_number(
      blocks::zero3_comm, "timeout_s");  // the collective watchdog's deadline once a rank has entered a collective
  // The deadline before the first optimizer step has completed and in checkpoint phases; nullopt: 4 x
  // timeout_s (first_step_timeout() resolves it).
  std::optional<double> first_step_timeout_s;
  std::int64_t flight_records =
      row_int(blocks::zero3_comm, "flight_records");  // collectives kept per rank by the flight recorder
  bool desync_check =
      row_bool(blocks::zero3_comm, "desync_check");  // compare every collective's fingerprint across ranks first
  CommBackend backend = row_enum<CommBackend, CommBackend::nccl>(blocks::zero3_comm, "backend");

  double first_step_timeout() const { return first_step_timeout_s.value_or(4.0 * timeout_s); }
};

// zero3.alerts: a command run with each event's JSON line on stdin (zero3/core/events.hpp).
struct AlertSettings {
  std::string command;       // run by /bin/sh -c; empty: no alerts
  bool errors_only = false;  // "level": "error"; the default "warning" alerts on warnings and errors
};

// zero3.nonfinite: an optimizer step whose gradients (or a rank's loss) hold Inf/NaN, for every dtype (fp16's
// own overflows stay with its loss scaler).
struct NonfiniteSettings {
  NonfinitePolicy policy = row_enum<NonfinitePolicy, NonfinitePolicy::abort>(blocks::zero3_nonfinite, "policy");
  std::int64_t max_consecutive =
      row_int(blocks::zero3_nonfinite, "max_consecutive");  // skipped non-finite steps in a row that end the run
};

// zero3.spike: the loss-spike detector over the window's mean loss and the action taken (off by default).
struct SpikeSettings {
  bool enabled = row_bool(blocks::zero3_spike, "enabled");
  SpikeDetector detector = row_enum<SpikeDetector, SpikeDetector::zscore>(blocks::zero3_spike, "detector");
  double threshold = 6.0;                                        // resolved: ratio 2.0, zscore 6.0 when not given
  std::int64_t window = row_int(blocks::zero3_spike, "window");  // losses the running mean and std are taken over
  std::int64_t warmup_steps = row_int(blocks::zero3_spike, "warmup_steps");  // steps observed before the detector arms
  SpikeAction action = row_enum<SpikeAction, SpikeAction::rollback>(blocks::zero3_spike, "action");
  std::int64_t rewarm_steps =
      row_int(blocks::zero3_spike, "rewarm_steps");  // reset_moments: applied steps over which the lr ramps back
  std::int64_t skip_batches =
      row_int(blocks::zero3_spike, "skip_batches");  // rollback: batches after the checkpoint that are not trained on
  std::int64_t max_consecutive =
      row_int(blocks::zero3_spike, "max_consecutive");  // spikes in a row (no normal step between) that end the run
};

// zero3.accumulation: what sets the micro-batch. "fixed": the configured one. "memory": each rank's peak use
// of its device memory moves it at a step boundary (halved above `high` for `rounds` steps in a row, doubled
// below `low` on every rank, never above the configured micro-batch), the gradient accumulation moving the
// other way, so every step keeps the global batch and its samples in their order (zero3/train/accumulation.hpp).
struct AccumulationSettings {
  AccumulationPolicy policy =
      row_enum<AccumulationPolicy, AccumulationPolicy::memory>(blocks::zero3_accumulation, "policy");
  double high = row_number(blocks::zero3_accumulation, "high");  // fraction of the device memory
  double low = row_number(blocks::zero3_accumulation, "low");
  std::int64_t rounds = row_int(blocks::zero3_accumulation, "rounds");  // steps in a row before a change
};

struct Zero3Settings {
  std::int64_t seed = row_int(blocks::zero3, "seed");
  bool strict = row_bool(
      blocks::zero3, "strict");  // lint mode for the config itself: what DeepSpeed would ignore or relax is an error
  std::optional<double> pinned_memory_budget_gb;  // nullopt: "auto", decided at startup from host memory
  // At world size 1 with the params on the device: units are computed on the param shards in place and
  // gradients written straight into the fp32 accumulators where the dtypes allow, with no collective
  // (docs/engine.md, "World size 1"); false keeps the sharded path of every world size.
  bool single_rank_in_place = row_bool(blocks::zero3, "single_rank_in_place");
  std::optional<ModelSettings> model;
  DataSettings data;
  std::optional<RunSettings> run;
  CommSettings comm;
  AlertSettings alerts;
  NonfiniteSettings nonfinite;
  SpikeSettings spike;
  AccumulationSettings accumulation;
  DeviceChoice device = row_enum<DeviceChoice, DeviceChoice::cuda>(blocks::zero3, "device");
};

// The whole resolved configuration.
struct Config {
  BatchConfig batch;
  double gradient_clipping = row_number(blocks::top, "gradient_clipping");  // max global L2 norm; 0 = no clipping
  std::optional<std::int64_t> steps_per_print;  // nullopt = never (DeepSpeed >= 0.15.2 default)
  bool wall_clock_breakdown = row_bool(blocks::top, "wall_clock_breakdown");
  bool memory_breakdown = row_bool(blocks::top, "memory_breakdown");
  DType communication_data_type = DType::f32;  // resolved: the model dtype when not given
  bool prescale_gradients = row_bool(blocks::top, "prescale_gradients");
  double gradient_predivide_factor = row_number(blocks::top, "gradient_predivide_factor");
  bool zero_allow_untested_optimizer = row_bool(blocks::top, "zero_allow_untested_optimizer");
  std::optional<OptimizerConfig> optimizer;  // nullopt: no optimizer block
  std::optional<SchedulerConfig> scheduler;  // nullopt: constant lr
  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero;
  AioConfig aio;
  CheckpointConfig checkpoint;
  DataTypesConfig data_types;
  MonitorConfig csv_monitor;
  MonitorConfig tensorboard;
  WandbConfig wandb;
  ActivationCheckpointingConfig activation_checkpointing;
  FlopsProfilerConfig flops_profiler;
  Zero3Settings zero3;

  // fp16 when fp16.enabled, bf16 when bf16.enabled, otherwise fp32.
  DType model_dtype() const { return fp16.enabled ? DType::f16 : bf16.enabled ? DType::bf16 : DType::f32; }
  // Gradient accumulation dtype: data_types.grad_accum_dtype, else the model dtype.
  DType grad_accum_dtype() const { return data_types.grad_accum_dtype.value_or(model_dtype()); }
  // How the optimizer stores its master weights: bf16 with bf16.bf16_master_weights_and_grads, fp16 with
  // fp16.fp16_master_weights_and_grads, else fp32. The gradient accumulators are fp32 whatever these keys say.
  DType master_dtype() const {
    return bf16.bf16_master_weights_and_grads   ? DType::bf16
           : fp16.fp16_master_weights_and_grads ? DType::f16
                                                : DType::f32;
  }
  // How it stores its moments (Adam's m and v, Lion's m, Adagrad's sum of squares): bf16 with
  // bf16.bf16_optimizer_states, else fp32.
  DType optimizer_state_dtype() const { return bf16.bf16_optimizer_states ? DType::bf16 : DType::f32; }
};

// Fills what a config leaves to the run length: scheduler total_num_steps given as "auto" in a config without
// zero3.run. zero3 train does it from --steps / zero3.run.steps; a program that builds an Engine from such a
// config calls it with its own step count first (the lr schedule refuses an unresolved "auto").
void resolve_run_length(Config& config, std::int64_t steps);

}  // namespace zero3::config
