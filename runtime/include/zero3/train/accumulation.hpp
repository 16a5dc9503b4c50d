// zero3.accumulation's "memory" policy: the micro-batch a rank trains with follows its device memory use,
// the gradient accumulation moving the other way, so that every optimizer step still takes the global batch
// and the same samples in the same order (the sampler hands out a step's per-rank samples in one order and
// cuts micro-batches from it: zero3/data/sampler.hpp). The job starts at the largest micro-batch whose
// memory plan stays within `high` of the device (starting_micro_batch); then each step's measured peak of
// device memory decides: above `high` on any rank for `rounds` steps in a row halves the micro-batch, below
// `low` on every rank for `rounds` steps doubles it, never past the one the plan started with (a micro-batch
// planned past `high` would only come back down: the measured use of a smaller one says nothing of it); the step
// right after a change, which starts with the old micro-batch's buffers still held, does not count. The ranks' marks
// ride on the step's all-reduce (Engine::mark_memory_pressure), so all ranks change together, at a boundary. Each
// change is an "accumulation_changed" event; the state travels in a checkpoint's trainer state.
//
//   MemoryAccumulation policy(config.zero3.accumulation, config.batch, start_micro, budget_bytes, rank);
//   policy.begin_step(engine);              // before a step's first micro-batch
//   ... micro-batches of engine.config().batch.train_micro_batch_size_per_gpu samples ...
//   policy.before_boundary(engine);         // before the window's last step()
//   StepResult r = engine.step();
//   policy.after_boundary(engine, r, step + 1);  // may change engine.config().batch for the next step
//
// The loop's thread only; no collective of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zero3/config/config.hpp"
#include "zero3/engine/engine.hpp"

namespace zero3::train {

// The micro-batches a rank can cut its per-rank batch into: the divisors of `per_rank_batch` up to
// `configured`, ascending.
std::vector<std::int64_t> micro_batch_choices(std::int64_t per_rank_batch, std::int64_t configured);

// The micro-batch a memory-policy job starts with: the largest of `choices` whose planned device peak
// (`planned_bytes(micro)`) is at most `high` x `budget_bytes`, else the smallest.
std::int64_t starting_micro_batch(const config::AccumulationSettings& settings,
                                  const std::vector<std::int64_t>& choices, std::uint64_t budget_bytes,
                                  const std::function<std::uint64_t(std::int64_t)>& planned_bytes);

class MemoryAccumulation {
 public:
  // `budget_bytes`: the device memory of this rank (what the plan is checked against); `batch`: the
  // configured batch; `ceiling`: the largest micro-batch to grow to (the one the job started with).
  MemoryAccumulation(const config::AccumulationSettings& settings, const config::BatchConfig& batch,
                     std::int64_t ceiling, std::uint64_t budget_bytes, int rank);

  // Starts the step's measurement (what ran between steps, a held-out pass, is not the step's).
  void begin_step(Engine& engine);
  // Marks the window with this rank's pressure: its peak device memory since begin_step() against high/low.
  void before_boundary(Engine& engine);
  // Counts the rounds from the ranks' marks in `result` and changes the engine's accumulation when due
  // (an event names it). `done`: the optimizer steps done, for the event. Returns whether it changed.
  bool after_boundary(Engine& engine, const StepResult& result, std::int64_t done);

  // This rank's last measured peak, as a fraction of the budget.
  double last_use() const { return last_use_; }

  // For a checkpoint's trainer state; restore() takes it back (absent: nothing changes) and sets the
  // engine's accumulation to the saved one, when this job's batch allows it (else a warning). A field of the
  // wrong type or out of range is a CheckpointError naming it and `source` (LoadResult::manifest).
  nlohmann::json state(const Engine& engine) const;
  void restore(Engine& engine, const nlohmann::json& trainer_state, const std::string& source = "the trainer state");
  static constexpr const char* kStateKey = "accumulation";

 private:
  void change(Engine& engine, std::int64_t micro, std::int64_t done, const char* why);

  config::AccumulationSettings settings_;
  std::vector<std::int64_t> choices_;
  std::uint64_t budget_bytes_;
  int rank_;
  int world_size_;
  std::int64_t high_rounds_ = 0;  // steps in a row with a rank above high
  std::int64_t low_rounds_ = 0;   // steps in a row with every rank below low
  bool settling_ = false;         // the next step follows a change
  double last_use_ = 0.0;
};

}  // namespace zero3::train
