// The five DeepSpeed schedules and the constant one. Each at(t) follows deepspeed/runtime/lr_schedules.py
// operation by operation in double (Python floats are doubles, math.log/cos are the C library's), so the
// values agree with DeepSpeed's to the last bit, not just within a tolerance.
#include "zero3/optim/lr_schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string_view>

#include "zero3/core/error.hpp"

namespace zero3::optim {

namespace {

using config::SchedulerConfig;
using config::SchedulerType;
using config::WarmupType;

// DeepSpeed writes betas = (beta1, 0.99) when cycling momentum; the second entry is fixed.
constexpr double kOneCycleBeta2 = 0.99;

void require_at_least(std::string_view key, std::int64_t value, std::int64_t minimum) {
  if (value < minimum) {
    throw ConfigError(fmt::format("scheduler.params.{}: must be >= {}, got {}", key, minimum, value));
  }
}

class ConstantSchedule final : public LrSchedule {
 public:
  explicit ConstantSchedule(double lr) : LrSchedule(-1), lr_(lr) {}
  LrValues at(std::int64_t /*t*/) const override { return {lr_, std::nullopt}; }

 private:
  double lr_;
};

// WarmupLR, and WarmupDecayLR (its subclass in DeepSpeed, which only changes gamma after warmup).
class WarmupSchedule final : public LrSchedule {
 public:
  explicit WarmupSchedule(const SchedulerConfig& s)
      : LrSchedule(s.last_batch_iteration),
        decay_(s.type == SchedulerType::warmup_decay_lr),
        log_(s.warmup_type == WarmupType::log),
        min_lr_(s.warmup_min_lr),
        delta_lr_(s.warmup_max_lr - s.warmup_min_lr),
        num_steps_(std::max<std::int64_t>(2, s.warmup_num_steps)),
        inverse_log_(1.0 / std::log(static_cast<double>(num_steps_))),
        total_steps_(s.total_num_steps) {}

  LrValues at(std::int64_t t) const override {
    if (t < 0) return {min_lr_, std::nullopt};
    return {min_lr_ + delta_lr_ * gamma(t), std::nullopt};
  }

 private:
  double gamma(std::int64_t t) const {
    if (t < num_steps_) {
      // DeepSpeed multiplies by a precomputed 1/ln(N); ln(t+1)/ln(N) would round differently.
      return log_ ? inverse_log_ * std::log(static_cast<double>(t + 1))
                  : static_cast<double>(t) / static_cast<double>(num_steps_);
    }
    if (!decay_) return 1.0;
    return std::max(
        0.0, static_cast<double>(total_steps_ - t) / std::max(1.0, static_cast<double>(total_steps_ - num_steps_)));
  }

  bool decay_;
  bool log_;
  double min_lr_;
  double delta_lr_;
  std::int64_t num_steps_;  // N = max(2, warmup_num_steps)
  double inverse_log_;
  std::int64_t total_steps_;
};

class WarmupCosineSchedule final : public LrSchedule {
 public:
  WarmupCosineSchedule(const SchedulerConfig& s, double optimizer_lr)
      : LrSchedule(s.last_batch_iteration),
        log_(s.warmup_type == WarmupType::log),
        org_lr_(optimizer_lr),
        warmup_min_ratio_(s.warmup_min_ratio),
        cos_min_ratio_(s.cos_min_ratio),
        num_steps_(std::max<std::int64_t>(2, s.warmup_num_steps)),
        inverse_log_(1.0 / std::log(static_cast<double>(num_steps_))),
        total_steps_(s.total_num_steps) {}

  LrValues at(std::int64_t t) const override { return {org_lr_ * ratio(t), std::nullopt}; }

 private:
  double ratio(std::int64_t t) const {
    if (t < 0) return 0.0;  // so optimizer step 1 of a fresh run applies lr 0
    if (t < num_steps_) {
      const double r = log_ ? inverse_log_ * std::log(static_cast<double>(t + 1))
                            : static_cast<double>(t) / static_cast<double>(num_steps_);
      return warmup_min_ratio_ + r * (1.0 - warmup_min_ratio_);
    }
    const std::int64_t real_last_step = t - num_steps_ + 1;
    const std::int64_t real_total_steps = std::max<std::int64_t>(1, total_steps_ - num_steps_);
    const double progress = std::min(1.0, static_cast<double>(real_last_step) / static_cast<double>(real_total_steps));
    const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    return std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
  }

