// DistributedSampler: which sample indices each rank trains on at each step. A pure function of
// (seed, step): no state to save or restore, the same global stream for every world size that divides the
// global batch, and disjoint ranks. Immutable after construction; const methods are thread-safe.
#pragma once

#include <cstdint>
#include <vector>

namespace zero3::data {

struct SamplerOptions {
  std::int64_t num_samples = 0;   // samples in the split (TokenSource::num_samples)
  std::int64_t global_batch = 0;  // samples per optimizer step, all ranks and micro-batches together
  std::int64_t world_size = 1;
  std::int64_t rank = 0;
  std::int64_t seed = 42;  // zero3.seed
  // true: an epoch is floor(num_samples / global_batch) steps and the remainder is skipped that epoch.
  // false: the last step of an epoch is completed by wrapping to the start of the same epoch's permutation,
  // so a few samples are seen twice in that epoch; every step still holds a full global batch.
  bool drop_last = true;
};

class DistributedSampler {
 public:
  // ConfigError when global_batch is not divisible by world_size, global_batch > num_samples (also what a
  // context longer than the data leads to), or a size or rank is out of range.
  explicit DistributedSampler(const SamplerOptions& options);

  std::int64_t num_samples() const { return num_samples_; }
  std::int64_t global_batch() const { return global_batch_; }
  std::int64_t per_rank_batch() const { return global_batch_ / world_size_; }
  std::int64_t steps_per_epoch() const { return steps_per_epoch_; }
  std::int64_t epoch_of(std::int64_t step) const { return step / steps_per_epoch_; }

  // Position `position` of epoch `epoch`'s permutation of [0, num_samples): a keyed bijection (a Feistel
  // network with cycle walking), so any element is computed without the rest and independent of world size.
  std::int64_t permuted(std::int64_t epoch, std::int64_t position) const;

  // This rank's per_rank_batch() sample indices at global step `step` (step >= 0). Step s of epoch
  // e = s / steps_per_epoch takes the global slice [j * B, (j + 1) * B) of epoch e's permutation, j the step
  // within the epoch, B the global batch; rank r takes slice elements r, r + W, r + 2W, ...
  std::vector<std::int64_t> indices(std::int64_t step) const;
  // The global slice of step `step` (all ranks, in slice order): for tests and logging.
  std::vector<std::int64_t> global_indices(std::int64_t step) const;
  // Micro-batch `micro` of this rank at `step` for gradient accumulation: elements
  // [micro * micro_batch_size, (micro + 1) * micro_batch_size) of indices(step). ConfigError when
  // micro_batch_size does not divide per_rank_batch(); UsageError when micro is out of range.
  std::vector<std::int64_t> micro_batch(std::int64_t step, std::int64_t micro, std::int64_t micro_batch_size) const;

 private:
  std::int64_t global_position(std::int64_t step, std::int64_t slot) const;  // sample at slot of the global slice

  std::int64_t num_samples_;
  std::int64_t global_batch_;
  std::int64_t world_size_;
  std::int64_t rank_;
  std::uint64_t seed_;
  bool drop_last_;
  std::int64_t steps_per_epoch_;
  int half_bits_;  // the Feistel domain is 2^(2 * half_bits_) >= num_samples
};

}  // namespace zero3::data
