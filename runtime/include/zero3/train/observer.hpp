// The training loop's hooks: a TrainObserver is told about every optimizer step, every log interval,
// every completed checkpoint save, a resume, and an error that ends the run. Metric sinks (sinks.hpp: the log line,
// the progress line, JSONL, DeepSpeed's csv_monitor and tensorboard), the entropy-floor check and an embedder's own
// reporting are observers. Called on the loop's thread, on every rank; the figures in LogEvent are the
// same on every rank (averaged over the ranks), those in StepEvent are this rank's. An observer that
// throws from on_step/on_log/on_save ends the run with that error (on_error is then called).
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <vector>

#include "zero3/core/memory.hpp"
#include "zero3/engine/stats.hpp"
#include "zero3/train/unit_trainer.hpp"

namespace zero3::ckpt {
struct LoadResult;  // zero3/ckpt/checkpointer.hpp
struct SaveReport;
}  // namespace zero3::ckpt

namespace zero3::train {

struct StepEvent {
  std::int64_t step = 0;      // optimizer steps done, this one included
  std::int64_t steps = 0;     // of the run
  std::int64_t samples = 0;   // training samples consumed by all ranks so far (DeepSpeed's global_samples)
  double loss = 0.0;          // this rank's mean micro-batch loss over the accumulation window
  StepResult result;          // the boundary step()'s result
  double elapsed_s = 0.0;     // since the loop started
  double tokens_per_s = 0.0;  // predicted tokens (all ranks) per second since the loop started
};

struct LogEvent {
  std::int64_t step = 0;
  std::int64_t steps = 0;
  double train_loss = 0.0;    // mean over the ranks of their last step's loss
  double heldout_loss = 0.0;  // over the whole held-out set
  std::optional<double> entropy_floor;
  std::optional<double> entropy_floor_se;  // the held-out measurement's standard error at the floor
  StepResult result;
  double tokens_per_s = 0.0;  // of the steps since the last log line, held-out pass excluded
  bool timed = false;         // wall_clock_breakdown: `split` holds the mean step split since the last line
  StepSplit split;
  // memory_breakdown: each phase of the steps since the last line (forward/backward of each unit, the
  // held-out pass, reductions, optimizer step, checkpoint staging), with the bytes current when it ended and
  // its peak, by kind and category, on this rank.
  std::vector<MemoryTracker::PhaseStats> memory_phases;
  // Each kind and category's bytes on this rank now and at their peak since the run started.
  MemoryTracker::Snapshot memory_peaks{};
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  // The run continues from a checkpoint: before its first step, or after a loss-spike rollback.
  virtual void on_resume(const ckpt::LoadResult& /*loaded*/) {}
  virtual void on_step(const StepEvent& /*event*/) {}
  virtual void on_log(const LogEvent& /*event*/) {}
  // A save completed (committed, or failed with the previous checkpoint intact).
  virtual void on_save(const ckpt::SaveReport& /*report*/) {}
  // The run ends with `error` (rethrown after every observer has been told). Must not throw.
  virtual void on_error(const std::exception_ptr& /*error*/) noexcept {}
};

}  // namespace zero3::train