  bool log_;
  double org_lr_;
  double warmup_min_ratio_;
  double cos_min_ratio_;
  std::int64_t num_steps_;
  double inverse_log_;
  std::int64_t total_steps_;
};

class OneCycleSchedule final : public LrSchedule {
 public:
  OneCycleSchedule(const SchedulerConfig& s, bool optimizer_has_betas)
      : LrSchedule(s.last_batch_iteration),
        first_size_(static_cast<double>(s.cycle_first_step_size)),
        second_size_(static_cast<double>(s.cycle_second_step_size)),
        total_size_(first_size_ + second_size_),
        step_ratio_(first_size_ / total_size_),
        first_stairs_(s.cycle_first_stair_count),
        second_stairs_(s.cycle_second_stair_count),
        min_lr_(s.cycle_min_lr),
        max_lr_(s.cycle_max_lr),
        decay_lr_rate_(s.decay_lr_rate),
        decay_step_size_(s.decay_step_size),
        // DeepSpeed turns momentum cycling off, with a warning, for optimizers without betas (Adagrad).
        momentum_(s.cycle_momentum && optimizer_has_betas),
        min_mom_(s.cycle_min_mom),
        max_mom_(s.cycle_max_mom),
        decay_mom_rate_(s.decay_mom_rate),
        skip_lr_decay_(s.decay_step_size == 0 || s.decay_lr_rate == 0.0),
        skip_mom_decay_(s.decay_step_size == 0 || s.decay_mom_rate == 0.0) {}

  LrValues at(std::int64_t t) const override {
    LrValues v;
    if (t == -1) {
      // The constructor writes lr = min and betas = (min_mom, 0.99); the cycle formula at t = -1 would give
      // beta1 = max_mom instead, so step 1 and step 2 of a fresh run differ in beta1 by the whole range.
      v.lr = min_lr_;
      if (momentum_) v.betas = std::array<double, 2>{min_mom_, kOneCycleBeta2};
      return v;
    }
    if (static_cast<double>(t) < total_size_) {
      const double s = scale_factor(t);
      v.lr = min_lr_ + (max_lr_ - min_lr_) * s;
      if (momentum_) v.betas = std::array<double, 2>{max_mom_ - (max_mom_ - min_mom_) * s, kOneCycleBeta2};
      return v;
    }
    const double decay_iteration = static_cast<double>(t) - total_size_ + 1.0;
    const double decay_interval = decay_iteration / static_cast<double>(decay_step_size_);
    v.lr = skip_lr_decay_ ? min_lr_ : min_lr_ / (1.0 + decay_lr_rate_ * decay_interval);
    if (momentum_) {
      const double beta1 = skip_mom_decay_ ? max_mom_ : max_mom_ * (1.0 + decay_mom_rate_ * decay_interval);
      v.betas = std::array<double, 2>{beta1, kOneCycleBeta2};
    }
    return v;
  }

 private:
  double scale_factor(std::int64_t t) const {
    const double batch = static_cast<double>(t + 1);
    const double cycle = std::floor(1.0 + batch / total_size_);
    const double x = 1.0 + batch / total_size_ - cycle;
    double scale = 0.0;
    std::int64_t stairs = 0;
    if (x <= step_ratio_) {
      scale = x / step_ratio_;
      stairs = first_stairs_;
    } else {
      scale = (x - 1.0) / (step_ratio_ - 1.0);
      stairs = second_stairs_;
    }
    if (stairs > 0) {
      // Stairs are counted from the integer position in the cycle, not from `scale` (DeepSpeed >= 0.19.4).
      const double cycle_iteration = std::fmod(batch, total_size_);
      const double count = static_cast<double>(stairs);
      const double position = cycle_iteration <= first_size_ ? cycle_iteration * count / first_size_
                                                             : (total_size_ - cycle_iteration) * count / second_size_;
      scale = std::floor(position) / count;
    }
    return scale;
  }

