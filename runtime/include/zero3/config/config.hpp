// The typed, fully resolved training configuration that zero3 reads from a DeepSpeed JSON file.
// Every field holds its final value: DeepSpeed defaults are filled in, "auto" is resolved and aliases are
// mapped, so the engine and trainer read these structs and never look at JSON. Produced by
// zero3::config::parse_config_* (parse.hpp); plain values, safe to copy and share between threads.
// Units: *_size / *_threshold / *_parameters / *_distance fields count tensor elements, never bytes.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "zero3/core/dtype.hpp"

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
  double lr = 1e-3;                         // Adagrad default 1e-2
  std::array<double, 2> betas{0.9, 0.999};  // Adam, AdamW, Lion
  double eps = 1e-8;                        // Adam, AdamW; Adagrad default 1e-10
  double weight_decay = 0.0;
  bool bias_correction = true;         // Adam, AdamW
  bool decoupled_weight_decay = true;  // AdamW-style decay: type == AdamW || params.adam_w_mode (DeepSpeed's engine.py)
  bool fp32_optimizer_states = true;   // CPU optimizers keep moments in fp32
  bool torch_adam = false;             // accepted; zero3 has one Adam implementation
  bool set_grad_none = true;           // accepted; no effect in zero3
  bool legacy_fusion = false;          // accepted; no effect in zero3
};

// scheduler block. The fields used by each type are listed next to them; the others keep their defaults.
struct SchedulerConfig {
  SchedulerType type = SchedulerType::warmup_lr;
  std::int64_t last_batch_iteration = -1;  // all types: resume point, -1 = fresh start
  // WarmupLR, WarmupDecayLR
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;  // WarmupLR: the optimizer's lr when absent; WarmupDecayLR: 0.001 when absent
  // WarmupLR, WarmupDecayLR, WarmupCosineLR
  std::int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::log;
  // WarmupDecayLR, WarmupCosineLR (required)
  std::int64_t total_num_steps = 0;
  // "auto" parsed without a run length: total_num_steps is the run's step count, set by resolve_run_length.
  bool total_num_steps_from_run = false;
  // WarmupCosineLR (multiplies the optimizer's lr)
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;
  // OneCycle (cycle_min_lr and cycle_max_lr are required)
  double cycle_min_lr = 0.0;
  double cycle_max_lr = 0.0;
  double decay_lr_rate = 0.0;
  std::int64_t cycle_first_step_size = 2000;
  std::int64_t cycle_second_step_size = 2000;  // the first size when absent
  std::int64_t cycle_first_stair_count = 0;
  std::int64_t cycle_second_stair_count = 0;  // the first count when absent
  std::int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
  // LRRangeTest
  double lr_range_test_min_lr = 1e-3;
  std::int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

// fp16 block. loss_scale 0 selects dynamic loss scaling (deepspeed/runtime/fp16/loss_scaler.py).
struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;
  std::int64_t initial_scale_power = 16;  // initial dynamic scale 2**power
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  std::int64_t min_loss_scale = 1;
  bool fp16_master_weights_and_grads = false;

  bool dynamic_loss_scale() const { return loss_scale == 0.0; }
};

// bf16 block (also read from the deprecated name "bfloat16"). No loss scaling in bf16.
struct Bf16Config {
  bool enabled = false;
  bool immediate_grad_update = false;
  bool check_grad_overflow = true;  // DeepSpeed ZeRO-3 never checks bf16 gradients; kept for the record
  bool bf16_master_weights_and_grads = false;
  bool bf16_optimizer_states = false;
};

// zero_optimization.offload_param / offload_optimizer. Keys that only one of the two has are marked.
struct OffloadConfig {
  OffloadDevice device = OffloadDevice::none;
  std::optional<std::string> nvme_path;
  bool pin_memory = true;
  std::int64_t buffer_count = 5;            // param: 5, optimizer: 4
  std::int64_t buffer_size = 100'000'000;   // param only: elements per NVMe swap buffer
  std::int64_t max_in_cpu = 1'000'000'000;  // param only: elements kept in CPU memory with nvme
  bool pipeline_read = false;               // optimizer only
  bool pipeline_write = false;              // optimizer only
  bool fast_init = false;                   // optimizer only
  double ratio = 1.0;                       // optimizer only: fraction of sub-groups stepped on the CPU
  bool super_offload = false;               // optimizer only
  double cpuadam_cores_perc = 0.8;          // optimizer only

