#include "zero3/train/step_guard.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "zero3/comm/typed_collectives.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"

namespace zero3::train {
namespace {

// The mean of `v` over the ranks, summed in rank order: the same bits on every rank.
double mean_over_ranks(comm::Bootstrap& b, double v) {
  return comm::sum_over_ranks(b, v) / static_cast<double>(b.size());
}

std::string_view action_name(config::SpikeAction a) {
  return config::to_string(a);
}

}  // namespace

// ---------------------------------------------------------------- LossSpikeDetector

LossSpikeDetector::Verdict LossSpikeDetector::check(double loss) const {
  Verdict v;
  v.armed = accepted_ >= settings_.warmup_steps && window_.size() >= 2;
  if (!v.armed || !std::isfinite(loss)) return v;
  v.count = window_.size();
  double sum = 0.0;
  for (const double x : window_) sum += x;
  v.mean = sum / static_cast<double>(window_.size());
  double sq = 0.0;
  for (const double x : window_) sq += (x - v.mean) * (x - v.mean);
  v.std = std::sqrt(sq / static_cast<double>(window_.size()));
  if (settings_.detector == config::SpikeDetector::ratio) {
    v.score = v.mean > 0.0 ? loss / v.mean : 0.0;
  } else if (v.std > 0.0) {
    v.score = (loss - v.mean) / v.std;
  } else {  // a constant window: any rise is infinitely many deviations
    v.score = loss > v.mean ? std::numeric_limits<double>::infinity() : 0.0;
  }
  v.spike = v.score > settings_.threshold;
  return v;
}

void LossSpikeDetector::accept(double loss) {
  if (!std::isfinite(loss)) return;
  window_.push_back(loss);
  while (static_cast<std::int64_t>(window_.size()) > settings_.window) window_.pop_front();
  ++accepted_;
}

nlohmann::json LossSpikeDetector::state() const {
  return {{"accepted", accepted_}, {"window", std::vector<double>(window_.begin(), window_.end())}};
}

void LossSpikeDetector::restore(const nlohmann::json& state) {
  restore(ckpt::JsonFields(state, "", "the loss spike detector's state"));
}

void LossSpikeDetector::restore(const ckpt::JsonFields& state) {
  accepted_ = state.i64_or("accepted", 0, 0);
  const std::vector<double> w = state.finite_numbers_or_empty("window");
  window_.assign(w.begin(), w.end());
  while (static_cast<std::int64_t>(window_.size()) > settings_.window) window_.pop_front();
}

// ---------------------------------------------------------------- StepGuard

StepGuard::StepGuard(Engine& engine, std::shared_ptr<comm::Bootstrap> bootstrap, bool can_save)
    : engine_(engine), bootstrap_(std::move(bootstrap)), settings_(engine.config().zero3.spike), detector_(settings_) {
  if (settings_.enabled && settings_.action == config::SpikeAction::rollback && !can_save) {
    throw ConfigError(
        "zero3.spike.action: \"rollback\" loads the last checkpoint of the run's save directory, but none is given "
        "(--save-dir, with --save-interval for checkpoints before the end)");
  }
}

void StepGuard::on_micro_loss(double loss) {
  if (!std::isfinite(loss)) engine_.discard_window(Engine::DiscardReason::nonfinite_loss);
}

double StepGuard::ramp_factor() const {
  if (ramp_total_ <= 0) return 1.0;
  return static_cast<double>(ramp_done_ + 1) / static_cast<double>(ramp_total_);
}

void StepGuard::before_boundary(std::int64_t step, double window_loss, bool checkpoint_exists) {
  engine_.set_lr_factor(ramp_factor());
  if (!settings_.enabled) return;
  const double loss = mean_over_ranks(*bootstrap_, window_loss);
  if (!std::isfinite(loss)) return;  // zero3.nonfinite's case: the engine skips the step
  const LossSpikeDetector::Verdict v = detector_.check(loss);
  if (!v.spike) {
    consecutive_spikes_ = 0;
    detector_.accept(loss);
    return;
  }
  on_spike(step, loss, v, checkpoint_exists);
}

void StepGuard::on_spike(std::int64_t step, double loss, const LossSpikeDetector::Verdict& v, bool checkpoint_exists) {
  ++consecutive_spikes_;
  config::SpikeAction action = settings_.action;
  std::string note;
  if (action == config::SpikeAction::rollback && !checkpoint_exists) {
    action = config::SpikeAction::skip;
    note = " (no checkpoint to roll back to yet: skipped instead)";
  }
  const bool ratio = settings_.detector == config::SpikeDetector::ratio;
  const std::string message = fmt::format(
      "loss spike at step {}: loss {:.6g} against a mean of {:.6g} (std {:.6g}) over the last {} steps, {} {:.4g} > "
      "{:.4g}; action {}{} ({} in a row)",
      step + 1, loss, v.mean, v.std, v.count, ratio ? "ratio" : "z", v.score, settings_.threshold, action_name(action),
      note, consecutive_spikes_);
  const bool limit = consecutive_spikes_ >= settings_.max_consecutive;
  if (bootstrap_->rank() == 0) {
    events::Event e;
    e.level = limit ? log::Level::error : log::Level::warning;
    e.kind = "loss_spike";
    e.step = step + 1;
    e.message = message;
    e.figures = {{"loss", loss},
                 {"mean", v.mean},
                 {"std", v.std},
                 {ratio ? "ratio" : "zscore", v.score},
                 {"threshold", settings_.threshold},
                 {"consecutive", static_cast<double>(consecutive_spikes_)}};
    e.fields = {{"detector", std::string(config::to_string(settings_.detector))},
                {"action", std::string(action_name(action))}};
    events::emit(e);
  }
  if (limit) {
    throw Error(fmt::format("{}: {} loss spikes in a row (zero3.spike.max_consecutive {}): the run is not recovering",
                            message, consecutive_spikes_, settings_.max_consecutive));
  }
  // Whatever the action, the spike's window is not applied.
  engine_.discard_window(Engine::DiscardReason::requested);
  pending_ = action == config::SpikeAction::reset_moments ? Pending::reset_moments
             : action == config::SpikeAction::rollback    ? Pending::rollback
                                                          : Pending::none;
}

void StepGuard::after_boundary(const StepResult& result) {
  if (ramp_total_ > 0 && result.applied && ++ramp_done_ >= ramp_total_) ramp_total_ = ramp_done_ = 0;
  const Pending pending = std::exchange(pending_, Pending::none);
  if (pending == Pending::reset_moments) {
    engine_.reset_moments();
    ramp_total_ = settings_.rewarm_steps;
    ramp_done_ = 0;
  }
  rollback_due_ = pending == Pending::rollback;
}

std::int64_t StepGuard::rolled_back(const ckpt::LoadResult& loaded, std::int64_t spike_step) {
  const std::int64_t spike_batch = data_step(spike_step);
  restore(loaded.trainer_state);
  rollback_due_ = false;
  // PaLM's remedy: the batches after the checkpoint are skipped, at least through the spike's own.
  const std::int64_t first_batch = std::max(loaded.step + data_offset_ + settings_.skip_batches, spike_batch + 1);
  const std::int64_t skipped = first_batch - (loaded.step + data_offset_);
  data_offset_ = first_batch - loaded.step;
  if (bootstrap_->rank() == 0) {
    events::Event e;
    e.level = log::Level::warning;
    e.kind = "loss_spike_rollback";
    e.step = spike_step + 1;
    e.message = fmt::format(
        "loss spike at step {}: rolled back to checkpoint '{}' (step {}); {} batch(es) skipped, training goes on "
        "with data batch {}",
        spike_step + 1, loaded.tag, loaded.step, skipped, first_batch);
    e.figures = {{"checkpoint_step", static_cast<double>(loaded.step)},
                 {"skipped_batches", static_cast<double>(skipped)},
                 {"first_batch", static_cast<double>(first_batch)}};
    e.fields = {{"checkpoint", loaded.tag}};
    events::emit(e);
  }
  return loaded.step;
}

nlohmann::json StepGuard::state() const {
  return {{"data_offset", data_offset_},
          {"ramp_total", ramp_total_},
          {"ramp_done", ramp_done_},
          {"consecutive_spikes", consecutive_spikes_},
          {"detector", detector_.state()}};
}

// Each counter at least 0; the data offset also leaves data_step() within int64 for any step of the run.
void StepGuard::restore(const nlohmann::json& trainer_state, const std::string& source) {
  const ckpt::JsonFields s = ckpt::JsonFields(trainer_state, "state.trainer", source).object_or_empty(kStateKey);
  constexpr std::int64_t kMax = ckpt::JsonFields::kMaxI64;
  data_offset_ = s.i64_or("data_offset", 0, 0, kMax / 2);
  ramp_total_ = s.i64_or("ramp_total", 0, 0);
  ramp_done_ = s.i64_or("ramp_done", 0, 0);
  consecutive_spikes_ = s.i64_or("consecutive_spikes", 0, 0);
  detector_ = LossSpikeDetector(settings_);
  detector_.restore(s.object_or_empty("detector"));
}

}  // namespace zero3::train
