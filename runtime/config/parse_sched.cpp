// The scheduler block (https://www.deepspeed.ai/docs/config-json/ "Scheduler Parameters";
// deepspeed/runtime/lr_schedules.py): the five DeepSpeed schedules with their defaults and required
// params. "auto" is filled as the HF Trainer would: warmup_max_lr from the optimizer lr, total_num_steps from
// the run length (zero3.run.steps, else at run time), warmup_num_steps from HF's default of no warmup.
#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "parse_blocks.hpp"
#include "zero3/core/error.hpp"

namespace zero3::config::detail {

namespace {

constexpr std::array<std::string_view, 5> kSchedulers = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle",
                                                         "LRRangeTest"};
constexpr std::array<std::string_view, 15> kTorchSchedulers = {"LambdaLR",
                                                               "MultiplicativeLR",
                                                               "StepLR",
                                                               "MultiStepLR",
                                                               "ConstantLR",
                                                               "LinearLR",
                                                               "ExponentialLR",
                                                               "SequentialLR",
                                                               "CosineAnnealingLR",
                                                               "ChainedScheduler",
                                                               "ReduceLROnPlateau",
                                                               "CyclicLR",
                                                               "CosineAnnealingWarmRestarts",
                                                               "OneCycleLR",
                                                               "PolynomialLR"};

// A learning-rate-like param: a number, or DeepSpeed's per-parameter-group list (zero3 has one group).
Got get_rate(ObjectReader& r, std::string_view key, double& out) {
  const Json* j = r.has(key) ? r.raw(key) : nullptr;
  if (j != nullptr && j->is_array()) {
    if (j->empty() || !std::all_of(j->begin(), j->end(), [](const Json& e) { return e.is_number(); })) {
      r.error(key, "expected a number or a non-empty list of numbers, got an array with other values");
      return Got::invalid;
    }
    out = j->front().get<double>();
    r.not_implemented(key, "a per-parameter-group list: zero3 has one parameter group (give one number)");
    return Got::value;
  }
  return r.get_number(key, out);
}

void require(ObjectReader& r, std::string_view key, Got got) {
  if (got == Got::absent) r.error(key, "required key is missing");
}

// total_num_steps: "auto" is the run length (the HF Trainer's num_training_steps): zero3.run.steps when the
// config has it, else left to resolve_run_length at run time.
void read_total_steps(ObjectReader& r, Context& cx, SchedulerConfig& s) {
  const Got got = r.get_int("total_num_steps", s.total_num_steps);
  require(r, "total_num_steps", got);
  if (got != Got::automatic) return;
  if (cx.config.zero3.run) {
    s.total_num_steps = cx.config.zero3.run->steps;
    r.sink().resolved(r.path_of("total_num_steps"), json_text(s.total_num_steps), "\"auto\": zero3.run.steps");
    return;
  }
  s.total_num_steps_from_run = true;
  r.sink().resolved(r.path_of("total_num_steps"), "\"auto\"",
                    "at run time from the run length: zero3 train --steps / zero3.run.steps");
}

// warmup_num_steps: "auto" is what the HF Trainer fills in by default (warmup_steps 0, warmup_ratio 0: no
// warmup), raised to 1, the least DeepSpeed's warmup schedulers accept.
void read_warmup_steps(ObjectReader& r, SchedulerConfig& s) {
  if (r.get_int("warmup_num_steps", s.warmup_num_steps) != Got::automatic) return;
  s.warmup_num_steps = 1;
  r.sink().resolved(r.path_of("warmup_num_steps"), "1",
                    "\"auto\": HF Trainer's default is no warmup (warmup_steps 0); 1 is the least DeepSpeed accepts");
}

void read_warmup_lr(ObjectReader& r, Context& cx, SchedulerConfig& s, bool inherit_when_absent) {
  if (get_rate(r, "warmup_min_lr", s.warmup_min_lr) == Got::automatic) {
    s.warmup_min_lr = 0.0;
    r.sink().resolved(r.path_of("warmup_min_lr"), "0.0", "\"auto\": 0");
  }
  const Got max = get_rate(r, "warmup_max_lr", s.warmup_max_lr);
  if (max == Got::automatic || (max == Got::absent && inherit_when_absent)) {
    const std::string why = max == Got::automatic ? "\"auto\"" : "not given (WarmupLR inherits it)";
    if (cx.config.optimizer) {
      s.warmup_max_lr = cx.config.optimizer->lr;
      r.sink().resolved(r.path_of("warmup_max_lr"), json_text(s.warmup_max_lr),
                        fmt::format("{}: the optimizer lr", why));
    } else {
      s.warmup_max_lr = 1e-3;
      r.sink().resolved(r.path_of("warmup_max_lr"), json_text(s.warmup_max_lr),
                        fmt::format("{}: no optimizer lr known, the DeepSpeed default", why));
    }
  }
}

// DeepSpeed's warmup schedulers log a warning for any other string and warm up logarithmically.
void read_warmup_type(ObjectReader& r, SchedulerConfig& s) {
  const Json* j = r.raw("warmup_type");
  s.warmup_type = WarmupType::log;
  if (j == nullptr) return;
  if (!j->is_string()) {
    r.error("warmup_type", fmt::format("expected \"log\" or \"linear\", got {}", describe(*j)));
    return;
  }
  const std::string& t = j->get_ref<const std::string&>();
  if (t == "auto") {
    r.sink().resolved(r.path_of("warmup_type"), "\"log\"", "\"auto\": DeepSpeed's default");
  } else if (t == "linear") {
    s.warmup_type = WarmupType::linear;
  } else if (t != "log") {
    r.sink().lint(
        r.path_of("warmup_type"),
        fmt::format("unknown warmup type {}: log is used, as DeepSpeed does (\"log\" or \"linear\")", describe(*j)));
  }
}

void parse_params(ObjectReader& p, Context& cx, SchedulerConfig& s) {
  p.get_int("last_batch_iteration", s.last_batch_iteration);
  switch (s.type) {
    case SchedulerType::warmup_lr:
    case SchedulerType::warmup_decay_lr: {
      const bool decay = s.type == SchedulerType::warmup_decay_lr;
      if (decay) read_total_steps(p, cx, s);
      read_warmup_lr(p, cx, s, /*inherit_when_absent=*/!decay);
      read_warmup_steps(p, s);
      read_warmup_type(p, s);
      if (decay && !s.total_num_steps_from_run && s.total_num_steps > 0 && s.total_num_steps < s.warmup_num_steps) {
        p.warning("total_num_steps",
                  fmt::format("{} is less than warmup_num_steps ({})", s.total_num_steps, s.warmup_num_steps));
      }
      break;
    }
    case SchedulerType::warmup_cosine_lr:
      read_total_steps(p, cx, s);
      read_warmup_steps(p, s);
      p.get_number("warmup_min_ratio", s.warmup_min_ratio);
      p.get_number("cos_min_ratio", s.cos_min_ratio);
      read_warmup_type(p, s);
      break;
    case SchedulerType::one_cycle: {
      require(p, "cycle_min_lr", get_rate(p, "cycle_min_lr", s.cycle_min_lr));
      require(p, "cycle_max_lr", get_rate(p, "cycle_max_lr", s.cycle_max_lr));
      p.get_number("decay_lr_rate", s.decay_lr_rate);
      p.get_int("cycle_first_step_size", s.cycle_first_step_size);
      std::optional<std::int64_t> second_size, second_count;
      p.get_optional_int("cycle_second_step_size", second_size);
      s.cycle_second_step_size = second_size.value_or(s.cycle_first_step_size);
      p.get_int("cycle_first_stair_count", s.cycle_first_stair_count);
      p.get_optional_int("cycle_second_stair_count", second_count);
      s.cycle_second_stair_count = second_count.value_or(s.cycle_first_stair_count);
      p.get_int("decay_step_size", s.decay_step_size);
      p.get_bool("cycle_momentum", s.cycle_momentum);
      get_rate(p, "cycle_min_mom", s.cycle_min_mom);
      get_rate(p, "cycle_max_mom", s.cycle_max_mom);
      p.get_number("decay_mom_rate", s.decay_mom_rate);
      break;
    }
    case SchedulerType::lr_range_test:
      get_rate(p, "lr_range_test_min_lr", s.lr_range_test_min_lr);
      p.get_int("lr_range_test_step_size", s.lr_range_test_step_size);
      p.get_number("lr_range_test_step_rate", s.lr_range_test_step_rate);
      p.get_bool("lr_range_test_staircase", s.lr_range_test_staircase);
      break;
  }
}

}  // namespace

