// The engine half of a training loop: a UnitModel driven through the engine's unit walk (unit_walk.hpp:
// gather every unit in forward; gather + grads in reverse in backward; step()), with the model's
// activations reported to the memory tracker and, under wall_clock_breakdown, the time split of each
// optimizer step (forward, backward, step, and the engine's waits inside them). The loop itself
// (trainer.hpp) drives one of these; a trainer with its own loop can use it alone:
//
//   zero3::train::UnitTrainer t(config, world, bootstrap, [&](zero3::Device& d) { return make_model(d); });
//   double loss = t.micro_batch(tokens, targets, batch, len);  // forward + backward of one micro-batch
//   zero3::StepResult r = t.step();                            // once per micro-batch
//
// One host thread drives it; collective like the engine (every rank calls the same sequence).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "zero3/comm/communicator.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/engine.hpp"
#include "zero3/engine/memory_plan.hpp"
#include "zero3/models/unit_model.hpp"

namespace zero3::train {

// Where one optimizer step's wall time went (milliseconds, this rank). forward + backward + step is the
// step; the waits are parts of those: gathers stall forward and backward, reductions stall step().
// Measured with wall_clock_breakdown only (the compute stream is synchronized at the end of forward and
// of backward so that device work is counted where it ran).
struct StepSplit {
  double forward_ms = 0.0;
  double backward_ms = 0.0;
  double step_ms = 0.0;            // Engine::step() calls, boundary included
  double gather_wait_ms = 0.0;     // compute stream stalled on all-gathers (and offloaded shards' copies)
  double reduce_wait_ms = 0.0;     // step() waiting for the reductions
  double optimizer_ms = 0.0;       // step() after the reductions
  double copies_exposed_ms = 0.0;  // CPU offload: host<->device copy time not hidden behind other work
  double kept_copies_ms = 0.0;     // cpu_checkpointing: kept-input copy time the compute waited for
  // NVMe offload of the optimizer (EngineStats::last_step_disk; bytes as doubles so that windows average).
  double disk_step_ms = 0.0;       // the update's disk pass, within optimizer_ms
  double disk_step_wait_ms = 0.0;  // of that, the engine thread blocked on the disk
  double disk_grad_wait_ms = 0.0;  // the gradient worker blocked on the disk (during backward and step())
  double disk_step_read_bytes = 0.0;
  double disk_step_write_bytes = 0.0;
  double disk_grad_read_bytes = 0.0;
  double disk_grad_write_bytes = 0.0;
  double disk_param_read_bytes = 0.0;  // NVMe offload of params: read for the window's gathers
  double disk_param_wait_ms = 0.0;     // the gathers blocked on those reads

  double total_ms() const { return forward_ms + backward_ms + step_ms; }
  StepSplit& operator+=(const StepSplit& o);
  StepSplit scaled(double f) const;
};

// The start-up memory check of a UnitTrainer: the job's memory plan (zero3/engine/memory_plan.hpp) against
// the device's free memory, before the engine allocates anything.
struct MemoryCheck {
  int eval_batch = 0;  // windows of this rank's held-out pass (0: none)
  int len = 0;         // tokens per window
  // Device memory per rank: the host backend then simulates a device of this capacity (allocations past
  // it fail, as on a full GPU), and the CUDA device's free memory counts as at most this. Unset: the
  // device's own free memory (the host backend has no limit, so nothing to check).
  std::optional<std::uint64_t> device_memory_bytes;
  // The checkpoint staging area a save may fill (ckpt::CheckpointerOptions::staging_bytes), 0 without saves.
  std::uint64_t checkpoint_staging_bytes = 0;
  // The model's size before it declares its units (models::train_model_params, zero3.model.layers + 2), for
  // check_model_size; 0 of both: not checked.
  std::uint64_t model_params = 0;
  std::uint64_t model_units = 0;
};

// Refuses (ConfigError) a model whose fp32 master weights alone, this rank's shard of `params`, and the records
// of its `units` do not fit all the memory a rank could keep them in: its share of the host's memory, the
// device's free memory (`device_free_bytes`, where it is not the host's) and its share of the free space of the
// NVMe offload paths. A lower bound of the memory plan, cheap enough to run before the model declares its units,
// so that a model no memory could hold (10^8 layers) is refused instead of failing to allocate their specs.
// 0 params checks the units' records alone; 0 of both checks nothing.
void check_model_size(const config::Config& config, int world_size, int ranks_per_node, std::uint64_t params,
                      std::uint64_t units, std::optional<std::uint64_t> device_free_bytes);

// The activations part of a job's memory plan: what `model` plans for a train micro-batch of `micro_batch`
// windows and held-out passes of `eval_batch`, `len` tokens each, with `config`'s params dtype, checkpointing
// (zero3.model.activation_checkpointing) and cpu_checkpointing; `kind`: where the model keeps them.
ActivationPlan plan_activations(const models::UnitModel& model, const config::Config& config, std::int64_t micro_batch,
                                int eval_batch, int len, MemoryKind kind);

class UnitTrainer {
 public:
  // Makes the model for the engine's device once the engine exists (the device decides host or CUDA).
  using ModelFactory = std::function<std::unique_ptr<models::UnitModel>(Device& device)>;

