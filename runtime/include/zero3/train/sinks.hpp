// Observers (observer.hpp) that report a run: the log line of each interval, the progress line between
// them, one JSON object per interval in a file, DeepSpeed's csv_monitor files, and the entropy-floor
// check of synthetic data. Each writes on rank 0 only (pass the rank); the floor check acts on every rank.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "zero3/config/config.hpp"
#include "zero3/train/observer.hpp"

namespace zero3::train {

// "step 100/2500  loss ...  heldout ...  lr ...", the step split under wall_clock_breakdown, completed
// saves, the resume line. Standard output. (A failed save is an event of the loop: trainer.hpp.)
class LogLine final : public TrainObserver {
 public:
  explicit LogLine(int rank) : rank_(rank) {}
  void on_resume(const ckpt::LoadResult& loaded) override;
  void on_log(const LogEvent& e) override;
  void on_save(const ckpt::SaveReport& report) override;

 private:
  int rank_;
};

// A line redrawn in place between log lines (step, loss, tokens/s, ETA), at most twice a second. Under
// mpirun a rank's stdout is a pseudo-terminal even when mpirun's own output goes to a file, so the
// caller decides whether to draw it (zero3 train --progress).
class ProgressLine final : public TrainObserver {
 public:
  explicit ProgressLine(int rank) : rank_(rank) {}
  void on_step(const StepEvent& e) override;
  void on_log(const LogEvent& e) override;  // clears the line before the log line is printed

 private:
  int rank_;
  std::chrono::steady_clock::time_point drawn_{};
};

// One JSON object per LogEvent: step, loss, heldout_loss, lr, grad_norm, loss_scale, skipped_steps,
// tokens_per_s, entropy_floor (when known) and time_ms (the step split, under wall_clock_breakdown).
// ConfigError naming the file when it cannot be written.
class JsonlMetrics final : public TrainObserver {
 public:
  JsonlMetrics(int rank, const std::filesystem::path& path);
  void on_log(const LogEvent& e) override;

 private:
  std::ofstream out_;
};

// DeepSpeed's csv_monitor layout: <output_path>/<job_name>/<event name with '/' -> '_'>.csv, each with a
// "step,<last part of the name>" header and one "step,value" row per step; the step is the count of
// training samples so far (DeepSpeed's global_samples). Events: Train/Samples/train_loss, .../lr and,
// with fp16, .../loss_scale.
class CsvMonitor final : public TrainObserver {
 public:
  CsvMonitor(int rank, const config::MonitorConfig& monitor, bool fp16);
  void on_step(const StepEvent& e) override;

 private:
  void write(const std::string& name, double value, std::int64_t samples);

  bool enabled_;
  bool fp16_;
  std::filesystem::path dir_;
  std::set<std::string> started_;
};

// memory_breakdown's lines under a log line: per phase, each kind's peak and its bytes at the phase's end
// (MiB), and the two largest device categories.
std::string memory_phase_lines(const std::vector<MemoryTracker::PhaseStats>& phases);

// A held-out loss below the data's entropy floor by more than the measurement's sampling noise means the
// model sees what it should not (a future token): the run stops with an Error. The margin is the larger of
// `min_margin` nats and `z` standard errors of the held-out measurement at the floor
// (LogEvent::entropy_floor_se): the loss of a finite held-out sample of even the best possible model falls
// below the floor by chance, about one standard error in six samples; beyond 5 of them it happens with
// probability below 3e-7 per measurement under the normal approximation. A non-finite held-out loss is not
// checked here (a diverged model; the trainer reports it when the run ends).
class EntropyFloorCheck final : public TrainObserver {
 public:
  static constexpr double kMinMargin = 0.05;
  static constexpr double kStandardErrors = 5.0;

  explicit EntropyFloorCheck(double min_margin = kMinMargin, double z = kStandardErrors)
      : min_margin_(min_margin), z_(z) {}
  // The margin below the floor that `e`'s held-out loss may reach.
  double margin(const LogEvent& e) const;
  void on_log(const LogEvent& e) override;

 private:
  double min_margin_;
  double z_;
};

}  // namespace zero3::train
