// The key table. Every key DeepSpeed 0.19.8 reads in the blocks zero3 checks, DeepSpeed's other top-level
// blocks (whose contents zero3 checks only where listed), and zero3's own "zero3" block. Its rows are the
// one statement of each key's type, range, default and meaning: the parsers take ranges from them and
// configs/README.md's key table is rendered from them (key_table.hpp).
#include "zero3/config/schema.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "zero3/core/json_integer.hpp"

namespace zero3::config {

namespace {

using S = Support;
using A = AutoRule;

constexpr std::string_view kTop = blocks::top;
constexpr std::string_view kOpt = blocks::optimizer;
constexpr std::string_view kAdam = blocks::adam;
constexpr std::string_view kLion = "optimizer.params (Lion)";
constexpr std::string_view kAdagrad = "optimizer.params (Adagrad)";
constexpr std::string_view kSched = "scheduler";
constexpr std::string_view kWarmup = blocks::warmup_lr;
constexpr std::string_view kDecay = blocks::warmup_decay_lr;
constexpr std::string_view kCosine = blocks::warmup_cosine_lr;
constexpr std::string_view kOneCycle = blocks::one_cycle;
constexpr std::string_view kRange = blocks::lr_range_test;
constexpr std::string_view kZero = blocks::zero;
constexpr std::string_view kOffP = blocks::offload_param;
constexpr std::string_view kOffO = blocks::offload_optimizer;
constexpr std::string_view kZenflow = "zero_optimization.zenflow";
constexpr std::string_view kLeaf = "zero_optimization.leaf_module";

constexpr std::string_view kNyiOn = "accepted; not implemented when turned on";
constexpr std::string_view kRemoved = "removed in DeepSpeed 0.19.8, which rejects the key whatever its value: an error";
constexpr std::string_view kFp32States =
    "false only with bf16.bf16_optimizer_states (which sets it false); false alone (16-bit moments beside an fp32 "
    "master): not implemented";
constexpr std::string_view kStage12 = "stages 1-2 only in DeepSpeed; no effect with stage 3";

constexpr KeySpec kKeys[] = {
    // Sections in quotes are those of https://www.deepspeed.ai/docs/config-json/.
    // ---- top level ("Batch Size Related Parameters", "Gradient Clipping", ...; deepspeed/runtime/constants.py)
    {kTop, "train_batch_size", int_min(1), "inferred", S::implemented, A::resolved, "batch rule (§1.1)"},
    {kTop, "train_micro_batch_size_per_gpu", int_min(1).held_in<int>(), "inferred", S::implemented, A::resolved,
     "batch rule; \"auto\" with nothing to infer from: 8 (HF Trainer's default)"},
    {kTop, "gradient_accumulation_steps", int_min(1), "inferred", S::implemented, A::resolved,
     "batch rule; \"auto\" with nothing to infer from: 1 (HF Trainer's default)"},
    {kTop, "managed_gradient_accumulation", "bool", "true", S::not_implemented, A::rejected,
     "false (the client decides the step boundary) is not implemented"},
    {kTop, "gradient_clipping", num_min(0), "1.0", S::implemented, A::resolved, "0 turns clipping off; auto: 1.0"},
    {kTop, "steps_per_print", int_min(1).or_null(), "null", S::implemented, A::rejected, "null: never print"},
    {kTop, "wall_clock_breakdown", "bool", "false", S::implemented, A::rejected,
     "step phase timers; with CPU offload, copy and CPU time per step (EngineStats::last_step_offload)"},
    {kTop, "memory_breakdown", "bool", "false", S::implemented, A::rejected,
     "each log line carries current and peak memory by category per phase of the step; the end says where each "
     "category peaked (docs/memory.md)"},
    {kTop, "dump_state", "bool", "false", S::no_effect, A::rejected, "zero3 prints the resolved config instead"},
    {kTop, "prescale_gradients", "bool", "false", S::implemented, A::rejected,
     "true is an error with stage 3 + reduce_scatter (DeepSpeed asserts)"},
    {kTop, "gradient_predivide_factor", num_above(0), "1.0", S::implemented, A::rejected,
     "must be 1.0 with stage 3 + reduce_scatter (DeepSpeed asserts)"},
    {kTop, "gradient_allreduce_op", "\"mean\" | \"sum\"", "\"mean\"", S::implemented, A::rejected,
     "\"sum\" is an error with stage 3 (DeepSpeed raises)"},
    {kTop, "communication_data_type", "\"fp32\" | \"fp16\" | \"bf16\" | null", "model dtype", S::implemented,
     A::rejected, "case-insensitive; null: the model dtype"},
    {kTop, "seq_parallel_communication_data_type", "dtype string", "\"fp32\"", S::no_effect, A::rejected,
     "no sequence parallelism in zero3"},
    {kTop, "disable_allgather", "bool", "false", S::no_effect, A::rejected, "legacy flag"},
    {kTop, "disable_python_gc", "bool", "false", S::no_effect, A::rejected,
     "DeepSpeed pauses Python's garbage collector during steps; zero3 has none"},
    {kTop, "sparse_gradients", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "zero_allow_untested_optimizer", "bool", "false", S::implemented, A::rejected,
     "needed for optimizers outside DeepSpeed's ZeRO list, as in DeepSpeed"},
    {kTop, "zero_force_ds_cpu_optimizer", "bool", "true", S::no_effect, A::rejected,
     "zero3 always steps offloaded state with its own CPU optimizers"},
    {kTop, "graph_harvesting", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "vocabulary_size", int_min(1).or_null(), "null", S::no_effect, A::rejected,
     "zero3.model.vocab_size is used"},
    {kTop, "dataloader_drop_last", "bool", "false", S::no_effect, A::rejected, "zero3 has its own data loader"},
    {kTop, "log_level", "string or null", "null", S::no_effect, A::rejected, ""},
    {kTop, "use_data_before_expert_parallelism", "bool", "false", S::no_effect, A::rejected, "no MoE in zero3"},
    {kTop, "sequence_parallel_size", int_min(1), "1", S::not_implemented, A::rejected, "> 1: not implemented"},
    {kTop, "allgather_size", int_min(0), "5e8", S::no_effect, A::rejected, "legacy \"zero_optimization\": true form"},
    {kTop, "optimizer", "object", "none", S::implemented, A::rejected, "Adam, AdamW, Lion, Adagrad"},
    {kTop, "scheduler", "object", "none (constant lr)", S::implemented, A::rejected,
     "WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest"},
    {kTop, "fp16", "object", "{}", S::implemented, A::rejected, ""},
    {kTop, "bf16", "object", "{}", S::implemented, A::rejected, ""},
    {kTop, "bfloat16", "object", "{}", S::deprecated, A::rejected,
     "old name of bf16 (a warning); ignored when bf16 is also given, as in DeepSpeed"},
    {kTop, "zero_optimization", "object (or legacy bool)", "{} (stage 0)", S::implemented, A::rejected,
     "stage 3 only is runnable"},
    {kTop, "aio", "object or null", "{}", S::no_effect, A::rejected, "NVMe swap settings"},
    {kTop, "checkpoint", "object", "{}", S::implemented, A::rejected, ""},
    {kTop, "data_types", "object", "{}", S::implemented, A::rejected, ""},
    {kTop, "csv_monitor", "object", "{}", S::implemented, A::rejected, ""},
    {kTop, "tensorboard", "object", "{}", S::implemented, A::rejected, ""},
    {kTop, "wandb", "object", "{}", S::not_implemented, A::rejected, "enabled: not implemented"},
    {kTop, "comet", "object", "{}", S::not_implemented, A::rejected, "enabled: not implemented"},
    {kTop, "comms_logger", "object", "absent", S::not_implemented, A::rejected,
     "enabled: not implemented (DeepSpeed turns it on by the block's presence; zero3 follows 'enabled')"},
    {kTop, "activation_checkpointing", "object", "{}", S::not_implemented, A::rejected,
     "any switch on: not implemented"},
    {kTop, "flops_profiler", "object", "{}", S::not_implemented, A::rejected, "enabled: not implemented"},
    {kTop, "amp", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "torch_autocast", "object", "{}", S::not_implemented, A::rejected, "enabled: not implemented"},
    {kTop, "pipeline", "object", "{}", S::not_implemented, A::rejected, "stages > 1: not implemented"},
    {kTop, "elasticity", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "sparse_attention", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "hybrid_engine", "object", "{}", S::not_implemented, A::rejected, "enabled: not implemented"},
    {kTop, "compile", "object", "{}", S::not_implemented, A::rejected, "deepcompile: not implemented"},
    {kTop, "eigenvalue", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "progressive_layer_drop", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "nebula", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "timers", "object", "{}", S::no_effect, A::rejected, "zero3 times steps through wall_clock_breakdown"},
    {kTop, "compression_training", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "data_efficiency", "object", "{}", S::unchecked, A::rejected, "enabled: not implemented"},
    {kTop, "curriculum_learning", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "autotuning", "object", "{}", S::unchecked, A::rejected, "enabled: not implemented"},
    {kTop, "quantize_training", "any", "-", S::rejected, A::rejected, kRemoved},
    {kTop, "datastates_ckpt", "object", "absent", S::unchecked, A::rejected, "non-empty: not implemented"},
    {kTop, "weight_quantization", "object", "absent", S::not_implemented, A::rejected,
     "present with enabled true (its default): not implemented"},
    {kTop, "tensor_parallel", "object", "{}", S::not_implemented, A::rejected,
     "autotp_size > 1 or tp.tp_size > 1: not implemented"},
    {kTop, "expert_parallel", "object", "{}", S::unchecked, A::rejected, "enabled: not implemented"},
    {kTop, "zero3", "object", "{}", S::implemented, A::rejected, "zero3's own settings (not DeepSpeed)"},

    // ---- optimizer ("Optimizer Parameters")
    {kOpt, "type", "string", "required", S::implemented, A::rejected,
     "Adam, AdamW, Lion, Adagrad (any case); other DeepSpeed and torch.optim names: not implemented"},
    {kOpt, "params", "object", "{}", S::implemented, A::rejected, "keys depend on the type"},
    {kOpt, "legacy_fusion", "bool", "false", S::no_effect, A::rejected, ""},

    {kAdam, "lr", num_min(0), "0.001", S::implemented, A::resolved, "auto: 5e-05 (HF Trainer's learning_rate)"},
    {kAdam, "betas", "[b1, b2], each in [0, 1)", "[0.9, 0.999]", S::implemented, A::resolved,
     "auto: [0.9, 0.999] (HF)"},
    {kAdam, "eps", num_above(0), "1e-8", S::implemented, A::resolved, "auto: 1e-8 (HF)"},
    {kAdam, "weight_decay", num_min(0), "0", S::implemented, A::resolved, "auto: 0"},
    {kAdam, "bias_correction", "bool", "true", S::implemented, A::rejected, ""},
    {kAdam, "adam_w_mode", "bool", "true", S::implemented, A::rejected,
     "Adam only: true = decoupled weight decay (AdamW), false = L2 added to the gradient (§2.3)"},
    {kAdam, "amsgrad", "bool", "false", S::not_implemented, A::rejected, "true: not implemented"},
    {kAdam, "torch_adam", "bool", "false", S::no_effect, A::rejected, "zero3 has one Adam implementation"},
    {kAdam, "fp32_optimizer_states", "bool", "true", S::implemented, A::rejected, kFp32States},
    {kAdam, "set_grad_none", "bool", "true", S::no_effect, A::rejected, ""},
    {kAdam, "max_grad_norm", "-", "-", S::rejected, A::rejected, "DeepSpeed raises: use gradient_clipping"},

    {kLion, "lr", num_min(0), "0.001", S::implemented, A::resolved, "auto: 5e-05 (HF Trainer's learning_rate)"},
    {kLion, "betas", "[b1, b2], each in [0, 1)", "[0.9, 0.999]", S::implemented, A::resolved,
     "auto: [0.9, 0.999] (HF)"},
    {kLion, "weight_decay", num_min(0), "0", S::implemented, A::resolved, "auto: 0"},
    {kLion, "fp32_optimizer_states", "bool", "true", S::implemented, A::rejected, kFp32States},
    {kLion, "set_grad_none", "bool", "true", S::no_effect, A::rejected, ""},
    {kLion, "max_grad_norm", "-", "-", S::rejected, A::rejected, "DeepSpeed raises: use gradient_clipping"},

    {kAdagrad, "lr", num_min(0), "0.01", S::implemented, A::resolved, "auto: 5e-05 (HF Trainer's learning_rate)"},
    {kAdagrad, "eps", num_above(0), "1e-10", S::implemented, A::resolved, "auto: 1e-8 (HF)"},
    {kAdagrad, "weight_decay", num_min(0), "0", S::implemented, A::resolved, "auto: 0"},
    {kAdagrad, "lr_decay", num_min(0), "0", S::not_implemented, A::rejected,
     "torch.optim.Adagrad; != 0: not implemented"},
    {kAdagrad, "initial_accumulator_value", num_min(0), "0", S::not_implemented, A::rejected,
     "torch.optim.Adagrad; != 0: not implemented"},
    {kAdagrad, "amsgrad", "bool", "false", S::not_implemented, A::rejected, "true: not implemented"},
    {kAdagrad, "fp32_optimizer_states", "bool", "true", S::implemented, A::rejected, kFp32States},
    {kAdagrad, "maximize", "bool", "false", S::not_implemented, A::rejected, "true: not implemented"},
    {kAdagrad, "foreach", "bool or null", "null", S::no_effect, A::rejected, "PyTorch kernel choice"},
    {kAdagrad, "differentiable", "bool", "false", S::no_effect, A::rejected, "PyTorch autograd option"},
    {kAdagrad, "fused", "bool or null", "null", S::no_effect, A::rejected, "PyTorch kernel choice"},
    {kAdagrad, "max_grad_norm", "-", "-", S::rejected, A::rejected, "DeepSpeed raises: use gradient_clipping"},

    // ---- scheduler ("Scheduler Parameters"; deepspeed/runtime/lr_schedules.py)
    {kSched, "type", "string", "required", S::implemented, A::rejected,
     "case-sensitive; torch.optim.lr_scheduler names: not implemented"},
    {kSched, "params", "object", "{}", S::implemented, A::rejected, "keys depend on the type"},

    {kWarmup, "warmup_min_lr", num_min(0), "0", S::implemented, A::resolved, "auto: 0"},
    {kWarmup, "warmup_max_lr", num_min(0), "optimizer lr", S::implemented, A::resolved, "auto: the optimizer lr"},
    {kWarmup, "warmup_num_steps", int_min(1), "1000", S::implemented, A::resolved,
     "auto: 1 (HF Trainer's default is no warmup)"},
    {kWarmup, "warmup_type", "\"log\" | \"linear\"", "\"log\"", S::implemented, A::rejected, ""},
    {kWarmup, "last_batch_iteration", int_min(-1), "-1", S::implemented, A::rejected, ""},

    {kDecay, "total_num_steps", int_min(1), "required", S::implemented, A::resolved,
     "auto: zero3.run.steps, else the run length at run time"},
    {kDecay, "warmup_min_lr", num_min(0), "0", S::implemented, A::resolved, "auto: 0"},
    {kDecay, "warmup_max_lr", num_min(0), "0.001", S::implemented, A::resolved, "auto: the optimizer lr"},
    {kDecay, "warmup_num_steps", int_min(1), "1000", S::implemented, A::resolved,
     "auto: 1 (HF Trainer's default is no warmup)"},
    {kDecay, "warmup_type", "\"log\" | \"linear\"", "\"log\"", S::implemented, A::rejected, ""},
    {kDecay, "last_batch_iteration", int_min(-1), "-1", S::implemented, A::rejected, ""},

    {kCosine, "total_num_steps", int_min(1), "required", S::implemented, A::resolved,
     "auto: zero3.run.steps, else the run length at run time"},
    {kCosine, "warmup_min_ratio", num_in(0, 1), "0", S::implemented, A::rejected, ""},
    {kCosine, "warmup_num_steps", int_min(1), "1000", S::implemented, A::resolved,
     "auto: 1 (HF Trainer's default is no warmup)"},
    {kCosine, "cos_min_ratio", num_in(0, 1), "0.0001", S::implemented, A::rejected, ""},
    {kCosine, "warmup_type", "\"log\" | \"linear\"", "\"log\"", S::implemented, A::rejected, ""},
    {kCosine, "last_batch_iteration", int_min(-1), "-1", S::implemented, A::rejected, ""},

    {kOneCycle, "cycle_min_lr", num_min(0), "required", S::implemented, A::rejected, ""},
    {kOneCycle, "cycle_max_lr", num_min(0), "required", S::implemented, A::rejected, ""},
    {kOneCycle, "decay_lr_rate", num_min(0), "0", S::implemented, A::rejected, ""},
    {kOneCycle, "cycle_first_step_size", int_min(1), "2000", S::implemented, A::rejected, ""},
    {kOneCycle, "cycle_second_step_size", int_min(0).or_null(), "cycle_first_step_size", S::implemented, A::rejected,
     ""},
    {kOneCycle, "cycle_first_stair_count", int_min(0), "0", S::implemented, A::rejected, "0: continuous"},
    {kOneCycle, "cycle_second_stair_count", int_min(0).or_null(), "cycle_first_stair_count", S::implemented,
     A::rejected, ""},
    {kOneCycle, "decay_step_size", int_min(0), "0", S::implemented, A::rejected, "0: no decay"},
    {kOneCycle, "cycle_momentum", "bool", "true", S::implemented, A::rejected, "cycles beta1; beta2 becomes 0.99"},
    {kOneCycle, "cycle_min_mom", num_half_open(0, 1), "0.8", S::implemented, A::rejected, ""},
    {kOneCycle, "cycle_max_mom", num_half_open(0, 1), "0.9", S::implemented, A::rejected, ""},
    {kOneCycle, "decay_mom_rate", num_min(0), "0", S::implemented, A::rejected, ""},
    {kOneCycle, "last_batch_iteration", int_min(-1), "-1", S::implemented, A::rejected, ""},

    {kRange, "lr_range_test_min_lr", num_min(0), "0.001", S::implemented, A::rejected, ""},
    {kRange, "lr_range_test_step_size", int_min(1), "2000", S::implemented, A::rejected, ""},
    {kRange, "lr_range_test_step_rate", num_min(0), "1.0", S::implemented, A::rejected, ""},
    {kRange, "lr_range_test_staircase", "bool", "false", S::implemented, A::rejected, ""},
    {kRange, "last_batch_iteration", int_min(-1), "-1", S::implemented, A::rejected, ""},

    // ---- fp16 / bf16 ("FP16 training options", "BFLOAT16 training options")
    {"fp16", "enabled", "bool", "false", S::implemented, A::resolved, "auto: false"},
    {"fp16", "auto_cast", "bool", "false", S::not_implemented, A::ds_default, "true: not implemented"},
    {"fp16", "loss_scale", num_min(0), "0", S::implemented, A::ds_default, "0: dynamic; > 0: static scale"},
    {"fp16", "initial_scale_power", int_in(0, 126), "16", S::implemented, A::ds_default, "initial scale 2**power"},
    {"fp16", "loss_scale_window", "int", "1000", S::implemented, A::ds_default,
     "> 0 with dynamic loss scaling (loss_scale 0)"},
    {"fp16", "hysteresis", int_min(1), "2", S::implemented, A::ds_default, ""},
    {"fp16", "consecutive_hysteresis", "bool", "false", S::implemented, A::ds_default, ""},
    {"fp16", "min_loss_scale", "int", "1", S::implemented, A::ds_default,
     "> 0 with dynamic loss scaling (loss_scale 0)"},
    {"fp16", "fp16_master_weights_and_grads", "bool", "false", S::implemented, A::ds_default,
     "true: master weights stored in fp16 (fp32 moments); needs fp16.enabled and stage 1-3. Gradients are still "
     "accumulated in fp32 (a config warning says so). DeepSpeed's ZeRO-3 also wants offload_optimizer with its CPU "
     "Adam here (its fused GPU Adam cannot mix dtypes); zero3's device kernels can, so it is not required"},
    {"bf16", "enabled", "bool", "false", S::implemented, A::resolved, "auto: false"},
    {"bf16", "immediate_grad_update", "bool", "false", S::no_effect, A::ds_default, "BF16_Optimizer path only"},
    {"bf16", "check_grad_overflow", "bool", "true", S::no_effect, A::ds_default,
     "ZeRO 1-2 only; zero3 checks every dtype through zero3.nonfinite"},
    {"bf16", "bf16_master_weights_and_grads", "bool", "false", S::implemented, A::ds_default,
     "true: master weights stored in bf16; needs bf16.enabled and stage 1-3. Gradients are still accumulated in "
     "fp32 (a config warning says so). Without bf16_optimizer_states DeepSpeed's ZeRO-3 also wants offload_optimizer "
     "with its CPU Adam (its fused GPU Adam cannot mix dtypes); zero3's device kernels can, so it is not required"},
    {"bf16", "bf16_optimizer_states", "bool", "false", S::implemented, A::ds_default,
     "true: moments stored in bf16 (docs/optim.md); needs bf16_master_weights_and_grads (DeepSpeed asserts); sets "
     "the optimizer's fp32_optimizer_states false, as DeepSpeed builds its CPU Adam"},

    // ---- zero_optimization ("ZeRO Optimizations for FP16 Training", "Parameter offloading", "Optimizer offloading")
    {kZero, "stage", int_in(0, 3), "0", S::implemented, A::resolved,
     "only 3 is runnable; auto: 3 (DeepSpeed's auto would give 0)"},
    {kZero, "contiguous_gradients", "bool", "true", S::no_effect, A::ds_default,
     "zero3 always reduces from a contiguous bucket"},
    {kZero, "overlap_comm", "bool or null", "stage == 3", S::implemented, A::ds_default, ""},
    {kZero, "reduce_scatter", "bool", "true", S::implemented, A::ds_default, "false: not implemented"},
    {kZero, "reduce_bucket_size", int_min(1), "5e8", S::implemented, A::resolved,
     "auto: hidden_size^2 (zero3.model), else the default; 0 (which DeepSpeed accepts) would reduce nothing"},
    {kZero, "use_multi_rank_bucket_allreduce", "bool", "true", S::no_effect, A::ds_default, kStage12},
    {kZero, "allgather_partitions", "bool", "true", S::no_effect, A::ds_default, kStage12},
    {kZero, "allgather_bucket_size", int_min(0), "5e8", S::no_effect, A::ds_default, kStage12},
    {kZero, "round_robin_gradients", "bool", "false", S::no_effect, A::ds_default, kStage12},
    {kZero, "parameter_alignment", "bool", "false", S::no_effect, A::ds_default, kStage12},
    {kZero, "compute_grad_norm", "bool", "true", S::no_effect, A::ds_default,
     "stages 1-2 only; false with stage 3 is an error (DeepSpeed's validator)"},
    {kZero, "ignore_unused_parameters", "bool", "true", S::no_effect, A::ds_default, kStage12},
    {kZero, "load_from_fp32_weights", "bool", "true", S::implemented, A::ds_default, ""},
    {kZero, "elastic_checkpoint", "bool", "false", S::no_effect, A::ds_default,
     "deprecated by DeepSpeed for stage 3 (a warning)"},
    {kZero, "legacy_stage1", "bool", "false", S::rejected, A::ds_default, "true is an error (DeepSpeed raises)"},
    {kZero, "sub_group_size", int_min(0), "1e9", S::implemented, A::ds_default, ""},
    {kZero, "stage3_prefetch_bucket_size", int_min(0), "5e7", S::implemented, A::resolved,
     "alias prefetch_bucket_size; auto: int(0.9 * hidden_size^2), else the default"},
    {kZero, "prefetch_bucket_size", int_min(0), "5e7", S::implemented, A::resolved,
     "alias of stage3_prefetch_bucket_size"},
    {kZero, "stage3_param_persistence_threshold", int_min(0), "1e5", S::implemented, A::resolved,
     "alias param_persistence_threshold; auto: 10 * hidden_size, else the default"},
    {kZero, "param_persistence_threshold", int_min(0), "1e5", S::implemented, A::resolved,
     "alias of stage3_param_persistence_threshold"},
    {kZero, "stage3_model_persistence_threshold", int_min(0), "sys.maxsize", S::implemented, A::ds_default,
     "alias model_persistence_threshold"},
    {kZero, "model_persistence_threshold", int_min(0), "sys.maxsize", S::implemented, A::ds_default,
     "alias of stage3_model_persistence_threshold"},
    {kZero, "stage3_max_live_parameters", int_min(0), "1e9", S::implemented, A::ds_default,
     "alias max_live_parameters"},
    {kZero, "max_live_parameters", int_min(0), "1e9", S::implemented, A::ds_default,
     "alias of stage3_max_live_parameters"},
    {kZero, "stage3_max_reuse_distance", int_min(0), "1e9", S::implemented, A::ds_default, "alias max_reuse_distance"},
    {kZero, "max_reuse_distance", int_min(0), "1e9", S::implemented, A::ds_default,
     "alias of stage3_max_reuse_distance"},
    {kZero, "stage3_gather_16bit_weights_on_model_save", "bool", "false", S::implemented, A::ds_default,
     "alias gather_16bit_weights_on_model_save; true: each checkpoint of zero3 train holds model.safetensors"},
    {kZero, "gather_16bit_weights_on_model_save", "bool", "false", S::implemented, A::ds_default,
     "alias of stage3_gather_16bit_weights_on_model_save"},
    {kZero, "stage3_gather_fp16_weights_on_model_save", "bool", "false", S::deprecated, A::ds_default,
     "mapped to stage3_gather_16bit_weights_on_model_save"},
    {kZero, "stage3_module_granularity_threshold", "int", "0", S::not_implemented, A::ds_default,
     "alias module_granularity_threshold; > 0: not implemented"},
    {kZero, "module_granularity_threshold", "int", "0", S::not_implemented, A::ds_default,
     "alias of stage3_module_granularity_threshold"},
    {kZero, "stage3_use_all_reduce_for_fetch_params", "bool", "false", S::not_implemented, A::ds_default,
     "alias use_all_reduce_for_fetch_params; true: not implemented"},
    {kZero, "use_all_reduce_for_fetch_params", "bool", "false", S::not_implemented, A::ds_default,
     "alias of stage3_use_all_reduce_for_fetch_params"},
    {kZero, "stage3_allgather_sequential", "bool", "false", S::not_implemented, A::ds_default,
     "alias allgather_sequential; true: not implemented"},
    {kZero, "allgather_sequential", "bool", "false", S::not_implemented, A::ds_default,
     "alias of stage3_allgather_sequential"},
    {kZero, "offload_param", "object or null", "null", S::implemented, A::rejected, "device cpu and nvme implemented"},
    {kZero, "offload_optimizer", "object or null", "null", S::implemented, A::rejected,
     "device cpu and nvme implemented"},
    {kZero, "cpu_offload", "bool or null", "null", S::deprecated, A::ds_default,
     "true: offload_optimizer {device: cpu} (a warning)"},
    {kZero, "cpu_offload_param", "bool or null", "null", S::deprecated, A::ds_default,
     "true: offload_param {device: cpu} (a warning)"},
    {kZero, "cpu_offload_use_pin_memory", "bool or null", "null", S::deprecated, A::ds_default,
     "no effect (a warning), as in DeepSpeed"},
    {kZero, "zero_hpz_partition_size", int_min(0), "1", S::not_implemented, A::ds_default,
     "ZeRO++ hpZ; > 1: not implemented"},
    {kZero, "zero_quantized_weights", "bool", "false", S::not_implemented, A::ds_default,
     "ZeRO++ qwZ; true: not implemented"},
    {kZero, "zero_quantized_nontrainable_weights", "bool", "false", S::not_implemented, A::ds_default,
     "true: not implemented"},
    {kZero, "zero_quantized_gradients", "bool", "false", S::not_implemented, A::ds_default,
     "ZeRO++ qgZ; true: not implemented"},
    {kZero, "zeropp_loco_param", "any", "-", S::rejected, A::rejected, kRemoved},
    {kZero, "mics_shard_size", "any", "-", S::rejected, A::rejected, kRemoved},
    {kZero, "mics_hierarchical_params_gather", "any", "-", S::rejected, A::rejected, kRemoved},
    {kZero, "memory_efficient_linear", "bool", "true", S::no_effect, A::ds_default, "PyTorch autograd detail"},
    {kZero, "pipeline_loading_checkpoint", "bool", "false", S::not_implemented, A::ds_default, "true: not implemented"},
    {kZero, "override_module_apply", "bool", "true", S::no_effect, A::ds_default, "PyTorch nn.Module detail"},
    {kZero, "log_trace_cache_warnings", "bool", "false", S::no_effect, A::ds_default, ""},
    {kZero, "enable_sanity_checks", "bool", "false", S::no_effect, A::ds_default, ""},
    {kZero, "save_muon_momentum_buffer_in_memory", "bool", "false", S::no_effect, A::ds_default, "Muon with NVMe only"},
    {kZero, "leaf_module", "object", "{}", S::no_effect, A::ds_default, "PyTorch module hooks"},
    {kZero, "zenflow", "object or null", "null", S::not_implemented, A::ds_default,
     "ZenFlow; an object: not implemented"},

    {kOffP, "device", "\"none\" | \"cpu\" | \"nvme\"", "\"none\"", S::implemented, A::ds_default,
     "exact lowercase; nvme needs offload_optimizer cpu or nvme"},
    {kOffP, "nvme_path", "string or null", "null", S::implemented, A::ds_default,
     "required for nvme: a directory on a file system with O_DIRECT"},
    {kOffP, "pin_memory", "bool", "true", S::implemented, A::ds_default, ""},
    {kOffP, "buffer_count", int_min(0), "5", S::implemented, A::ds_default,
     "NVMe only: read buffers of gathered units' shards (at least 1)"},
    {kOffP, "buffer_size", int_min(0), "1e8", S::implemented, A::ds_default,
     "NVMe only: the most elements a buffer takes (at least the largest unit shard not kept in host memory)"},
    {kOffP, "max_in_cpu", int_min(0), "1e9", S::implemented, A::ds_default,
     "NVMe only: elements of unit shards kept in host memory, in layout order"},

    {kOffO, "device", "\"none\" | \"cpu\" | \"nvme\"", "\"none\"", S::implemented, A::ds_default,
     "exact lowercase; nvme: master, moments and accumulators in files (docs/offload.md)"},
    {kOffO, "nvme_path", "string or null", "null", S::implemented, A::ds_default,
     "required for nvme: a directory on a file system with O_DIRECT"},
    {kOffO, "pin_memory", "bool", "true", S::implemented, A::ds_default, ""},
    {kOffO, "buffer_count", int_min(0), "4", S::implemented, A::ds_default,
     "NVMe: tensor buffers of the step's slice ring (one slice holds master, accumulator and moments)"},
    {kOffO, "pipeline_read", "bool", "false", S::implemented, A::ds_default,
     "NVMe: read the next slice while the CPU steps one"},
    {kOffO, "pipeline_write", "bool", "false", S::implemented, A::ds_default,
     "NVMe: write a stepped slice back while the CPU steps the next"},
    {kOffO, "fast_init", "bool", "false", S::no_effect, A::ds_default, "NVMe only"},
    {kOffO, "ratio", num_in(0, 1), "1.0", S::implemented, A::ds_default,
     "fraction of sub-groups stepped on the CPU; < 1 needs stage 3"},
    {kOffO, "super_offload", "bool", "false", S::not_implemented, A::ds_default, "true: not implemented"},
    {kOffO, "cpuadam_cores_perc", num_in(0, 1), "0.8", S::no_effect, A::ds_default, "super_offload only"},

    {kZenflow, "topk_ratio", num_in(0, 1), "0.1", S::not_implemented, A::ds_default, kNyiOn},
    {kZenflow, "select_strategy", "\"auto\" | \"step\" | \"epoch\"", "\"auto\"", S::not_implemented, A::ds_default,
     kNyiOn},
    {kZenflow, "select_interval", "\"auto\" or int", "\"auto\"", S::not_implemented, A::ds_default, kNyiOn},
    {kZenflow, "update_interval", "\"auto\" or int", "\"auto\"", S::not_implemented, A::ds_default, kNyiOn},
    {kZenflow, "overlap_step", "bool", "false", S::not_implemented, A::ds_default, kNyiOn},
    {kZenflow, "offload", "bool", "false", S::not_implemented, A::ds_default, kNyiOn},
    {kZenflow, "auto_ratio", num_in(0, 1), "0.99", S::not_implemented, A::ds_default, kNyiOn},
    {kZenflow, "full_warm_up_rounds", "int", "0", S::not_implemented, A::ds_default, kNyiOn},
    {kZenflow, "pt_reserved_cores_perc", num_in(0, 1), "0.5", S::not_implemented, A::ds_default, kNyiOn},
    {kZenflow, "steps_per_epoch", "int or null", "null", S::not_implemented, A::ds_default,
     "set by DeepSpeed at run time"},

    {kLeaf, "classes", "string or list of strings", "MoE blocks", S::no_effect, A::ds_default, ""},
    {kLeaf, "names", "string or list of strings", "[]", S::no_effect, A::ds_default, ""},
    {kLeaf, "name_suffixes", "string or list of strings", "[]", S::no_effect, A::ds_default, ""},

    // ---- aio, checkpoint, data_types ("Asynchronous I/O", "Checkpoint options", "Data Type options")
    {"aio", "block_size", int_min(1), "1048576", S::implemented, A::rejected,
     "NVMe: bytes per request, a multiple of 4096"},
    {"aio", "queue_depth", int_min(1).held_in<int>(), "8", S::implemented, A::rejected, "NVMe: requests in flight"},
    {"aio", "intra_op_parallelism", int_min(1).held_in<int>(), "1", S::implemented, A::rejected,
     "NVMe: threads where io_uring is unavailable"},
    {"aio", "thread_count", int_min(1).held_in<int>(), "-", S::deprecated, A::rejected,
     "DeepSpeed ignores it since v0.16.4; zero3 maps it to intra_op_parallelism with a warning"},
    {"aio", "single_submit", "bool", "false", S::implemented, A::rejected, "NVMe: submit requests one by one"},
    {"aio", "overlap_events", "bool", "true", S::implemented, A::rejected,
     "NVMe: keep submitting while requests complete"},
    {"aio", "use_gds", "bool", "false", S::not_implemented, A::rejected, "true: not implemented"},

    {"checkpoint", "tag_validation", "\"Ignore\" | \"Warn\" | \"Fail\"", "\"Warn\"", S::implemented, A::rejected,
     "case-insensitive"},
    {"checkpoint", "load_universal", "bool", "false", S::not_implemented, A::rejected, "true: not implemented"},
    {"checkpoint", "use_node_local_storage", "bool", "false", S::not_implemented, A::rejected, "true: not implemented"},
    {"checkpoint", "parallel_write", "object", "{}", S::no_effect, A::rejected, "pipeline parallelism only"},
    {"checkpoint", "checkpoint_serialization", "bool", "true", S::no_effect, A::rejected, "PyTorch serialization"},
    {"checkpoint", "writer", "object or null", "null", S::not_implemented, A::rejected,
     "an object: not implemented (fast checkpoint writer)"},
    {"checkpoint.parallel_write", "pipeline_stage", "bool", "false", S::no_effect, A::rejected, ""},
    {"checkpoint.writer", "type", "string", "\"FAST\"", S::not_implemented, A::rejected, ""},
    {"checkpoint.writer", "io_buffer_size", "int", "64 MiB", S::not_implemented, A::rejected, ""},
    {"checkpoint.writer", "io_buffer_double", "bool", "true", S::not_implemented, A::rejected, ""},
    {"checkpoint.writer", "show_statistics", "bool", "false", S::not_implemented, A::rejected, ""},
    {"checkpoint.writer", "data_parallel", "string or null", "null", S::not_implemented, A::rejected, ""},
    {"checkpoint.writer", "decoupled", "bool", "false", S::not_implemented, A::rejected, ""},
    {"checkpoint.writer", "io_multiplier", "int", "1", S::not_implemented, A::rejected, ""},

    {"data_types", "grad_accum_dtype", "dtype string or null", "model dtype", S::implemented, A::rejected,
     "fp32, fp16, bf16 spellings (int8 is an error)"},
    {"data_types", "param_dtype", "dtype string or null", "model dtype", S::implemented, A::rejected,
     "must match the fp16/bf16 mode"},
    {"data_types", "buffer_dtype", "dtype string or null", "model dtype", S::implemented, A::rejected,
     "must match the fp16/bf16 mode"},
    {"data_types", "keep_in_fp32_modules", "\"auto\" or list of strings", "\"auto\"", S::no_effect, A::rejected,
     "buffers kept in fp32; zero3's models have none"},

    // ---- monitors and profilers ("Monitoring Module", "Flops Profiler", "Activation Checkpointing", ...)
    {"csv_monitor", "enabled", "bool", "false", S::implemented, A::ds_default, ""},
    {"csv_monitor", "output_path", "string", "\"\"", S::implemented, A::ds_default, "\"\": the launch directory"},
    {"csv_monitor", "job_name", "string", "\"DeepSpeedJobName\"", S::implemented, A::ds_default, ""},
    {"tensorboard", "enabled", "bool", "false", S::implemented, A::ds_default,
     "event files written natively (docs/train.md)"},
    {"tensorboard", "output_path", "string", "\"\"", S::implemented, A::ds_default, "\"\": the launch directory"},
    {"tensorboard", "job_name", "string", "\"DeepSpeedJobName\"", S::implemented, A::ds_default, ""},
    {"wandb", "enabled", "bool", "false", S::not_implemented, A::ds_default, "true: not implemented"},
    {"wandb", "group", "string or null", "null", S::not_implemented, A::ds_default, ""},
    {"wandb", "team", "string or null", "null", S::not_implemented, A::ds_default, ""},
    {"wandb", "project", "string", "\"deepspeed\"", S::not_implemented, A::ds_default, ""},
    {"comet", "enabled", "bool", "false", S::not_implemented, A::ds_default, "true: not implemented"},
    {"comet", "samples_log_interval", "int", "100", S::not_implemented, A::ds_default, ""},
    {"comet", "project", "string or null", "null", S::not_implemented, A::ds_default, ""},
    {"comet", "workspace", "string or null", "null", S::not_implemented, A::ds_default, ""},
    {"comet", "api_key", "string or null", "null", S::not_implemented, A::ds_default, ""},
    {"comet", "experiment_name", "string or null", "null", S::not_implemented, A::ds_default, ""},
    {"comet", "experiment_key", "string or null", "null", S::not_implemented, A::ds_default, ""},
    {"comet", "online", "bool or null", "null", S::not_implemented, A::ds_default, ""},
    {"comet", "mode", "string or null", "null", S::not_implemented, A::ds_default, ""},
    {"comms_logger", "enabled", "bool", "false", S::not_implemented, A::ds_default, "true: not implemented"},
    {"comms_logger", "prof_all", "bool", "true", S::not_implemented, A::ds_default, ""},
    {"comms_logger", "prof_ops", "list of strings", "[]", S::not_implemented, A::ds_default, ""},
    {"comms_logger", "verbose", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"comms_logger", "debug", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"activation_checkpointing", "partition_activations", "bool", "false", S::not_implemented, A::rejected,
     "true: not implemented (model parallelism); zero3 checkpoints by zero3.model.activation_checkpointing"},
    {"activation_checkpointing", "cpu_checkpointing", "bool", "false", S::implemented, A::rejected,
     "true: the inputs zero3.model.activation_checkpointing \"full\" keeps live in host memory (pinned on CUDA) "
     "from their unit's forward to its backward"},
    {"activation_checkpointing", "contiguous_memory_optimization", "bool", "false", S::not_implemented, A::rejected,
     "true: not implemented (with partition_activations)"},
    {"activation_checkpointing", "number_checkpoints", int_min(1).or_null(), "null", S::not_implemented, A::rejected,
     "an int: not implemented (with contiguous_memory_optimization)"},
    {"activation_checkpointing", "synchronize_checkpoint_boundary", "bool", "false", S::implemented, A::rejected,
     "true: the device is synchronized after each unit's forward and backward (each unit is a checkpoint)"},
    {"activation_checkpointing", "profile", "bool", "false", S::not_implemented, A::rejected, "true: not implemented"},
    {"flops_profiler", "enabled", "bool", "false", S::not_implemented, A::rejected,
     "true: not implemented (and turns wall_clock_breakdown on, as in DeepSpeed)"},
    {"flops_profiler", "recompute_fwd_factor", num_min(0), "0.0", S::not_implemented, A::rejected, ""},
    {"flops_profiler", "profile_step", int_min(1), "1", S::not_implemented, A::rejected, ""},
    {"flops_profiler", "module_depth", int_min(-1), "-1", S::not_implemented, A::rejected, ""},
    {"flops_profiler", "top_modules", int_min(1), "1", S::not_implemented, A::rejected, ""},
    {"flops_profiler", "detailed", "bool", "true", S::not_implemented, A::rejected, ""},
    {"flops_profiler", "output_file", "string or null", "null", S::not_implemented, A::rejected, ""},

    // ---- other DeepSpeed blocks: keys known, values unchecked except the switch (tensor_parallel and
    // weight_quantization: types checked, as their pydantic models do)
    {"torch_autocast", "enabled", "bool", "false", S::not_implemented, A::rejected, "true: not implemented"},
    {"torch_autocast", "dtype", "dtype string", "\"bfloat16\"", S::not_implemented, A::rejected, ""},
    {"torch_autocast", "lower_precision_safe_modules", "list of strings", "DeepSpeed's list", S::not_implemented,
     A::rejected, ""},
    {"pipeline", "stages", "\"auto\" or int", "\"auto\"", S::not_implemented, A::rejected, "int > 1: not implemented"},
    {"pipeline", "partition", "string", "\"best\"", S::no_effect, A::rejected, ""},
    {"pipeline", "seed_layers", "bool", "false", S::no_effect, A::rejected, ""},
    {"pipeline", "activation_checkpoint_interval", "int", "0", S::no_effect, A::rejected, ""},
    {"pipeline", "pipe_partitioned", "bool", "true", S::no_effect, A::rejected, ""},
    {"pipeline", "grad_partitioned", "bool", "true", S::no_effect, A::rejected, ""},
    {"hybrid_engine", "enabled", "bool", "false", S::not_implemented, A::ds_default, "true: not implemented"},
    {"hybrid_engine", "max_out_tokens", "int", "512", S::not_implemented, A::ds_default, ""},
    {"hybrid_engine", "inference_tp_size", "int", "1", S::not_implemented, A::ds_default, ""},
    {"hybrid_engine", "release_inference_cache", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"hybrid_engine", "pin_parameters", "bool", "true", S::not_implemented, A::ds_default, ""},
    {"hybrid_engine", "tp_gather_partition_size", "int", "8", S::not_implemented, A::ds_default, ""},
    {"hybrid_engine", "enable_cuda_graph", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "deepcompile", "bool", "false", S::not_implemented, A::ds_default, "true: not implemented"},
    {"compile", "autoep_non_moe", "bool", "false", S::not_implemented, A::ds_default,
     "compiles the parents of AutoEP layers; no AutoEP in zero3"},
    {"compile", "free_activation", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "free_activation_threshold", "int", "10 MiB", S::not_implemented, A::ds_default, ""},
    {"compile", "offload_activation", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "offload_activation_pin_memory", "bool", "true", S::not_implemented, A::ds_default, ""},
    {"compile", "offload_opt_states", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "double_buffer", "bool", "true", S::not_implemented, A::ds_default, ""},
    {"compile", "symmetric_memory", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "debug_log", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "offload_parameters", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "sync_before_reduce", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "sync_after_reduce", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "sync_before_allgather", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "sync_after_allgather", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "keep_int_input_tensors", "bool", "true", S::not_implemented, A::ds_default, ""},
    {"compile", "keep_all_input_tensors", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"compile", "passes", "list or null", "null", S::not_implemented, A::ds_default, ""},
    {"timers", "throughput", "object", "{}", S::no_effect, A::rejected, ""},
    {"timers.throughput", "enabled", "bool", "true", S::no_effect, A::rejected, ""},
    {"timers.throughput", "synchronized", "bool", "true", S::no_effect, A::rejected, ""},
    {"tensor_parallel", "autotp_size", "int", "0", S::not_implemented, A::ds_default,
     "automatic tensor parallelism; > 1: not implemented"},
    {"tensor_parallel", "dtype", "-", "torch.float16", S::rejected, A::ds_default,
     "a torch.dtype field: DeepSpeed rejects every JSON value but \"auto\""},
    {"tensor_parallel", "tp_overlap_comm", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"tensor_parallel", "vocab_parallel_lm_head", "bool or null", "null", S::not_implemented, A::ds_default, ""},
    {"tensor_parallel", "vocab_parallel_ce_backend", "\"torch\" | \"liger\"", "\"torch\"", S::not_implemented,
     A::ds_default, ""},
    {"tensor_parallel", "tp", "object", "{}", S::not_implemented, A::ds_default,
     "TPConfig; alias tensor_parallel (both is an error)"},
    {"tensor_parallel", "tensor_parallel", "object", "{}", S::not_implemented, A::ds_default, "alias of tp"},
    {"tensor_parallel", "injection_policy_tuple", "array or null", "null", S::not_implemented, A::ds_default,
     "contents unchecked"},
    {"tensor_parallel", "partition_config", "object or null", "null", S::not_implemented, A::ds_default,
     "contents unchecked"},
    {"tensor_parallel", "preset_model", "string or null", "null", S::not_implemented, A::ds_default, ""},
    {"tensor_parallel", "keep_module_on_host", "bool", "false", S::not_implemented, A::ds_default, ""},
    {"tensor_parallel", "replace_with_kernel_inject", "bool", "false", S::not_implemented, A::ds_default,
     "alias kernel_inject (both is an error)"},
    {"tensor_parallel", "kernel_inject", "bool", "false", S::not_implemented, A::ds_default,
     "alias of replace_with_kernel_inject"},
    {"tensor_parallel.tp", "tp_size", "int", "1", S::not_implemented, A::ds_default, "> 1: not implemented"},
    {"tensor_parallel.tp", "tp_grain_size", "int", "1", S::not_implemented, A::ds_default, ""},
    {"tensor_parallel.tp", "mpu", "any", "null", S::not_implemented, A::ds_default,
     "a Python object in DeepSpeed; unchecked"},
    {"tensor_parallel.tp", "tp_group", "any", "null", S::not_implemented, A::ds_default,
     "a Python object in DeepSpeed; unchecked"},
    {"weight_quantization", "enabled", "bool", "true", S::not_implemented, A::ds_default,
     "true: not implemented (the block's presence turns it on)"},
    {"weight_quantization", "num_bits", "int", "8", S::not_implemented, A::ds_default, ""},
    {"weight_quantization", "q_type", "\"symmetric\" | \"asymmetric\"", "\"symmetric\"", S::not_implemented,
     A::ds_default, ""},
    {"weight_quantization", "q_groups", "int", "1", S::not_implemented, A::ds_default, ""},
    {"weight_quantization", "quantized_initialization", "object", "{}", S::not_implemented, A::ds_default,
     "contents unchecked"},
    {"weight_quantization", "post_init_quant", "object", "{}", S::not_implemented, A::ds_default, "contents unchecked"},

    // ---- zero3's own block
    {"zero3", "seed", int_min(0), "42", S::implemented, A::rejected, "seeds model init and synthetic data"},
    {"zero3", "strict", "bool", "false", S::implemented, A::rejected,
     "true: keys DeepSpeed ignores and hjson syntax are errors (as --strict)"},
    {"zero3", "pinned_memory_budget_gb", "number > 0 or \"auto\"", "\"auto\"", S::implemented, A::rejected,
     "GiB of pinned host memory per rank, checked before allocation; auto: half of MemAvailable shared by the "
     "node's ranks, capped by the memlock limit where pinning uses mlock"},
    {"zero3", "single_rank_in_place", "bool", "true", S::implemented, A::rejected,
     "world size 1: no collectives; units computed on their shards in place (params on the device), gradients "
     "written into the fp32 accumulators where dtypes allow (docs/engine.md); false: the sharded path"},
    {"zero3", "model", "object", "none", S::implemented, A::rejected, "the model to train"},
    {"zero3", "data", "object", "{}", S::implemented, A::rejected, "the training data"},
    {"zero3", "run", "object", "none", S::implemented, A::rejected, "run length; feeds scheduler \"auto\" values"},
    {"zero3", "comm", "object", "{}", S::implemented, A::rejected, "communication backend"},
    {"zero3", "alerts", "object", "{}", S::implemented, A::rejected,
     "a command run with each warning/error event on stdin (docs/train.md)"},
    {"zero3", "nonfinite", "object", "{}", S::implemented, A::rejected, "steps with Inf/NaN gradients or loss"},
    {"zero3", "spike", "object", "{}", S::implemented, A::rejected, "loss-spike detector and action"},
    {"zero3", "accumulation", "object", "{}", S::implemented, A::rejected,
     "micro-batch and accumulation driven by device memory use"},
    {"zero3", "device", "\"auto\" | \"host\" | \"cuda\"", "\"auto\"", S::implemented, A::rejected,
     "auto: cuda when a GPU is present, else host"},
    {"zero3.model", "type", "\"gpt\" | \"mlp\" | \"llama\"", "\"gpt\"", S::implemented, A::rejected,
     "llama: the Llama-family decoder (docs/models.md)"},
    {"zero3.model", "layers", int_min(1).held_in<int>(), "required", S::implemented, A::rejected, ""},
    {"zero3.model", "hidden_size", int_min(1).held_in<int>(), "required", S::implemented, A::rejected,
     "also feeds the \"auto\" bucket sizes"},
    {"zero3.model", "heads", int_min(1).held_in<int>(), "required for gpt and llama", S::implemented, A::rejected,
     "gpt: must divide hidden_size"},
    {"zero3.model", "vocab_size", int_min(1).held_in<int>(), "required", S::implemented, A::rejected, ""},
    {"zero3.model", "seq_len", int_min(1).held_in<int>(), "required for gpt and llama; 1 for mlp", S::implemented,
     A::rejected, ""},
    {"zero3.model", "hf_config", "string", "absent", S::implemented, A::rejected,
     "llama: a Hugging Face config.json (llama, mistral, qwen2) giving the shape"},
    {"zero3.model", "kv_heads", int_min(1).held_in<int>(), "heads", S::implemented, A::rejected,
     "llama: must divide heads"},
    {"zero3.model", "head_dim", int_min(2).named("even int").held_in<int>(), "hidden_size / heads", S::implemented,
     A::rejected, "llama"},
    {"zero3.model", "intermediate_size", int_min(1).held_in<int>(), "required for llama", S::implemented, A::rejected,
     "llama: the SwiGLU MLP's width"},
    {"zero3.model", "rope_theta", num_above(0), "10000", S::implemented, A::rejected, "llama"},
    {"zero3.model", "rms_norm_eps", num_above(0), "1e-6", S::implemented, A::rejected, "llama"},
    {"zero3.model", "qkv_bias", "bool", "false", S::implemented, A::rejected, "llama: q/k/v projection biases"},
    {"zero3.model", "o_bias", "bool", "false", S::implemented, A::rejected, "llama: an o_proj bias"},
    {"zero3.model", "tie_word_embeddings", "bool", "false", S::implemented, A::rejected,
     "llama: lm_head is the embedding; false over a tied hf_config unties them"},
    {"zero3.model", "init_from", "string", "absent", S::implemented, A::rejected,
     "a safetensors file or directory: the initial weights, by param name"},
    {"zero3.model", "activation_checkpointing", "\"none\" | \"full\" | \"selective\"", "\"none\"", S::implemented,
     A::rejected,
     "full: each unit keeps its input and recomputes its forward in backward; selective: products and attention "
     "kept, norms and activations recomputed; bitwise the gradients of none (GPT, Llama, MLP; host and CUDA)"},
    {"zero3.data", "source", "\"synthetic:markov\" | \"tokens:FILE\" | \"raw16:FILE\"", "\"synthetic:markov\"",
     S::implemented, A::rejected, "tokens: reads zero3 and llm.c token files; raw16: headerless uint16 ids"},
    {"zero3.data", "markov_order", int_min(1), "2", S::implemented, A::rejected, "synthetic:markov only"},
    {"zero3.data", "heldout_fraction", num_open(0, 1), "0.1", S::implemented, A::rejected, ""},
    {"zero3.run", "steps", int_min(1), "required", S::implemented, A::rejected, "optimizer steps"},
    {"zero3.run", "log_interval", int_min(1), "10", S::implemented, A::rejected, "steps between log lines"},
    {"zero3.comm", "timeout_s", num_above(0), "300", S::implemented, A::rejected,
     "collective watchdog: seconds a rank waits in a collective before the job is reported and aborted"},
    {"zero3.comm", "first_step_timeout_s", num_above(0), "4 x timeout_s", S::implemented, A::rejected,
     "the watchdog's deadline until the first optimizer step completes, and for checkpoint exchanges"},
    {"zero3.comm", "flight_records", int_min(16), "4096", S::implemented, A::rejected,
     "collectives kept per rank by the flight recorder (written to the run directory on failure)"},
    {"zero3.comm", "desync_check", "bool", "false", S::implemented, A::rejected,
     "compare each collective's fingerprint across ranks before running it (mpi backend)"},
    {"zero3.comm", "backend", "\"auto\" | \"mpi\" | \"nccl\"", "\"auto\"", S::implemented, A::rejected,
     "auto: nccl with cuda, else mpi"},
    {"zero3.alerts", "command", "string", "\"\"", S::implemented, A::rejected,
     "run by /bin/sh -c (zero3 train: on the rank that emits the event) with the event's JSON line on stdin; "
     "empty: none"},
    {"zero3.alerts", "level", "\"warning\" | \"error\"", "\"warning\"", S::implemented, A::rejected,
     "the least event level that runs the command"},
    {"zero3.nonfinite", "policy", "\"skip\" | \"abort\"", "\"skip\"", S::implemented, A::rejected,
     "skip: the step is not applied (state bitwise untouched) and a warning names step, ranks and param; abort: "
     "NonFiniteError at once"},
    {"zero3.nonfinite", "max_consecutive", int_min(1), "10", S::implemented, A::rejected,
     "this many skipped non-finite steps in a row end the run with NonFiniteError"},
    {"zero3.spike", "enabled", "bool", "false", S::implemented, A::rejected,
     "the detector runs on the window's mean loss"},
    {"zero3.spike", "detector", "\"ratio\" | \"zscore\"", "\"zscore\"", S::implemented, A::rejected,
     "ratio: loss > threshold x mean; zscore: loss > mean + threshold x std (over the window)"},
    {"zero3.spike", "threshold", "number > 0 (ratio: > 1)", "ratio 2, zscore 6", S::implemented, A::rejected, ""},
    {"zero3.spike", "window", int_min(2), "100", S::implemented, A::rejected, "losses of the running mean and std"},
    {"zero3.spike", "warmup_steps", int_min(0), "100", S::implemented, A::rejected, "steps before the detector arms"},
    {"zero3.spike", "action", "\"skip\" | \"reset_moments\" | \"rollback\"", "\"skip\"", S::implemented, A::rejected,
     "the spike's step is never applied; reset_moments zeroes the moments, rollback loads the last checkpoint"},
    {"zero3.spike", "rewarm_steps", int_min(1), "100", S::implemented, A::rejected,
     "reset_moments: the lr ramps linearly back to the schedule's over this many applied steps"},
    {"zero3.spike", "skip_batches", int_min(0), "200", S::implemented, A::rejected,
     "rollback: batches after the checkpoint not trained on (at least up to the spike's)"},
    {"zero3.spike", "max_consecutive", int_min(1), "10", S::implemented, A::rejected,
     "this many spikes without a normal step between end the run"},
    {"zero3.accumulation", "policy", "\"fixed\" | \"memory\"", "\"fixed\"", S::implemented, A::rejected,
     "memory: the micro-batch halves above high and doubles below low (global batch and samples kept)"},
    {"zero3.accumulation", "high", num_open(0, 1), "0.9", S::implemented, A::rejected,
     "peak device memory use, as a fraction of the device's, that halves the micro-batch"},
    {"zero3.accumulation", "low", num_open(0, 1), "0.75", S::implemented, A::rejected,
     "below this on every rank the micro-batch doubles (up to the configured one); must be < high"},
    {"zero3.accumulation", "rounds", int_min(1), "3", S::implemented, A::rejected, "steps in a row before a change"},
};

}  // namespace

std::span<const KeySpec> known_keys() {
  return kKeys;
}

const KeySpec* find_key(std::string_view block, std::string_view key) {
  // Looked up by every getter and every config struct's member initializers: indexed once.
  static const auto index = [] {
    std::unordered_map<std::string, const KeySpec*> m;
    for (const KeySpec& k : kKeys) m.emplace(std::string(k.block) + '\n' + std::string(k.key), &k);
    return m;
  }();
  const auto it = index.find(std::string(block) + '\n' + std::string(key));
  return it == index.end() ? nullptr : it->second;
}

void throw_row_defect(std::string_view block, std::string_view key, std::string_view what) {
  throw std::logic_error(
      fmt::format("schema row '{}' of block '{}': {}", key, block.empty() ? "(top level)" : block, what));
}

namespace {

nlohmann::json row_default_json(std::string_view block, std::string_view key) {
  const KeySpec* k = find_key(block, key);
  if (k == nullptr) throw_row_defect(block, key, "no such row");
  nlohmann::json j = nlohmann::json::parse(k->default_value, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw_row_defect(block, key, "its default is words, not a JSON value");
  return j;
}

}  // namespace

bool row_bool(std::string_view block, std::string_view key) {
  const nlohmann::json j = row_default_json(block, key);
  if (!j.is_boolean()) throw_row_defect(block, key, "its default is not true or false");
  return j.get<bool>();
}

std::int64_t row_int(std::string_view block, std::string_view key) {
  const nlohmann::json j = row_default_json(block, key);
  const std::optional<std::int64_t> v = json_integer_or_integral_float(j);
  if (!v) throw_row_defect(block, key, "its default is not an integer");
  return *v;
}

double row_number(std::string_view block, std::string_view key) {
  const nlohmann::json j = row_default_json(block, key);
  if (!j.is_number()) throw_row_defect(block, key, "its default is not a number");
  return j.get<double>();
}

std::array<double, 2> row_number_pair(std::string_view block, std::string_view key) {
  const nlohmann::json j = row_default_json(block, key);
  if (!j.is_array() || j.size() != 2 || !j[0].is_number() || !j[1].is_number()) {
    throw_row_defect(block, key, "its default is not a list of two numbers");
  }
  return {j[0].get<double>(), j[1].get<double>()};
}

std::string row_string(std::string_view block, std::string_view key) {
  const nlohmann::json j = row_default_json(block, key);
  if (!j.is_string()) throw_row_defect(block, key, "its default is not a string");
  return j.get<std::string>();
}

std::string range_text(const ValueType& t) {
  if (t.kind == ValueType::Kind::integer) {
    const auto lo = static_cast<std::int64_t>(t.min), hi = static_cast<std::int64_t>(t.max);
    if (t.has_min && t.has_max) return fmt::format("in [{}, {}]", lo, hi);
    if (t.has_min) return lo == 1 ? std::string("> 0") : fmt::format(">= {}", lo);
    if (t.has_max) return fmt::format("<= {}", hi);
    return {};
  }
  if (t.has_min && t.has_max) {
    return fmt::format("in {}{}, {}{}", t.min_open ? '(' : '[', t.min, t.max, t.max_open ? ')' : ']');
  }
  if (t.has_min) return fmt::format("{} {}", t.min_open ? ">" : ">=", t.min);
  if (t.has_max) return fmt::format("{} {}", t.max_open ? "<" : "<=", t.max);
  return {};
}

std::int64_t int_lowest(const ValueType& t) {
  return t.has_min ? std::max(static_cast<std::int64_t>(std::ceil(t.min)), t.held_min) : t.held_min;
}

std::int64_t int_highest(const ValueType& t) {
  // 2^63 as a double does not convert; a max at or past it is the held type's.
  if (!t.has_max || t.max >= 9223372036854775808.0) return t.held_max;
  return std::min(static_cast<std::int64_t>(std::floor(t.max)), t.held_max);
}

std::string type_text(const ValueType& t) {
  std::string text(t.text);
  if (t.has_range()) text += " " + range_text(t);
  if (t.kind == ValueType::Kind::integer && t.narrowed() && !t.has_max) {
    text += fmt::format("{}at most {}", t.has_range() ? ", " : " ", t.held_max);
  }
  if (t.nullable) text += " or null";
  return text;
}

std::string_view to_string(Support s) {
  switch (s) {
    case Support::implemented:
      return "implemented";
    case Support::not_implemented:
      return "accepted, not implemented";
    case Support::no_effect:
      return "accepted, no effect";
    case Support::deprecated:
      return "deprecated";
    case Support::unchecked:
      return "accepted, contents unchecked";
    case Support::rejected:
      return "rejected";
  }
  return "?";
}

std::string_view to_string(AutoRule r) {
  switch (r) {
    case AutoRule::rejected:
      return "-";
    case AutoRule::ds_default:
      return "default";
    case AutoRule::resolved:
      return "resolved";
  }
  return "?";
}

}  // namespace zero3::config