  double first_size_;
  double second_size_;
  double total_size_;
  double step_ratio_;
  std::int64_t first_stairs_;
  std::int64_t second_stairs_;
  double min_lr_;
  double max_lr_;
  double decay_lr_rate_;
  std::int64_t decay_step_size_;
  bool momentum_;
  double min_mom_;
  double max_mom_;
  double decay_mom_rate_;
  bool skip_lr_decay_;
  bool skip_mom_decay_;
};

class LrRangeTestSchedule final : public LrSchedule {
 public:
  explicit LrRangeTestSchedule(const SchedulerConfig& s)
      : LrSchedule(s.last_batch_iteration),
        min_lr_(s.lr_range_test_min_lr),
        step_size_(s.lr_range_test_step_size),
        step_rate_(s.lr_range_test_step_rate),
        staircase_(s.lr_range_test_staircase) {}

  LrValues at(std::int64_t t) const override {
    if (t == -1) return {min_lr_, std::nullopt};  // the constructor writes min_lr itself
    const double position = static_cast<double>(t + 1) / static_cast<double>(step_size_);
    const double interval = staircase_ ? std::floor(position) : position;
    return {min_lr_ * (1.0 + step_rate_ * interval), std::nullopt};
  }

 private:
  double min_lr_;
  std::int64_t step_size_;
  double step_rate_;
  bool staircase_;
};

// The parser enforces these; a Config built in code gets the same message instead of a division by zero.
void validate(const SchedulerConfig& s) {
  if (s.total_num_steps_from_run) {
    throw ConfigError(
        "scheduler.params.total_num_steps: \"auto\" and the run length is not known yet: call "
        "config::resolve_run_length(config, steps) before building the engine (zero3 train does it)");
  }
  require_at_least("last_batch_iteration", s.last_batch_iteration, -1);
  switch (s.type) {
    case SchedulerType::warmup_lr:
    case SchedulerType::warmup_decay_lr:
    case SchedulerType::warmup_cosine_lr:
      require_at_least("warmup_num_steps", s.warmup_num_steps, 1);
      break;
    case SchedulerType::one_cycle:
      require_at_least("cycle_first_step_size", s.cycle_first_step_size, 1);
      require_at_least("cycle_second_step_size", s.cycle_second_step_size, 0);
      require_at_least("cycle_first_stair_count", s.cycle_first_stair_count, 0);
      require_at_least("cycle_second_stair_count", s.cycle_second_stair_count, 0);
      require_at_least("decay_step_size", s.decay_step_size, 0);
      break;
    case SchedulerType::lr_range_test:
      require_at_least("lr_range_test_step_size", s.lr_range_test_step_size, 1);
      break;
  }
}

}  // namespace

std::unique_ptr<LrSchedule> LrSchedule::create(const config::SchedulerConfig* scheduler,
                                               const config::OptimizerConfig& optimizer) {
  if (scheduler == nullptr) return std::make_unique<ConstantSchedule>(optimizer.lr);
  validate(*scheduler);
  switch (scheduler->type) {
    case SchedulerType::warmup_lr:
    case SchedulerType::warmup_decay_lr:
      return std::make_unique<WarmupSchedule>(*scheduler);
    case SchedulerType::warmup_cosine_lr:
      return std::make_unique<WarmupCosineSchedule>(*scheduler, optimizer.lr);
    case SchedulerType::one_cycle:
      return std::make_unique<OneCycleSchedule>(*scheduler, optimizer.type != config::OptimizerType::adagrad);
    case SchedulerType::lr_range_test:
      return std::make_unique<LrRangeTestSchedule>(*scheduler);
  }
  throw UsageError(fmt::format("LrSchedule::create: unknown scheduler type {}", static_cast<int>(scheduler->type)));
}

std::unique_ptr<LrSchedule> LrSchedule::create(const config::Config& config) {
  if (!config.optimizer) {
    throw ConfigError("optimizer: the config has no optimizer block, so there is no learning rate to schedule");
  }
  return create(config.scheduler ? &*config.scheduler : nullptr, *config.optimizer);
}

std::vector<double> preview_lr(const config::Config& config, std::int64_t steps) {
  if (steps < 0) throw UsageError(fmt::format("preview_lr: steps must be >= 0, got {}", steps));
  const std::unique_ptr<LrSchedule> schedule = LrSchedule::create(config);
  std::vector<double> lrs;
  lrs.reserve(static_cast<std::size_t>(steps));
  for (std::int64_t s = 1; s <= steps; ++s) {
    lrs.push_back(schedule->current().lr);
    schedule->advance();  // every step applied: no fp16 overflow in a preview
  }
  return lrs;
}

}  // namespace zero3::optim
