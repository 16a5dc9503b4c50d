#include "zero3/train/accumulation.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "zero3/ckpt/json_fields.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"
#include "zero3/core/log.hpp"

namespace zero3::train {

std::vector<std::int64_t> micro_batch_choices(std::int64_t per_rank_batch, std::int64_t configured) {
  std::vector<std::int64_t> out;
  for (std::int64_t m = 1; m <= std::min(per_rank_batch, configured); ++m) {
    if (per_rank_batch % m == 0) out.push_back(m);
  }
  return out;
}

std::int64_t starting_micro_batch(const config::AccumulationSettings& settings,
                                  const std::vector<std::int64_t>& choices, std::uint64_t budget_bytes,
                                  const std::function<std::uint64_t(std::int64_t)>& planned_bytes) {
  if (choices.empty()) throw UsageError("starting_micro_batch: no micro-batch to choose from");
  const double limit = settings.high * static_cast<double>(budget_bytes);
  for (auto it = choices.rbegin(); it != choices.rend(); ++it) {
    if (static_cast<double>(planned_bytes(*it)) <= limit) return *it;
  }
  return choices.front();
}

MemoryAccumulation::MemoryAccumulation(const config::AccumulationSettings& settings, const config::BatchConfig& batch,
                                       std::int64_t ceiling, std::uint64_t budget_bytes, int rank)
    : settings_(settings),
      choices_(micro_batch_choices(batch.train_batch_size / batch.world_size,
                                   std::min(ceiling, batch.train_micro_batch_size_per_gpu))),
      budget_bytes_(budget_bytes),
      rank_(rank),
      world_size_(batch.world_size) {
  if (budget_bytes_ == 0) throw UsageError("MemoryAccumulation: a device budget of 0 bytes");
}

void MemoryAccumulation::begin_step(Engine& engine) {
  (void)engine.memory().take_window_peak(MemoryKind::device);
}

void MemoryAccumulation::before_boundary(Engine& engine) {
  const std::size_t peak = engine.memory().take_window_peak(MemoryKind::device);
  last_use_ = static_cast<double>(peak) / static_cast<double>(budget_bytes_);
  if (last_use_ > settings_.high) engine.mark_memory_pressure(Engine::MemoryPressure::high);
  if (last_use_ < settings_.low) engine.mark_memory_pressure(Engine::MemoryPressure::low);
}

bool MemoryAccumulation::after_boundary(Engine& engine, const StepResult& result, std::int64_t done) {
  // The first step after a change starts with the buffers of the old micro-batch still held: not counted.
  if (std::exchange(settling_, false)) return false;
  high_rounds_ = result.memory_high_ranks > 0 ? high_rounds_ + 1 : 0;
  low_rounds_ = result.memory_low_ranks == world_size_ ? low_rounds_ + 1 : 0;
  const std::int64_t micro = engine.config().batch.train_micro_batch_size_per_gpu;
  if (high_rounds_ >= settings_.rounds) {
    // The largest choice at most half the current one.
    const auto it = std::upper_bound(choices_.begin(), choices_.end(), micro / 2);
    if (it != choices_.begin()) {
      change(engine, *std::prev(it), done, "above high");
      return true;
    }
    if (high_rounds_ == settings_.rounds && rank_ == 0) {
      events::emit({.level = log::Level::warning,
                    .kind = "accumulation_at_minimum",
                    .step = done,
                    .message = fmt::format("zero3.accumulation: device memory above {:.0f}% on {} rank(s) for {} "
                                           "steps, and the micro-batch is 1 already",
                                           100.0 * settings_.high, result.memory_high_ranks, settings_.rounds),
                    .figures = {{"use", last_use_}, {"ranks_high", result.memory_high_ranks}}});
    }
    return false;
  }
  if (low_rounds_ >= settings_.rounds) {
    // The smallest choice at least twice the current one, else the largest above it.
    auto it = std::lower_bound(choices_.begin(), choices_.end(), 2 * micro);
    if (it == choices_.end() && choices_.back() > micro) it = std::prev(choices_.end());
    if (it != choices_.end()) {
      change(engine, *it, done, "below low");
      return true;
    }
  }
  return false;
}

void MemoryAccumulation::change(Engine& engine, std::int64_t micro, std::int64_t done, const char* why) {
  const config::BatchConfig before = engine.config().batch;
  const std::int64_t per_rank = before.train_batch_size / before.world_size;
  engine.set_accumulation(micro, per_rank / micro);
  const std::int64_t rounds = std::max(high_rounds_, low_rounds_);
  high_rounds_ = 0;
  low_rounds_ = 0;
  settling_ = true;
  if (rank_ != 0) return;  // every rank changes alike; one reports
  events::emit({.level = log::Level::info,
                .kind = "accumulation_changed",
                .step = done,
                .message = fmt::format(
                    "zero3.accumulation: device memory {} ({:.0f}% / {:.0f}%) for {} steps: micro-batch "
                    "{} -> {}, gradient accumulation {} -> {} from step {} (global batch {} kept)",
                    why, 100.0 * settings_.high, 100.0 * settings_.low, rounds, before.train_micro_batch_size_per_gpu,
                    micro, before.gradient_accumulation_steps, per_rank / micro, done + 1, before.train_batch_size),
                .figures = {{"micro_batch_from", static_cast<double>(before.train_micro_batch_size_per_gpu)},
                            {"micro_batch_to", static_cast<double>(micro)},
                            {"accumulation_from", static_cast<double>(before.gradient_accumulation_steps)},
                            {"accumulation_to", static_cast<double>(per_rank / micro)},
                            {"use", last_use_}},
                .fields = {{"reason", why}}});
}

nlohmann::json MemoryAccumulation::state(const Engine& engine) const {
  return {{"micro_batch", engine.config().batch.train_micro_batch_size_per_gpu},
          {"gradient_accumulation_steps", engine.config().batch.gradient_accumulation_steps},
          {"high_rounds", high_rounds_},
          {"low_rounds", low_rounds_},
          {"settling", settling_}};
}

void MemoryAccumulation::restore(Engine& engine, const nlohmann::json& trainer_state, const std::string& source) {
  const ckpt::JsonFields all(trainer_state, "state.trainer", source);
  if (!all.has(kStateKey)) return;
  const ckpt::JsonFields s = all.object_or_empty(kStateKey);
  const std::int64_t micro = s.i64("micro_batch", 1);
  if (!std::binary_search(choices_.begin(), choices_.end(), micro)) {
    log::warn(
        "resume: the checkpoint trained with micro-batch {}, which this job's batch does not allow; starting at {}",
        micro, engine.config().batch.train_micro_batch_size_per_gpu);
    return;
  }
  const config::BatchConfig& b = engine.config().batch;
  engine.set_accumulation(micro, b.train_batch_size / b.world_size / micro);
  high_rounds_ = s.i64_or("high_rounds", 0, 0);
  low_rounds_ = s.i64_or("low_rounds", 0, 0);
  settling_ = s.boolean_or("settling", false);
}

}  // namespace zero3::train