  bool enabled() const { return device != OffloadDevice::none; }
  // offload_optimizer's defaults differ from offload_param's only in buffer_count (4, one per Adam state).
  static OffloadConfig optimizer_defaults() {
    OffloadConfig o;
    o.buffer_count = 4;
    return o;
  }
};

// zero_optimization block (deepspeed/runtime/zero/config.py). Names follow the stage-3 spellings without the
// "stage3_" prefix.
struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool overlap_comm = true;  // DeepSpeed's null default resolved: stage == 3
  bool reduce_scatter = true;
  std::int64_t reduce_bucket_size = 500'000'000;
  std::int64_t allgather_bucket_size = 500'000'000;  // stages 1-2 only; kept for the record
  bool load_from_fp32_weights = true;
  std::int64_t sub_group_size = 1'000'000'000;
  std::int64_t prefetch_bucket_size = 50'000'000;        // stage3_prefetch_bucket_size
  std::int64_t param_persistence_threshold = 100'000;    // stage3_param_persistence_threshold
  std::int64_t model_persistence_threshold = INT64_MAX;  // stage3_model_persistence_threshold
  std::int64_t max_live_parameters = 1'000'000'000;      // stage3_max_live_parameters
  std::int64_t max_reuse_distance = 1'000'000'000;       // stage3_max_reuse_distance
  bool gather_16bit_weights_on_model_save = false;       // stage3_gather_16bit_weights_on_model_save
  std::int64_t module_granularity_threshold = 0;         // stage3_module_granularity_threshold
  bool use_all_reduce_for_fetch_params = false;          // stage3_use_all_reduce_for_fetch_params
  bool allgather_sequential = false;                     // stage3_allgather_sequential
  OffloadConfig offload_param;
  OffloadConfig offload_optimizer = OffloadConfig::optimizer_defaults();
  // ZeRO++ switches; zero3 accepts only their "off" values for training (see docs/config.md).
  std::int64_t zero_hpz_partition_size = 1;
  bool zero_quantized_weights = false;
  bool zero_quantized_nontrainable_weights = false;
  bool zero_quantized_gradients = false;
};