  // Builds the engine, the model, plans the job's memory and checks it against the device (ConfigError
  // naming the categories when it does not fit, before anything is allocated), declares the model's units
  // and finalizes (collective). A null bootstrap lets the engine make the MPI one for `world`.
  UnitTrainer(const config::Config& config, const comm::World& world, std::shared_ptr<comm::Bootstrap> bootstrap,
              const ModelFactory& make_model, const MemoryCheck& check = {});
  ~UnitTrainer();
  UnitTrainer(const UnitTrainer&) = delete;
  UnitTrainer& operator=(const UnitTrainer&) = delete;

  Engine& engine() { return *engine_; }
  models::UnitModel& model() { return *model_; }
  // The job's memory plan, made at start-up (this rank's; every rank's is the same).
  const MemoryPlan& memory_plan() const { return plan_; }
  // The device memory of this rank that zero3.accumulation's memory policy measures against (set under
  // that policy only: the device's free memory at start-up, or --device-memory-gb, plus what the engine
  // holds then).
  std::optional<std::uint64_t> device_budget_bytes() const { return device_budget_bytes_; }
  // This process's resident memory when the trainer began, before the engine allocated (0: not known).
  std::uint64_t resident_base_bytes() const { return resident_base_bytes_; }
  // The batch as configured (engine().config().batch is the one in force, which that policy changes).
  const config::BatchConfig& configured_batch() const { return configured_batch_; }
  // The job's bootstrap (the one given, or the MPI one made for `world`): for the loop's own collectives.
  const std::shared_ptr<comm::Bootstrap>& bootstrap() const { return bootstrap_; }

  // Forward and backward of one micro-batch ([batch, len] windows); returns its mean loss.
  double micro_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len);
  // Engine::step() (timed under wall_clock_breakdown); at a boundary completes last_split().
  StepResult step();
  // Loss of a forward-only pass. Collective: every rank walks every unit, even with batch == 0.
  double eval(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len);

  bool timed() const { return timed_; }
  // The split of the last completed optimizer step (zeros without wall_clock_breakdown).
  const StepSplit& last_split() const { return last_split_; }

 private:
  // The model's activations, and the kept inputs it holds in host memory (cpu_checkpointing), to the tracker.
  void report_activations(std::size_t kept_host_bytes);
  void offload_kept_inputs(const config::Config& config);
  // Plans the job's memory (and, under zero3.accumulation's memory policy, picks the micro-batch it starts
  // with); ConfigError when the plan does not fit the device.
  void check_memory(const config::Config& config, const comm::World& world, const MemoryCheck& check);
  // Sets the engine's accumulation for the micro-batch the memory policy starts with, and reports it.
  void start_at(const config::Config& config, std::int64_t micro, int rank);
  MemoryPlan plan_for(const config::Config& config, const comm::World& world, const MemoryCheck& check,
                      std::int64_t micro_batch);

  bool timed_;
  bool sync_unit_boundaries_;  // activation_checkpointing.synchronize_checkpoint_boundary
  config::BatchConfig configured_batch_;
  std::shared_ptr<comm::Bootstrap> bootstrap_;
  // Destroyed after the engine, whose destructor drains the streams that may still read the model's buffers.
  std::unique_ptr<models::UnitModel> model_;
  std::unique_ptr<Engine> engine_;
  MemoryPlan plan_;
  std::uint64_t resident_base_bytes_ = 0;
  std::optional<std::uint64_t> device_budget_bytes_;
  std::size_t reported_activations_ = 0;
  MemoryKind reported_kind_ = MemoryKind::pageable_host;
  std::size_t reported_kept_bytes_ = 0;
  StepSplit window_;  // the accumulation window in progress
  StepSplit last_split_;
};

}  // namespace zero3::train
