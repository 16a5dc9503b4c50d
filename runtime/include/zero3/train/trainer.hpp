// The training loop for any UnitModel: micro-batches and gradient accumulation, held-out evaluation
// every log interval, checkpoint cadence and resume through ckpt::Checkpointer, and observers
// (observer.hpp) for metrics and policies. Collective: every rank runs it with the same options.
//
//   zero3::train::UnitTrainer unit_trainer(config, world, bootstrap, make_model);
//   zero3::train::TokenWindows data(config, world.rank, world.size, {.context = 32, .predictions_per_window = 32});
//   zero3::train::TrainerOptions options;
//   options.steps = 1000;
//   options.save_dir = "checkpoints";     // optional: saves every save_interval steps and at the end
//   options.save_interval = 100;
//   zero3::train::Trainer trainer(unit_trainer, data, options);
//   trainer.add_observer(std::make_shared<zero3::train::LogLine>(world.rank));
//   const zero3::train::TrainSummary s = trainer.run();
//
// One host thread drives it; the UnitTrainer and TrainData must outlive it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "zero3/ckpt/checkpointer.hpp"
#include "zero3/train/observer.hpp"
#include "zero3/train/preemption.hpp"
#include "zero3/train/train_data.hpp"
#include "zero3/train/unit_trainer.hpp"

namespace zero3::train {

struct TrainerOptions {
  std::int64_t steps = 0;                     // optimizer steps of the run (a resumed run continues up to it)
  std::int64_t log_interval = 0;              // steps between held-out measurements and LogEvents (0: only at the end)
  std::filesystem::path save_dir;             // checkpoint root; empty: no checkpoints
  std::optional<std::int64_t> save_interval;  // save every N steps (tags global_step<N>), and at the end
  // A checkpoint directory, a root (its latest), or "latest" (of save_dir); empty: start fresh.
  std::filesystem::path resume;
  ckpt::CheckpointerOptions checkpoint;
  // A rank's stop request (preemption.hpp) marks its next accumulation window (Engine::mark_stop_request,
  // carried by the step's all-reduce); when any rank marked it, all stop after that step and save.
  bool stop_on_request = true;
};

class StepGuard;           // step_guard.hpp
class MemoryAccumulation;  // accumulation.hpp

struct TrainSummary {
  std::int64_t start_step = 0;  // > 0 after a resume
  std::int64_t steps = 0;
  double wall_s = 0.0;
  double heldout_loss = 0.0;  // of the last LogEvent
  std::optional<double> entropy_floor;
  int failed_saves = 0;  // the run still completes; run() then throws CheckpointError
  // Set when the run stopped on request before `steps`: the step it stopped after and the checkpoint
  // saved there (synchronously, with save_dir). `steps` then still names the run's target.
  std::optional<Preemption> preempted;
};

class Trainer {
 public:
  // ConfigError for options that cannot work (steps < 1, a save interval or "latest" without save_dir).
  Trainer(UnitTrainer& unit_trainer, TrainData& data, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  void add_observer(std::shared_ptr<TrainObserver> observer);
  ckpt::Checkpointer& checkpointer() { return *checkpointer_; }

  // Resumes (when asked), trains up to options.steps, saves the final state (with save_dir) and waits for
  // the saves in flight. Failed saves are reported to the observers and as "checkpoint_save_failed" events
  // as they complete, and make run() throw CheckpointError at the end, after training completed. Each step
  // goes through the StepGuard (step_guard.hpp: non-finite losses, zero3.spike); a rollback it decides loads
  // the last checkpoint of save_dir (observers get on_resume) and continues from its step. A non-finite final
  // held-out loss throws NonFiniteError. A stop request (preemption.hpp) ends the loop after the step all
  // ranks agree on: the state is saved there and run() returns with `preempted` set (a failed save still
  // throws). Collective.
  TrainSummary run();

 private:
  struct Window;
  std::int64_t resume();
  double train_step(std::int64_t step);
  void inject_faults(std::int64_t step, std::int64_t& micro_batches);
  void maybe_save(std::int64_t done, bool force);
  bool stop_agreed(std::int64_t done);
  void finish_preemption(const std::vector<ckpt::SaveReport>& saves, double save_s);
  std::int64_t roll_back(std::int64_t step);
  void export_model_weights(const ckpt::SaveReport& r);
  void report_saves(const std::vector<ckpt::SaveReport>& reports);
  void log_interval(std::int64_t done, const StepResult& r, double loss, Window& window);
  double heldout_loss();
  template <typename Fn>
  void notify(const Fn& fn);

  UnitTrainer& unit_trainer_;
  TrainData& data_;
  TrainerOptions options_;
  std::unique_ptr<ckpt::Checkpointer> checkpointer_;
  std::unique_ptr<StepGuard> guard_;
  std::unique_ptr<MemoryAccumulation> accumulation_;  // zero3.accumulation.policy "memory" only
  std::vector<std::shared_ptr<TrainObserver>> observers_;
  TrainSummary summary_;
  StepResult last_result_;
  std::int64_t saved_step_ = -1;
  bool has_checkpoint_ = false;  // save_dir holds a checkpoint of this run (saved, or resumed from it)
};

}  // namespace zero3::train
