#include "zero3/data/sampler.hpp"

#include <fmt/format.h>

#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"

namespace zero3::data {
namespace {

constexpr int kFeistelRounds = 6;
constexpr std::uint64_t kEpochKey = hash_name("zero3.data.sampler.epoch");

}  // namespace

DistributedSampler::DistributedSampler(const SamplerOptions& options)
    : num_samples_(options.num_samples),
      global_batch_(options.global_batch),
      world_size_(options.world_size),
      rank_(options.rank),
      seed_(static_cast<std::uint64_t>(options.seed)),
      drop_last_(options.drop_last),
      steps_per_epoch_(0),
      half_bits_(1) {
  if (world_size_ < 1 || rank_ < 0 || rank_ >= world_size_) {
    throw ConfigError(fmt::format("sampler: rank {} outside world of size {}", rank_, world_size_));
  }
  if (global_batch_ < 1) {
    throw ConfigError(fmt::format("sampler: global batch must be >= 1, got {}", global_batch_));
  }
  if (global_batch_ % world_size_ != 0) {
    throw ConfigError(fmt::format(
        "sampler: global batch {} is not divisible by world size {}; every rank takes the same number of samples",
        global_batch_, world_size_));
  }
  if (num_samples_ < global_batch_) {
    throw ConfigError(fmt::format(
        "sampler: the split holds {} samples, fewer than one global batch of {}; use more data, a smaller batch, "
        "or a shorter context (a context longer than the data leaves too few windows)",
        num_samples_, global_batch_));
  }
  steps_per_epoch_ = drop_last_ ? num_samples_ / global_batch_ : (num_samples_ + global_batch_ - 1) / global_batch_;
  while ((std::uint64_t{1} << (2 * half_bits_)) < static_cast<std::uint64_t>(num_samples_)) ++half_bits_;
}

// A balanced Feistel network over 2 * half_bits_ bits is a bijection of [0, 4^half_bits_) for any round
// function; cycle walking (re-applying it until the value lands below num_samples) restricts it to a bijection
// of [0, num_samples). The domain is under 4 * num_samples, so a walk takes under 4 steps on average.
std::int64_t DistributedSampler::permuted(std::int64_t epoch, std::int64_t position) const {
  ZERO3_CHECK(epoch >= 0 && position >= 0 && position < num_samples_,
              fmt::format("sampler: epoch {} position {} outside [0, {})", epoch, position, num_samples_));
  const std::uint64_t key = mix64(seed_ ^ mix64(kEpochKey + static_cast<std::uint64_t>(epoch)));
  const std::uint64_t mask = (std::uint64_t{1} << half_bits_) - 1;
  auto x = static_cast<std::uint64_t>(position);
  do {
    std::uint64_t left = x >> half_bits_;
    std::uint64_t right = x & mask;
    for (int round = 0; round < kFeistelRounds; ++round) {
      const std::uint64_t f = mix64(key ^ mix64(right + (static_cast<std::uint64_t>(round) << 58)));
      const std::uint64_t new_right = left ^ (f & mask);
      left = right;
      right = new_right;
    }
    x = (left << half_bits_) | right;
  } while (x >= static_cast<std::uint64_t>(num_samples_));
  return static_cast<std::int64_t>(x);
}

std::int64_t DistributedSampler::global_position(std::int64_t step, std::int64_t slot) const {
  ZERO3_CHECK(step >= 0, fmt::format("sampler: step must be >= 0, got {}", step));
  const std::int64_t epoch = step / steps_per_epoch_;
  std::int64_t position = (step % steps_per_epoch_) * global_batch_ + slot;
  if (position >= num_samples_) position -= num_samples_;  // drop_last = false: wrap within the epoch
  return permuted(epoch, position);
}

std::vector<std::int64_t> DistributedSampler::indices(std::int64_t step) const {
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(per_rank_batch()));
  for (std::int64_t slot = rank_; slot < global_batch_; slot += world_size_) out.push_back(global_position(step, slot));
  return out;
}

std::vector<std::int64_t> DistributedSampler::global_indices(std::int64_t step) const {
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(global_batch_));
  for (std::int64_t slot = 0; slot < global_batch_; ++slot) out.push_back(global_position(step, slot));
  return out;
}

std::vector<std::int64_t> DistributedSampler::micro_batch(std::int64_t step, std::int64_t micro,
                                                          std::int64_t micro_batch_size) const {
  if (micro_batch_size < 1 || per_rank_batch() % micro_batch_size != 0) {
    throw ConfigError(fmt::format("sampler: micro-batch size {} does not divide the per-rank batch {} ({} / {})",
                                  micro_batch_size, per_rank_batch(), global_batch_, world_size_));
  }
  const std::int64_t micros = per_rank_batch() / micro_batch_size;
  ZERO3_CHECK(micro >= 0 && micro < micros,
              fmt::format("sampler: micro-batch {} outside [0, {}) at step {}", micro, micros, step));
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(micro_batch_size));
  for (std::int64_t i = micro * micro_batch_size; i < (micro + 1) * micro_batch_size; ++i) {
    out.push_back(global_position(step, rank_ + i * world_size_));
  }
  return out;
}

}  // namespace zero3::data
