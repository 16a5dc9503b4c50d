#include "zero3/train/train_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "zero3/core/error.hpp"
#include "zero3/core/json_integer.hpp"
#include "zero3/core/log.hpp"

namespace zero3::train {
namespace {

// Predicted tokens in a held-out measurement by default: its standard error at the floor is then about
// 0.015 nats for the shipped Markov sources (a per-token deviation near 1 nat), so the floor check
// (sinks.hpp) keeps its 0.05 minimum margin; fewer tokens widen it.
constexpr std::int64_t kHeldoutTokens = 4096;

std::unique_ptr<data::TokenSource> make_source(const config::Config& config) {
  data::TokenSourceOptions so;
  so.source = config.zero3.data.source;
  so.vocab_size = config.zero3.model ? config.zero3.model->vocab_size : 0;
  so.markov_order = config.zero3.data.markov_order;
  so.seed = config.zero3.seed;
  so.heldout_fraction = config.zero3.data.heldout_fraction;
  return data::make_token_source(so);
}

}  // namespace

std::int64_t heldout_windows_for(const TokenWindowsOptions& options, std::int64_t available) {
  const std::int64_t per_window = std::max<std::int64_t>(1, options.predictions_per_window);
  const std::int64_t wanted =
      options.heldout_windows > 0 ? options.heldout_windows : (kHeldoutTokens + per_window - 1) / per_window;
  return std::min(wanted, available);
}

TokenWindows::TokenWindows(const config::Config& config, int rank, int world_size, const TokenWindowsOptions& options)
    : options_(options),
      rank_(rank),
      world_size_(world_size),
      seed_(config.zero3.seed),
      global_batch_(config.batch.train_batch_size),
      source_(make_source(config)) {
  const std::int64_t context = options_.context;
  const std::int64_t train_samples = source_->num_samples(data::Split::train, context);
  if (train_samples < global_batch_) {
    throw ConfigError(fmt::format(
        "zero3.model.seq_len: a context of {} tokens leaves {} training window(s) of {} tokens in {}, fewer than "
        "one global batch ({}); use more data, a shorter context or a smaller batch",
        context, train_samples, context + 1, source_->describe(), global_batch_));
  }
  data::SamplerOptions sop;
  sop.num_samples = train_samples;
  sop.global_batch = global_batch_;
  sop.world_size = world_size;
  sop.rank = rank;
  sop.seed = seed_;
  sampler_.emplace(sop);
  heldout_total_ = heldout_windows_for(options_, source_->num_samples(data::Split::heldout, context));
  if (heldout_total_ < 1) {
    throw ConfigError(fmt::format("zero3.model.seq_len: a context of {} tokens leaves no held-out sample in {}",
                                  context, source_->describe()));
  }
}

void TokenWindows::append_window(data::Split split, std::int64_t index, TokenBatch& out) const {
  std::vector<data::TokenId> w(static_cast<std::size_t>(options_.context + 1));
  source_->tokens(split, index, options_.context, w);
  out.tokens.insert(out.tokens.end(), w.begin(), w.end() - 1);
  out.targets.insert(out.targets.end(), w.begin() + 1, w.end());
  ++out.batch;
}

TokenBatch TokenWindows::micro_batch(std::int64_t step, std::int64_t micro, std::int64_t micro_size) {
  TokenBatch b;
  b.len = static_cast<int>(options_.context);
  for (const std::int64_t i : sampler_->micro_batch(step, micro, micro_size)) append_window(data::Split::train, i, b);
  return b;
}

TokenBatch TokenWindows::heldout() {
  TokenBatch b;
  b.len = static_cast<int>(options_.context);
  for (std::int64_t i = rank_; i < heldout_total_; i += world_size_) append_window(data::Split::heldout, i, b);
  return b;
}

std::optional<double> TokenWindows::entropy_floor_se() const {
  const std::optional<double> sd = source_->floor_loss_sd();
  const std::int64_t tokens = heldout_total_ * options_.predictions_per_window;
  if (!sd || tokens <= 0) return std::nullopt;
  return *sd / std::sqrt(static_cast<double>(tokens));
}

nlohmann::json TokenWindows::position(std::int64_t steps) const {
  return {{"step", steps},
          {"seed", seed_},
          {"global_batch", global_batch_},
          {"samples_consumed", steps * global_batch_},
          {"data", source_->describe()}};
}

// Only a warning: a value that is not an integer int64 holds is quoted as it stands, and counts as different.
void TokenWindows::check_resume(const nlohmann::json& saved, std::int64_t step) const {
  const auto same = [&](const char* key, std::int64_t mine) {
    const auto it = saved.is_object() ? saved.find(key) : saved.end();
    if (it == saved.end()) return std::pair{true, fmt::format("{}", mine)};  // older checkpoints: as this job's
    return std::pair{json_integer(*it) == mine, it->dump()};
  };
  const auto [same_batch, batch] = same("global_batch", global_batch_);
  const auto [same_seed, seed] = same("seed", seed_);
  if (same_batch && same_seed) return;
  log::warn(
      "resume: the checkpoint was trained with seed {} and global batch {}, this job has seed {} and batch {}: the "
      "data stream after step {} differs from the original run's",
      seed, batch, seed_, global_batch_, step);
}

}  // namespace zero3::train
