// Loss scaling for fp16: DeepSpeed's dynamic algorithm reproduced exactly (DynamicLossScaler.update_scale in
// deepspeed/runtime/fp16/loss_scaler.py: window, hysteresis, consecutive_hysteresis, min_loss_scale and the error when
// an overflow hits the minimum), or a static scale. bf16 and fp32 use a static scale of 1. update() is called once per
// optimizer step at the accumulation boundary, overflow steps included. Plain value type, copyable for checkpoints.
#pragma once

#include <cstdint>

#include "zero3/config/config.hpp"

namespace zero3::optim {

class LossScaler {
 public:
  struct State {
    double scale = 1.0;
    std::int64_t iteration = 0;       // update() calls so far
    std::int64_t last_overflow = -1;  // iteration of the last overflow
    std::int64_t hysteresis_left = 1;
  };

  // fp16 with loss_scale 0: dynamic; fp16 with loss_scale > 0: that static scale (overflowing steps are still
  // detected and skipped); bf16/fp32: fixed(1.0). Throws zero3::ConfigError for a dynamic config the parser
  // would have rejected (window or min_loss_scale <= 0, hysteresis < 1).
  static LossScaler from_config(const config::Config& config);
  // A constant scale that never checks for overflow (bf16, fp32).
  static LossScaler fixed(double scale);

  double scale() const { return state_.scale; }
  bool dynamic() const { return dynamic_; }
  // Overflow checks are only needed (and only done, as in DeepSpeed's ZeRO-3) for fp16.
  bool checks_overflow() const { return checks_overflow_; }

  // Throws zero3::Error naming the scale when an overflow happens while the scale is already at
  // min_loss_scale (DeepSpeed aborts the run there). A no-op (beyond counting) unless dynamic().
  void update(bool overflow);

  const State& state() const { return state_; }
  void restore(const State& state) { state_ = state; }

 private:
  State state_;
  bool dynamic_ = false;
  bool checks_overflow_ = false;
  double min_scale_ = 1.0;
  std::int64_t window_ = 1000;
  std::int64_t hysteresis_ = 2;
  bool consecutive_hysteresis_ = false;
};

}  // namespace zero3::optim
