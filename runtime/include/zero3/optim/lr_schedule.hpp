// DeepSpeed's learning-rate schedules (WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest) with
// their exact formulas and quirks (deepspeed/runtime/lr_schedules.py), evaluated in double in DeepSpeed's operation
// order so the values match its Python floats bit for bit. A schedule is built at iteration `last_batch_iteration`
// (-1 for a fresh run) and advanced once per *applied* optimizer step: steps skipped for fp16 overflow do not
// advance it. So applied step k of a fresh run uses the values at iteration k - 2 (step 1 uses the
// constructor's values, at iteration -1). Plain values; not thread-safe. Details: docs/optim.md.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "zero3/config/config.hpp"

namespace zero3::optim {

struct LrValues {
  double lr = 0.0;
  // OneCycle with cycle_momentum (and an optimizer that has betas) overrides the optimizer's betas with
  // (beta1, 0.99), as DeepSpeed writes them. nullopt: keep the optimizer's own betas.
  std::optional<std::array<double, 2>> betas;
};

class LrSchedule {
 public:
  // `scheduler` null: a constant schedule at the optimizer's lr. Throws zero3::ConfigError for parameters the
  // parser would have rejected (a zero step size, an iteration below -1), naming the JSON path.
  static std::unique_ptr<LrSchedule> create(const config::SchedulerConfig* scheduler,
                                            const config::OptimizerConfig& optimizer);
  // From a whole config; throws zero3::ConfigError when it has no optimizer block (no lr to schedule).
  static std::unique_ptr<LrSchedule> create(const config::Config& config);
  virtual ~LrSchedule() = default;

  // The values at iteration t (t == -1: as constructed, before the first step()).
  virtual LrValues at(std::int64_t t) const = 0;

  // The values the next applied step uses.
  LrValues current() const { return at(iteration_); }
  // After an applied step.
  void advance() { ++iteration_; }
  // For checkpoints: DeepSpeed's scheduler state is exactly this `last_batch_iteration`.
  std::int64_t iteration() const { return iteration_; }
  void set_iteration(std::int64_t t) { iteration_ = t; }

 protected:
  explicit LrSchedule(std::int64_t start_iteration) : iteration_(start_iteration) {}

 private:
  std::int64_t iteration_;
};

// The lr each optimizer step s = 1..steps applies when no step is skipped: what `zero3 config lr-schedule`
// prints. Throws zero3::ConfigError as LrSchedule::create(config) does; steps < 0 is a zero3::UsageError.
std::vector<double> preview_lr(const config::Config& config, std::int64_t steps);

}  // namespace zero3::optim
