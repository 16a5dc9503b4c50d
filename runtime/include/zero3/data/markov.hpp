// MarkovSource: a seeded random order-k Markov chain over tokens, with its exact entropy rate, serving
// deterministic token windows for training and held-out evaluation. The chain (successor tables,
// stationary distribution) is built once in the constructor and owned by the object; afterwards everything
// is const, pure and thread-safe: a window is a function of (seed, split, sample index, length) only.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zero3/data/token_source.hpp"

namespace zero3::data {

struct MarkovOptions {
  std::int64_t vocab_size = 0;            // zero3.model.vocab_size, >= 2
  std::int64_t markov_order = 2;          // k: the state is the last k tokens; vocab_size^k <= kMaxStates
  std::int64_t seed = 42;                 // zero3.seed: picks the chain and its corpus
  std::int64_t successors_per_state = 0;  // sparse successors per state; 0 = min(vocab_size, 8)
  // Probability that the next token is drawn uniformly from the whole vocabulary instead of from the sparse
  // successors. Any value > 0 makes every token possible after every state, so every state is reachable from
  // every other in exactly k and k + 1 steps: the chain is irreducible and aperiodic and its stationary
  // distribution unique. 0 gives a purely sparse chain (tests only: it may be reducible); 1 gives i.i.d.
  // uniform tokens.
  double uniform_mix = 0.02;
  double heldout_fraction = 0.1;                       // zero3.data.heldout_fraction, in (0, 1)
  std::int64_t corpus_tokens = std::int64_t{1} << 26;  // corpus size, both splits together
};

class MarkovSource final : public TokenSource {
 public:
  static constexpr std::int64_t kMaxStates = std::int64_t{1} << 22;

  // Builds the chain and solves for its stationary distribution by power iteration (about 35 iterations of
  // O(states x successors); ~0.1 s at 2^16 states, ~15 s at the 2^22 limit). ConfigError when vocab_size^k exceeds
  // kMaxStates (naming zero3.data.markov_order and zero3.model.vocab_size) or an option is out of range.
  explicit MarkovSource(const MarkovOptions& options);

  std::int64_t vocab_size() const override { return vocab_size_; }
  std::int64_t order() const { return order_; }
  std::int64_t num_states() const { return num_states_; }
  std::int64_t successors_per_state() const { return successors_; }

  // Sample i of a split is an independent segment of context_len + 1 tokens keyed by (seed, split, i) and
  // started from the stationary distribution; the corpus holds corpus_tokens / (context_len + 1) segments,
  // the last ceil(heldout_fraction * segments) of them held out. Train and held-out segments draw from
  // differently keyed random streams, so the splits are disjoint for every context length.
  std::int64_t num_samples(Split split, std::int64_t context_len) const override;
  void tokens(Split split, std::int64_t sample_index, std::int64_t context_len, std::span<TokenId> out) const override;
  std::optional<double> entropy_floor() const override { return entropy_rate_; }
  std::optional<double> floor_loss_sd() const override { return floor_loss_sd_; }
  std::string describe() const override;

  // The exact entropy rate H = sum_s pi(s) H(P(.|s)) in nats/token: the expected loss of the best possible
  // model on a long sequence from the chain.
  double entropy_rate() const { return entropy_rate_; }
  // The stationary chain's varentropy: Var[-log P(x_t | state)] = sum_s pi(s) sum_x P(x|s) log^2 P(x|s) - H^2,
  // the per-token variance of the best model's loss.
  double varentropy() const { return varentropy_; }
  // pi(s), indexed by state (the last k tokens read as base-vocab digits, oldest most significant).
  std::span<const double> stationary() const { return stationary_; }
  // Power iterations the stationary solve took and its final L1 change.
  int stationary_iterations() const { return stationary_iterations_; }

  // A stream of out.size() tokens keyed by stream_id, started from the stationary distribution: its first k
  // tokens are a state drawn from pi, each later token drawn from P(. | previous k tokens).
  void generate(std::uint64_t stream_id, std::span<TokenId> out) const;
  std::vector<TokenId> generate(std::uint64_t stream_id, std::int64_t length) const;

  // P(next | the k tokens in `state_tokens`, oldest first); state_tokens.size() must be k.
  double transition_probability(std::span<const TokenId> state_tokens, TokenId next) const;

 private:
  std::int64_t state_of(std::span<const TokenId> state_tokens) const;
  double probability_from_state(std::int64_t state, TokenId next) const;
  void generate_keyed(std::uint64_t key, std::span<TokenId> out) const;
  void build_successors();
  void solve_stationary();
  void compute_entropy_rate();
  std::int64_t heldout_segments(std::int64_t total_segments) const;

  std::int64_t vocab_size_;
  std::int64_t order_;
  std::int64_t seed_;
  std::int64_t successors_;
  double uniform_mix_;
  double heldout_fraction_;
  std::int64_t corpus_tokens_;
  std::int64_t num_states_;
  std::vector<TokenId> successor_tokens_;  // [state * successors_ + j]: distinct tokens
  std::vector<double> successor_probs_;    // [state * successors_ + j]: sparse probabilities, summing to 1
  std::vector<double> stationary_;         // pi(state)
  std::vector<double> stationary_cdf_;     // running sum of pi, for drawing a start state
  int stationary_iterations_ = 0;
  double entropy_rate_ = 0.0;
  double varentropy_ = 0.0;
  double floor_loss_sd_ = 0.0;
};

}  // namespace zero3::data