// aio block: NVMe swap settings (only used with an nvme offload device).
struct AioConfig {
  std::int64_t block_size = 1'048'576;  // bytes
  std::int64_t queue_depth = 8;
  std::int64_t intra_op_parallelism = 1;
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

struct CheckpointConfig {
  TagValidation tag_validation = TagValidation::warn;
  bool load_universal = false;
  bool use_node_local_storage = false;
};

// data_types block. Unset dtypes follow the model dtype.
struct DataTypesConfig {
  std::optional<DType> grad_accum_dtype;
  std::optional<DType> param_dtype;
  std::optional<DType> buffer_dtype;
};

// csv_monitor / tensorboard (same keys), both implemented (zero3/train/sinks.hpp, tensorboard.hpp).
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

struct WandbConfig {
  bool enabled = false;
  std::optional<std::string> group;
  std::optional<std::string> team;
  std::string project = "deepspeed";
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<std::int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

struct FlopsProfilerConfig {
  bool enabled = false;
  double recompute_fwd_factor = 0.0;
  std::int64_t profile_step = 1;
  std::int64_t module_depth = -1;
  std::int64_t top_modules = 1;
  bool detailed = true;
  std::optional<std::string> output_file;
};

// ---- zero3's own settings: the top-level "zero3" block (DeepSpeed has no such key) ----

struct ModelSettings {
  ModelType type = ModelType::gpt;
  std::int64_t layers = 0;
  std::int64_t hidden_size = 0;
  std::int64_t heads = 0;       // gpt: hidden_size % heads == 0
  std::int64_t vocab_size = 0;  // gpt, llama: tokens; mlp: input and output width
  std::int64_t seq_len = 0;     // gpt, llama: context length; mlp: 1 when absent
  // llama only (zero3/models/llama.hpp), from the zero3 block or a Hugging Face config.json (hf_config).
  std::int64_t kv_heads = 0;           // 0: heads
  std::int64_t head_dim = 0;           // 0: hidden_size / heads
  std::int64_t intermediate_size = 0;  // the SwiGLU MLP's inner width
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool qkv_bias = false;  // q/k/v projections carry biases (Qwen2, attention_bias)
  bool o_bias = false;    // o_proj carries a bias (attention_bias)
  bool tie_word_embeddings = false;
  std::string hf_config;  // the config.json the shape was read from, "" when none
  // Initial weights from a safetensors checkpoint (a file or a directory), "" for the params' own init.
  std::string init_from;
};

struct DataSettings {
  std::string source = "synthetic:markov";  // "synthetic:markov", "tokens:<file>" or "raw16:<file>"
  std::int64_t markov_order = 2;
  double heldout_fraction = 0.1;  // in (0, 1)
};

struct RunSettings {
  std::int64_t steps = 0;  // optimizer steps in the run
  std::int64_t log_interval = 10;
};

struct CommSettings {
  double timeout_s = 300.0;  // the collective watchdog's deadline once a rank has entered a collective
  // The deadline before the first optimizer step has completed and in checkpoint phases; nullopt: 4 x
  // timeout_s (first_step_timeout() resolves it).
  std::optional<double> first_step_timeout_s;
  std::int64_t flight_records = 4096;  // collectives kept per rank by the flight recorder
  bool desync_check = false;           // compare every collective's fingerprint across ranks first
  CommBackend backend = CommBackend::automatic;

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
  NonfinitePolicy policy = NonfinitePolicy::skip;
  std::int64_t max_consecutive = 10;  // skipped non-finite steps in a row that end the run
};

// zero3.spike: the loss-spike detector over the window's mean loss and the action taken (off by default).
struct SpikeSettings {
  bool enabled = false;
  SpikeDetector detector = SpikeDetector::zscore;
  double threshold = 6.0;           // resolved: ratio 2.0, zscore 6.0 when not given
  std::int64_t window = 100;        // losses the running mean and std are taken over
  std::int64_t warmup_steps = 100;  // steps observed before the detector arms
  SpikeAction action = SpikeAction::skip;
  std::int64_t rewarm_steps = 100;    // reset_moments: applied steps over which the lr ramps back
  std::int64_t skip_batches = 200;    // rollback: batches after the checkpoint that are not trained on
  std::int64_t max_consecutive = 10;  // spikes in a row (no normal step between) that end the run
};

struct Zero3Settings {
  std::int64_t seed = 42;
  bool strict = false;  // lint mode for the config itself: what DeepSpeed would ignore or relax is an error
  std::optional<double> pinned_memory_budget_gb;  // nullopt: "auto", decided at startup from host memory
  // At world size 1 with the params on the device: units are computed on the param shards in place and
  // gradients written straight into the fp32 accumulators where the dtypes allow, with no collective
  // (docs/engine.md, "World size 1"); false keeps the sharded path of every world size.
  bool single_rank_in_place = true;
  std::optional<ModelSettings> model;
  DataSettings data;
  std::optional<RunSettings> run;
  CommSettings comm;
  AlertSettings alerts;
  NonfiniteSettings nonfinite;
  SpikeSettings spike;
  DeviceChoice device = DeviceChoice::automatic;
};

// The whole resolved configuration.
struct Config {
  BatchConfig batch;
  double gradient_clipping = 1.0;               // max global L2 norm; 0 = no clipping
  std::optional<std::int64_t> steps_per_print;  // nullopt = never (DeepSpeed >= 0.15.2 default)
  bool wall_clock_breakdown = false;
  bool memory_breakdown = false;
  DType communication_data_type = DType::f32;  // resolved: the model dtype when not given
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  bool zero_allow_untested_optimizer = false;
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
};

// Fills what a config leaves to the run length: scheduler total_num_steps given as "auto" in a config without
// zero3.run. zero3 train does it from --steps / zero3.run.steps; a program that builds an Engine from such a
// config calls it with its own step count first (the lr schedule refuses an unresolved "auto").
void resolve_run_length(Config& config, std::int64_t steps);

}  // namespace zero3::config
