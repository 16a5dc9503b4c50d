// The training loop's guard over each optimizer step: a non-finite micro-batch loss marks the window so the
// engine does not apply it (zero3.nonfinite decides the rest), and zero3.spike's loss-spike detector (off by
// default) with its action: skip, reset the moments and re-warm the lr, or roll back past the spike's
// batches. Decisions use figures equal on every rank; the state travels in checkpoints' trainer state so a
// resumed run decides as the straight one. The loop's thread only; collective calls are marked.
//
//   guard.on_micro_loss(loss);                 // after each micro-batch's backward, before its step()
//   guard.before_boundary(step, window_loss, has_checkpoint);  // before the window's last step()
//   StepResult r = engine.step();
//   guard.after_boundary(r);                   // reset_moments and the lr ramp act here
//   if (guard.rollback_due()) { ... load the last checkpoint ...; guard.rolled_back(loaded, step); }
#pragma once

#include <cstdint>
#include <deque>
#include <nlohmann/json.hpp>

#include "zero3/ckpt/checkpointer.hpp"
#include "zero3/ckpt/json_fields.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/engine.hpp"

namespace zero3::train {

// Spikes of a loss series against the running mean (and standard deviation) of the last `window` normal
// losses: ratio: loss > threshold x mean; zscore: loss > mean + threshold x std. Armed once warmup_steps
// losses were accepted (and at least 2). A spike's loss never joins the window, so a detected spike does not
// lift the baseline it is judged by. Pure: no engine, no communication.
class LossSpikeDetector {
 public:
  struct Verdict {
    bool armed = false;
    bool spike = false;
    double mean = 0.0;
    double std = 0.0;       // population standard deviation of the window
    double score = 0.0;     // ratio: loss / mean; zscore: (loss - mean) / std
    std::size_t count = 0;  // losses in the window
  };

  explicit LossSpikeDetector(const config::SpikeSettings& settings) : settings_(settings) {}
  Verdict check(double loss) const;  // changes nothing
  void accept(double loss);          // a normal step's loss joins the window
  nlohmann::json state() const;
  void restore(const nlohmann::json& state);
  // The same from a checkpoint's fields: CheckpointError naming the field when one is of the wrong type or
  // out of range.
  void restore(const ckpt::JsonFields& state);

 private:
  config::SpikeSettings settings_;
  std::deque<double> window_;
  std::int64_t accepted_ = 0;
};

class StepGuard {
 public:
  // ConfigError when zero3.spike's action is rollback but `can_save` is false (no --save-dir).
  StepGuard(Engine& engine, std::shared_ptr<comm::Bootstrap> bootstrap, bool can_save);

  // This rank's loss of one micro-batch: a non-finite one marks the window (Engine::discard_window).
  void on_micro_loss(double loss);
  // Before the boundary step() of step index `step` (0-based), with this rank's mean loss over the window.
  // Collective when zero3.spike is enabled (the mean over ranks); sets the lr ramp's factor. A spike is
  // logged as an event (loss, mean, std, score, threshold) and its window discarded. `checkpoint_exists`:
  // whether the save dir holds a checkpoint of this run to roll back to (else a rollback falls back to skip).
  // Throws Error after zero3.spike.max_consecutive spikes in a row.
  void before_boundary(std::int64_t step, double window_loss, bool checkpoint_exists);
  // After that step(): a pending reset_moments acts (moments zeroed, the lr ramp starts), the ramp advances.
  void after_boundary(const StepResult& result);
  // A rollback was decided at this boundary: load the last checkpoint, then call rolled_back().
  bool rollback_due() const { return rollback_due_; }
  // After the load: takes the checkpoint's guard state and moves the data past the skipped batches.
  // Returns the step index training continues from (the checkpoint's step).
  std::int64_t rolled_back(const ckpt::LoadResult& loaded, std::int64_t spike_step);

  // The data step optimizer step index `step` trains on (step + the batches skipped by rollbacks).
  std::int64_t data_step(std::int64_t step) const { return step + data_offset_; }
  // The guard's state for a checkpoint's trainer state, and its restore (absent: a fresh guard). `source`
  // names the file in errors (LoadResult::manifest): a field of the wrong type or out of range is a
  // CheckpointError naming it.
  nlohmann::json state() const;
  void restore(const nlohmann::json& trainer_state, const std::string& source = "the trainer state");
  static constexpr const char* kStateKey = "step_guard";

 private:
  double ramp_factor() const;
  void on_spike(std::int64_t step, double loss, const LossSpikeDetector::Verdict& v, bool checkpoint_exists);

  Engine& engine_;
  std::shared_ptr<comm::Bootstrap> bootstrap_;
  config::SpikeSettings settings_;
  LossSpikeDetector detector_;
  enum class Pending { none, reset_moments, rollback } pending_ = Pending::none;
  bool rollback_due_ = false;
  std::int64_t consecutive_spikes_ = 0;
  std::int64_t data_offset_ = 0;
  std::int64_t ramp_total_ = 0;  // reset_moments: the ramp's length; 0: no ramp
  std::int64_t ramp_done_ = 0;   // applied steps of it so far
};

}  // namespace zero3::train