void parse_scheduler(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("scheduler");
  if (j == nullptr) return;
  ObjectReader r(*j, "scheduler", "scheduler", cx.sink);
  std::string type;
  const Got got = r.get_string("type", type);
  const Json* params = r.get_object("params");
  if (got == Got::absent) r.error("type", "required key is missing (WarmupLR, WarmupDecayLR, WarmupCosineLR, ...)");
  if (got != Got::value) {
    r.finish();
    return;
  }
  const auto it = std::find(kSchedulers.begin(), kSchedulers.end(), type);
  if (it == kSchedulers.end()) {
    if (std::find(kTorchSchedulers.begin(), kTorchSchedulers.end(), type) != kTorchSchedulers.end()) {
      r.not_implemented("type", fmt::format("torch.optim.lr_scheduler.{} is not implemented; its params are not "
                                            "checked",
                                            type));
      if (params != nullptr) r.skip("params");
    } else {
      std::string_view guess = closest_name(type, kSchedulers);
      if (guess.empty()) guess = closest_name(type, kTorchSchedulers);
      r.error("type", fmt::format("unknown scheduler type \"{}\" ({}DeepSpeed's are WarmupLR, WarmupDecayLR, "
                                  "WarmupCosineLR, OneCycle, LRRangeTest; names are case-sensitive)",
                                  type, guess.empty() ? "" : fmt::format("did you mean '{}'? ", guess)));
    }
    r.finish();
    return;
  }
  SchedulerConfig s;
  s.type = static_cast<SchedulerType>(it - kSchedulers.begin());
  s.warmup_max_lr = 1e-3;
  const std::string block = fmt::format("scheduler.params ({})", type);
  ObjectReader p(params ? *params : empty_object(), r.path_of("params"), block, cx.sink);
  parse_params(p, cx, s);
  p.finish();
  r.finish();
  cx.config.scheduler = s;
}

}  // namespace zero3::config::detail

namespace zero3::config {

void resolve_run_length(Config& config, std::int64_t steps) {
  if (steps < 1) throw UsageError(fmt::format("resolve_run_length: {} steps; a run needs at least 1", steps));
  if (config.scheduler && config.scheduler->total_num_steps_from_run) {
    config.scheduler->total_num_steps = steps;
    config.scheduler->total_num_steps_from_run = false;
  }
}

}  // namespace zero3::config
