// LossScaler: DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py) line for
// line, with the scale factor fixed at 2 as DeepSpeed's config path leaves it.
#include "zero3/optim/loss_scaler.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "zero3/core/error.hpp"

namespace zero3::optim {

namespace {
constexpr double kScaleFactor = 2.0;
}  // namespace

LossScaler LossScaler::from_config(const config::Config& config) {
  const config::Fp16Config& f = config.fp16;
  if (!f.enabled) return fixed(1.0);  // bf16 and fp32: nothing to scale, and ZeRO-3 checks no overflow
  LossScaler s;
  s.checks_overflow_ = true;
  if (!f.dynamic_loss_scale()) {
    s.state_.scale = f.loss_scale;
    return s;
  }
  // The parser enforces these; a Config built in code gets the same message instead of a modulo by zero.
  if (f.loss_scale_window <= 0) {
    throw ConfigError(
        fmt::format("fp16.loss_scale_window: must be > 0 with dynamic loss scaling, got {}", f.loss_scale_window));
  }
  if (f.min_loss_scale <= 0) {
    throw ConfigError(
        fmt::format("fp16.min_loss_scale: must be > 0 with dynamic loss scaling, got {}", f.min_loss_scale));
  }
  if (f.hysteresis < 1) {
    throw ConfigError(fmt::format("fp16.hysteresis: must be >= 1, got {}", f.hysteresis));
  }
  s.dynamic_ = true;
  s.min_scale_ = static_cast<double>(f.min_loss_scale);
  s.window_ = f.loss_scale_window;
  s.hysteresis_ = f.hysteresis;
  s.consecutive_hysteresis_ = f.consecutive_hysteresis;
  s.state_.scale = std::ldexp(1.0, static_cast<int>(f.initial_scale_power));
  s.state_.hysteresis_left = f.hysteresis;
  return s;
}

LossScaler LossScaler::fixed(double scale) {
  LossScaler s;
  s.state_.scale = scale;
  return s;
}

void LossScaler::update(bool overflow) {
  State& st = state_;
  if (dynamic_) {
    if (overflow) {
      if (hysteresis_ == 1 || st.hysteresis_left == 1) {
        if (st.scale == min_scale_) {
          throw Error(fmt::format(
              "fp16 gradient overflow (inf/NaN) on optimizer step {} while the dynamic loss scale is already at "
              "fp16.min_loss_scale = {}: it cannot be lowered further, so the run stops (DeepSpeed raises here too). "
              "Look for the source of the inf/NaN (a learning rate that is too high, bad input data, a loss that "
              "overflows fp16 in the forward pass), or lower fp16.min_loss_scale, or train with bf16",
              st.iteration + 1, st.scale));
        }
        st.scale = std::max(st.scale / kScaleFactor, min_scale_);
      } else {
        --st.hysteresis_left;  // tolerated: the step is skipped, the scale kept
      }
      st.last_overflow = st.iteration;
    } else {
      if (consecutive_hysteresis_) st.hysteresis_left = hysteresis_;
      const std::int64_t stable = st.iteration - st.last_overflow - 1;
      if (stable > 0 && stable % window_ == 0) {
        if (!consecutive_hysteresis_) st.hysteresis_left = hysteresis_;
        st.scale *= kScaleFactor;  // no upper bound, as in DeepSpeed
      }
    }
  }
  ++st.iteration;
}

}  // namespace zero3::optim
