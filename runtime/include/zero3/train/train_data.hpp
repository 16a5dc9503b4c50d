// What the training loop reads: this rank's micro-batches of token windows and its share of a held-out
// set. TokenWindows serves them from a data::TokenSource through the DistributedSampler (deterministic
// for a seed, resumable at any step, the same global batches at every world size); a trainer with
// other data implements TrainData itself. Rank-local: no collective calls.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "zero3/config/config.hpp"
#include "zero3/data/sampler.hpp"
#include "zero3/data/token_source.hpp"

namespace zero3::train {

// `batch` windows of `len` inputs and `len` targets, row-major [batch, len] (UnitModel::set_batch).
struct TokenBatch {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
  int batch = 0;
  int len = 0;
};

class TrainData {
 public:
  virtual ~TrainData() = default;
  // This rank's micro-batch `micro` (0 .. accumulation - 1) of optimizer step `step`, `micro_size` windows: the
  // step's samples of this rank are the same, in the same order, whatever micro_size cuts them into
  // (zero3.accumulation changes it between steps).
  virtual TokenBatch micro_batch(std::int64_t step, std::int64_t micro, std::int64_t micro_size) = 0;
  // This rank's share of the held-out set (possibly no window), and the windows of all ranks together.
  virtual TokenBatch heldout() = 0;
  virtual std::int64_t heldout_windows() const = 0;
  // Tokens the model predicts per window, for tokens/s.
  virtual std::int64_t predictions_per_window() const = 0;
  // The lowest loss any model can reach on this data, when known (a synthetic source's entropy rate).
  virtual std::optional<double> entropy_floor() const { return std::nullopt; }
  // The standard error of a held-out measurement of the best possible model around that floor: the source's
  // per-token loss deviation over the square root of the held-out tokens (treated as independent), when known.
  virtual std::optional<double> entropy_floor_se() const { return std::nullopt; }
  // Where the data stream stands after `steps` optimizer steps, saved in a checkpoint's trainer state;
  // check_resume() is given what a checkpoint saved and warns (log) when this stream differs.
  virtual nlohmann::json position(std::int64_t steps) const = 0;
  virtual void check_resume(const nlohmann::json& saved, std::int64_t step) const = 0;
  virtual std::string describe() const = 0;
};

// Windows of a TokenSource for the model of `config`'s zero3 block: seq_len inputs each; the sampler's
// global batch of train_batch_size windows per step; held-out windows rank-strided.
struct TokenWindowsOptions {
  std::int64_t context = 0;                 // seq_len
  std::int64_t predictions_per_window = 0;  // the GPT predicts every position, the MLP the last
  std::int64_t heldout_windows = 0;         // 0: enough for 4096 predicted tokens
};

// The held-out windows a TokenWindows with `options` measures when its source holds `available` of them:
// options.heldout_windows, or enough for 4096 predicted tokens, at most `available`. Rank r takes windows
// r, r + world_size, ..., so rank 0 holds ceil(total / world_size) of them.
std::int64_t heldout_windows_for(const TokenWindowsOptions& options, std::int64_t available);

class TokenWindows final : public TrainData {
 public:
  // Makes the config's source (zero3.data; vocab from zero3.model) and the sampler for `rank` of `world_size`.
  // ConfigError naming zero3.model.seq_len when the data holds less than one global batch or no
  // held-out window.
  TokenWindows(const config::Config& config, int rank, int world_size, const TokenWindowsOptions& options);

  TokenBatch micro_batch(std::int64_t step, std::int64_t micro, std::int64_t micro_size) override;
  TokenBatch heldout() override;
  std::int64_t heldout_windows() const override { return heldout_total_; }
  std::int64_t predictions_per_window() const override { return options_.predictions_per_window; }
  std::optional<double> entropy_floor() const override { return source_->entropy_floor(); }
  std::optional<double> entropy_floor_se() const override;
  nlohmann::json position(std::int64_t steps) const override;
  void check_resume(const nlohmann::json& saved, std::int64_t step) const override;
  std::string describe() const override { return source_->describe(); }

 private:
  void append_window(data::Split split, std::int64_t index, TokenBatch& out) const;

  TokenWindowsOptions options_;
  int rank_;
  int world_size_;
  std::int64_t seed_;
  std::int64_t global_batch_;
  std::unique_ptr<data::TokenSource> source_;
  std::optional<data::DistributedSampler> sampler_;
  std::int64_t heldout_total_ = 0;
};

}  // namespace zero3::train
