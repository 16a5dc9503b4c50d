// The memory plan: every byte a rank of a ZeRO-3 job will hold at its peak, per memory kind (device, pinned
// host, pageable host) and category (zero3/core/memory.hpp), derived from the units and the config alone,
// before anything is allocated. The categories are the MemoryTracker's, so a plan and a run's measured
// peaks compare row by row (`zero3 mem plan`, `zero3 train --memory-json`).
//
//   config::Config cfg = config::load_config_or_throw("ds_config.json", {.world_size = 64});
//   MemoryPlanOptions options;
//   options.ranks_per_node = 8;
//   options.device = DeviceKind::cuda;
//   options.activations = {.bytes = model.planned_activation_bytes(8, 16, 2048), .kind = MemoryKind::device};
//   const MemoryPlan plan = plan_memory(units, cfg, options);  // the units a trainer passes to add_unit
//   if (plan.peak_total(MemoryKind::device) > free_bytes) ... plan.describe_kind(MemoryKind::device) ...
//
// How each category is derived (docs/memory.md): model states (param shards, master weights, accumulators,
// optimizer states, each in its stored dtype) from the flat layout, exactly; gathered params by running the engine's
// gather schedule (prefetch bucket, live budget, reuse distance, persistence) over a window's unit walk; gradient
// buffers from the backward walk (a unit's buffer while the one before it is still being reduced); the reduction's and
// the communicator's scratch from the pieces reduce_bucket_size cuts; staging from the offload pipeline's slots and
// copies and the checkpoint's staging; activations as the model reports them. Every rank of a job holds the same
// amounts (shards are equal by construction).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zero3/config/config.hpp"
#include "zero3/core/memory.hpp"
#include "zero3/device/device.hpp"
#include "zero3/units/unit_spec.hpp"

namespace zero3 {

// Bytes per (memory kind, category).
struct MemoryTable {
  std::array<std::array<std::uint64_t, kNumMemCategories>, kNumMemoryKinds> bytes{};

  std::uint64_t& at(MemoryKind kind, MemCategory category) {
    return bytes[static_cast<std::size_t>(kind)][static_cast<std::size_t>(category)];
  }
  std::uint64_t at(MemoryKind kind, MemCategory category) const {
    return bytes[static_cast<std::size_t>(kind)][static_cast<std::size_t>(category)];
  }
  // The sum over the categories of `kind`.
  std::uint64_t total(MemoryKind kind) const;
  MemoryTable& operator+=(const MemoryTable& other);
};

// The model's activations and scratch at their largest (UnitModel::planned_activation_bytes), and where.
struct ActivationPlan {
  std::uint64_t bytes = 0;
  MemoryKind kind = MemoryKind::device;
  // cpu_checkpointing: the kept inputs in host memory (UnitModel::planned_offloaded_bytes), in the device's
  // host staging memory (pinned on CUDA).
  std::uint64_t offloaded_bytes = 0;
};

struct MemoryPlanOptions {
  int ranks_per_node = 1;                // DeepSpeed's estimate is per node; zero3's plan per rank
  DeviceKind device = DeviceKind::host;  // where staging lives (host backend: pageable) and the communicator
  ActivationPlan activations;
  // Bytes of host staging a checkpoint save holds at once (ckpt::Checkpointer), 0 without checkpoints.
  std::uint64_t checkpoint_staging_bytes = 0;
  // The process's own resident memory before the job allocates (code, libraries, MPI): measured by the
  // caller (zero3/core/resident.hpp), 0 when not known. It only enters resident_peak().
  std::uint64_t resident_base_bytes = 0;
};

// What DeepSpeed's estimate_zero3_model_states_mem_needs_all_live prints for the same model and offload
// setting (zero_init, additional_buffer_factor 1.5): model states only (deepspeed/runtime/zero/stage3.py).
struct DeepSpeedEstimate {
  bool covered = true;              // false for offload_param without offload_optimizer (not evaluated)
  std::uint64_t total_params = 0;   // P
  std::uint64_t largest_layer = 0;  // L: the most params one module (a param name's prefix) owns
  std::uint64_t gpu_bytes_per_gpu = 0;
  std::uint64_t cpu_bytes_per_node = 0;
};

struct MemoryPlan {
  int world_size = 1;
  int ranks_per_node = 1;
  MemoryTable peak;  // each category at its own peak, on one rank
  // The same peaks had every freed buffer come back the moment it was freed. Buffers freed behind a stream
  // (gathered params, gradient buffers, a reduction's outgrown scratch) come back once the stream has
  // passed them, which on a busy host or a fast collective may be before the next allocation or after it:
  // a run's measured peak lies between `low` and `peak`. Equal for every other category.
  MemoryTable low;
  // What each category is made of, in words and numbers, for the non-zero rows.
  std::array<std::array<std::string, kNumMemCategories>, kNumMemoryKinds> how;
  DeepSpeedEstimate deepspeed;

  // The sum of the category peaks of `kind`: what the kind must have room for (its categories need not
  // peak at the same moment, so the measured total peak is at most this).
  std::uint64_t peak_total(MemoryKind kind) const { return peak.total(kind); }
  // The process's peak resident memory (VmHWM, ru_maxrss) the plan predicts: the resident base and every
  // kind the process holds in its own memory (on the host backend, the device's memory too).
  std::uint64_t resident_base = 0;
  bool device_memory_on_host = true;
  // Memory the MPI library allocates inside a call and frees before returning, which no zero3 tracker sees:
  // Open MPI's reduce-scatter algorithms take a buffer of the call's whole input, so the largest gradient
  // reduction's input (fp32). 0 on one rank and with NCCL (whose buffers are the GPU's).
  std::uint64_t library_temporary = 0;
  // The optimizer's storage per trainable element, wherever it lives: the master (master_dtype), `optimizer_states`
  // moments (state_dtype) and the fp32 gradient accumulator. AdamW: 16 bytes in fp32; 10 with bf16 master and
  // moments (bf16.bf16_master_weights_and_grads, bf16.bf16_optimizer_states); 14 with a 16-bit master alone.
  DType master_dtype = DType::f32;
  DType state_dtype = DType::f32;
  int optimizer_states = 0;
  std::uint64_t optimizer_bytes_per_param = 0;
  // NVMe offload (offload_optimizer.device "nvme"): bytes of a rank's files under nvme_path, and what one
  // optimizer step (its accumulation window included) reads from and writes to them. 0 otherwise.
  std::uint64_t nvme_file_bytes = 0;
  std::uint64_t nvme_read_bytes_per_step = 0;
  std::uint64_t nvme_write_bytes_per_step = 0;
  std::uint64_t resident_peak() const {
    return resident_base + library_temporary + peak_total(MemoryKind::pinned_host) +
           peak_total(MemoryKind::pageable_host) + (device_memory_on_host ? peak_total(MemoryKind::device) : 0);
  }
  // One line per non-zero category of `kind`, largest first: "param_shard 12.3 MiB (the rank's shards of ...)".
  std::string describe_kind(MemoryKind kind) const;
};

// Collective-free and allocation-free: the plan of every rank of `config`'s world size. `config` must
// have an optimizer block (as the engine requires) and the units as add_unit would receive them.
// Throws UsageError / ConfigError as the engine would for the same units and config.
MemoryPlan plan_memory(std::span<const UnitSpec> units, const config::Config& config, const MemoryPlanOptions& options);

}  // namespace zero3
