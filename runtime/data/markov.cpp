#include "zero3/data/markov.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"

namespace zero3::data {
namespace {

constexpr double kStationaryTolerance = 1e-12;  // L1 change between power iterations
constexpr int kMaxStationaryIterations = 100000;
constexpr std::int64_t kMaxSuccessorEntries = std::int64_t{1} << 25;

// Keys of the independent random streams: the chain's tables, the two splits and the public streams.
constexpr std::uint64_t kChainKey = hash_name("zero3.data.markov.chain");
constexpr std::uint64_t kTrainKey = hash_name("zero3.data.markov.train");
constexpr std::uint64_t kHeldoutKey = hash_name("zero3.data.markov.heldout");
constexpr std::uint64_t kStreamKey = hash_name("zero3.data.markov.stream");

std::uint64_t stream_key(std::uint64_t space, std::uint64_t index) {
  return mix64(space ^ mix64(index));
}

}  // namespace

MarkovSource::MarkovSource(const MarkovOptions& options)
    : vocab_size_(options.vocab_size),
      order_(options.markov_order),
      seed_(options.seed),
      successors_(options.successors_per_state),
      uniform_mix_(options.uniform_mix),
      heldout_fraction_(options.heldout_fraction),
      corpus_tokens_(options.corpus_tokens),
      num_states_(1) {
  if (vocab_size_ < 2 || vocab_size_ > std::numeric_limits<TokenId>::max()) {
    throw ConfigError(fmt::format("synthetic:markov: zero3.model.vocab_size must be in [2, {}], got {}",
                                  std::numeric_limits<TokenId>::max(), vocab_size_));
  }
  if (order_ < 1) {
    throw ConfigError(fmt::format("synthetic:markov: zero3.data.markov_order must be >= 1, got {}", order_));
  }
  for (std::int64_t i = 0; i < order_; ++i) {
    if (num_states_ > kMaxStates / vocab_size_) {
      throw ConfigError(fmt::format(
          "synthetic:markov: zero3.model.vocab_size^zero3.data.markov_order = {}^{} states exceeds the limit of "
          "{} (2^22); lower zero3.data.markov_order or zero3.model.vocab_size",
          vocab_size_, order_, kMaxStates));
    }
    num_states_ *= vocab_size_;
  }
  if (successors_ == 0) successors_ = std::min<std::int64_t>(vocab_size_, 8);
  if (successors_ < 1 || successors_ > vocab_size_) {
    throw ConfigError(fmt::format("synthetic:markov: successors_per_state must be in [1, vocab_size = {}], got {}",
                                  vocab_size_, successors_));
  }
  if (num_states_ * successors_ > kMaxSuccessorEntries) {
    throw ConfigError(fmt::format("synthetic:markov: {} states x {} successors exceeds the table limit of {} entries",
                                  num_states_, successors_, kMaxSuccessorEntries));
  }
  if (!(uniform_mix_ >= 0.0 && uniform_mix_ <= 1.0)) {
    throw ConfigError(fmt::format("synthetic:markov: uniform_mix must be in [0, 1], got {}", uniform_mix_));
  }
  if (!(heldout_fraction_ > 0.0 && heldout_fraction_ < 1.0)) {
    throw ConfigError(
        fmt::format("synthetic:markov: zero3.data.heldout_fraction must be in (0, 1), got {}", heldout_fraction_));
  }
  if (corpus_tokens_ < 1) {
    throw ConfigError(fmt::format("synthetic:markov: corpus_tokens must be >= 1, got {}", corpus_tokens_));
  }
  build_successors();
  solve_stationary();
  compute_entropy_rate();
}

void MarkovSource::build_successors() {
  const auto m = successors_;
  successor_tokens_.resize(static_cast<std::size_t>(num_states_ * m));
  successor_probs_.resize(static_cast<std::size_t>(num_states_ * m));
  // marked[t] == state: token t is already a successor of `state` (no clearing between states).
  std::vector<std::int64_t> marked(static_cast<std::size_t>(vocab_size_), -1);
  for (std::int64_t state = 0; state < num_states_; ++state) {
    const CounterRng rng(static_cast<std::uint64_t>(seed_), stream_key(kChainKey, static_cast<std::uint64_t>(state)));
    TokenId* tokens = successor_tokens_.data() + state * m;
    double* probs = successor_probs_.data() + state * m;
    // Floyd's sampling of m distinct tokens from [0, vocab): one draw each, no rejection loop.
    std::int64_t count = 0;
    for (std::int64_t j = vocab_size_ - m; j < vocab_size_; ++j) {
      auto t =
          static_cast<std::int64_t>(rng.bits(static_cast<std::uint64_t>(count)) % static_cast<std::uint64_t>(j + 1));
      if (marked[static_cast<std::size_t>(t)] == state) t = j;
      marked[static_cast<std::size_t>(t)] = state;
      tokens[count++] = static_cast<TokenId>(t);
    }
    // Exponential weights make the probabilities a Dirichlet(1) draw; the floor keeps each one positive.
    double total = 0.0;
    for (std::int64_t j = 0; j < m; ++j) {
      probs[j] = -std::log1p(-rng.uniform(static_cast<std::uint64_t>(j), 1)) + 1e-3;
      total += probs[j];
    }
    for (std::int64_t j = 0; j < m; ++j) probs[j] /= total;
  }
}

// Power iteration pi <- pi P. The sparse part pushes each state's mass to its successors' next states; the
// uniform part sends mix/V of the mass of every state sharing the last k-1 tokens u to each state (u, t).
// A purely sparse chain (mix = 0) may be periodic, so it iterates the lazy chain (I + P) / 2, which has the
// same stationary distributions and always converges.
void MarkovSource::solve_stationary() {
  const auto n = static_cast<std::size_t>(num_states_);
  const std::int64_t suffixes = num_states_ / vocab_size_;  // V^(k-1)
  const double sparse_weight = 1.0 - uniform_mix_;
  const double uniform_share = uniform_mix_ / static_cast<double>(vocab_size_);
  std::vector<double> pi(n, 1.0 / static_cast<double>(num_states_));
  std::vector<double> next(n);
  std::vector<double> by_suffix(static_cast<std::size_t>(suffixes));
  double change = 1.0;
  int iteration = 0;
  while (change >= kStationaryTolerance) {
    if (iteration == kMaxStationaryIterations) {
      throw Error(fmt::format(
          "synthetic:markov: the stationary distribution did not converge in {} iterations (L1 change {:.3g}); "
          "use uniform_mix > 0",
          kMaxStationaryIterations, change));
    }
    std::fill(next.begin(), next.end(), 0.0);
    // States sharing a suffix all push into the same V-entry block of `next`; visiting them together keeps
    // the scatter in one block at a time. Still memory-bound: ~0.3 s per iteration at 2^22 states.
    for (std::int64_t suffix = 0; suffix < suffixes; ++suffix) {
      const std::int64_t base = suffix * vocab_size_;
      double suffix_mass = 0.0;
      for (std::int64_t s = suffix; s < num_states_; s += suffixes) {
        const double mass = pi[static_cast<std::size_t>(s)];
        suffix_mass += mass;
        const TokenId* tokens = successor_tokens_.data() + s * successors_;
        const double* probs = successor_probs_.data() + s * successors_;
        for (std::int64_t j = 0; j < successors_; ++j) {
          next[static_cast<std::size_t>(base + tokens[j])] += sparse_weight * mass * probs[j];
        }
      }
      by_suffix[static_cast<std::size_t>(suffix)] = suffix_mass;
    }
    if (uniform_mix_ > 0.0) {
      for (std::int64_t s = 0; s < num_states_; ++s) {
        next[static_cast<std::size_t>(s)] += uniform_share * by_suffix[static_cast<std::size_t>(s / vocab_size_)];
      }
    } else {
      for (std::size_t s = 0; s < n; ++s) next[s] = 0.5 * (next[s] + pi[s]);
    }
    double total = 0.0;
    for (double p : next) total += p;
    change = 0.0;
    for (std::size_t s = 0; s < n; ++s) {
      next[s] /= total;  // keeps rounding from drifting the total away from 1
      change += std::abs(next[s] - pi[s]);
    }
    pi.swap(next);
    ++iteration;
  }
  stationary_iterations_ = iteration;
  stationary_ = std::move(pi);
  stationary_cdf_.resize(n);
  double running = 0.0;
  for (std::size_t s = 0; s < n; ++s) {
    running += stationary_[s];
    stationary_cdf_[s] = running;
  }
}

// H(P(.|s)) over the whole vocabulary: the m successors have q = (1 - mix) p + mix / V, the other V - m
// tokens q = mix / V each; summed in closed form so the cost is O(m) per state, not O(V).
// The second moment sum_x q log^2 q the same way, for the varentropy.
void MarkovSource::compute_entropy_rate() {
  const double uniform_share = uniform_mix_ / static_cast<double>(vocab_size_);
  const double others = static_cast<double>(vocab_size_ - successors_);
  const double log_share = uniform_share > 0.0 ? std::log(uniform_share) : 0.0;
  const double others_entropy = -others * uniform_share * log_share;
  const double others_square = others * uniform_share * log_share * log_share;
  double rate = 0.0;
  double second_moment = 0.0;
  for (std::int64_t s = 0; s < num_states_; ++s) {
    const double* probs = successor_probs_.data() + s * successors_;
    double h = others_entropy;
    double m2 = others_square;
    for (std::int64_t j = 0; j < successors_; ++j) {
      const double q = (1.0 - uniform_mix_) * probs[j] + uniform_share;
      if (q > 0.0) {
        const double l = std::log(q);
        h -= q * l;
        m2 += q * l * l;
      }
    }
    rate += stationary_[static_cast<std::size_t>(s)] * h;
    second_moment += stationary_[static_cast<std::size_t>(s)] * m2;
  }
  entropy_rate_ = rate;
  varentropy_ = std::max(0.0, second_moment - rate * rate);
  floor_loss_sd_ = std::sqrt(varentropy_);
}

std::int64_t MarkovSource::heldout_segments(std::int64_t total_segments) const {
  const auto held = static_cast<std::int64_t>(std::ceil(heldout_fraction_ * static_cast<double>(total_segments)));
  return std::clamp<std::int64_t>(held, 0, total_segments);
}

std::int64_t MarkovSource::num_samples(Split split, std::int64_t context_len) const {
  ZERO3_CHECK(context_len >= 1, fmt::format("context_len must be >= 1, got {}", context_len));
  const std::int64_t total = corpus_tokens_ / (context_len + 1);
  const std::int64_t held = heldout_segments(total);
  return split == Split::heldout ? held : total - held;
}

void MarkovSource::tokens(Split split, std::int64_t sample_index, std::int64_t context_len,
                          std::span<TokenId> out) const {
  const std::int64_t count = num_samples(split, context_len);
  ZERO3_CHECK(sample_index >= 0 && sample_index < count,
              fmt::format("synthetic:markov {} sample {} out of range [0, {}) for context_len {}", split_name(split),
                          sample_index, count, context_len));
  ZERO3_CHECK(static_cast<std::int64_t>(out.size()) == context_len + 1,
              fmt::format("synthetic:markov: out holds {} tokens, a window is context_len + 1 = {}", out.size(),
                          context_len + 1));
  const std::uint64_t space = split == Split::train ? kTrainKey : kHeldoutKey;
  generate_keyed(stream_key(space, static_cast<std::uint64_t>(sample_index)), out);
}

void MarkovSource::generate(std::uint64_t stream_id, std::span<TokenId> out) const {
  generate_keyed(stream_key(kStreamKey, stream_id), out);
}

std::vector<TokenId> MarkovSource::generate(std::uint64_t stream_id, std::int64_t length) const {
  ZERO3_CHECK(length >= 0, fmt::format("generate: length must be >= 0, got {}", length));
  std::vector<TokenId> out(static_cast<std::size_t>(length));
  generate(stream_id, out);
  return out;
}

// Counter index 0 draws the start state; index p >= k draws token p (lane 0: sparse or uniform, lane 1: which).
void MarkovSource::generate_keyed(std::uint64_t key, std::span<TokenId> out) const {
  if (out.empty()) return;
  const CounterRng rng(static_cast<std::uint64_t>(seed_), key);
  const double u0 = rng.uniform(0);
  auto state = static_cast<std::int64_t>(
      std::upper_bound(stationary_cdf_.begin(), stationary_cdf_.end(), u0 * stationary_cdf_.back()) -
      stationary_cdf_.begin());
  state = std::min(state, num_states_ - 1);
  const auto n = static_cast<std::int64_t>(out.size());
  std::int64_t digits = state;
  for (std::int64_t i = order_ - 1; i >= 0; --i) {
    if (i < n) out[static_cast<std::size_t>(i)] = static_cast<TokenId>(digits % vocab_size_);
    digits /= vocab_size_;
  }
  const std::int64_t suffixes = num_states_ / vocab_size_;
  for (std::int64_t pos = order_; pos < n; ++pos) {
    const auto counter = static_cast<std::uint64_t>(pos);
    const double pick = rng.uniform(counter, 1);
    TokenId next;
    if (rng.uniform(counter, 0) < uniform_mix_) {
      next = static_cast<TokenId>(
          std::min<std::int64_t>(static_cast<std::int64_t>(pick * static_cast<double>(vocab_size_)), vocab_size_ - 1));
    } else {
      const TokenId* tokens = successor_tokens_.data() + state * successors_;
      const double* probs = successor_probs_.data() + state * successors_;
      std::int64_t j = 0;
      double running = probs[0];
      while (j + 1 < successors_ && pick >= running) running += probs[++j];
      next = tokens[j];
    }
    out[static_cast<std::size_t>(pos)] = next;
    state = (state % suffixes) * vocab_size_ + next;
  }
}

std::int64_t MarkovSource::state_of(std::span<const TokenId> state_tokens) const {
  ZERO3_CHECK(static_cast<std::int64_t>(state_tokens.size()) == order_,
              fmt::format("a state is markov_order = {} tokens, got {}", order_, state_tokens.size()));
  std::int64_t state = 0;
  for (TokenId t : state_tokens) {
    ZERO3_CHECK(t >= 0 && t < vocab_size_, fmt::format("token {} outside [0, {})", t, vocab_size_));
    state = state * vocab_size_ + t;
  }
  return state;
}

double MarkovSource::probability_from_state(std::int64_t state, TokenId next) const {
  double p = uniform_mix_ / static_cast<double>(vocab_size_);
  const TokenId* tokens = successor_tokens_.data() + state * successors_;
  const double* probs = successor_probs_.data() + state * successors_;
  for (std::int64_t j = 0; j < successors_; ++j) {
    if (tokens[j] == next) p += (1.0 - uniform_mix_) * probs[j];
  }
  return p;
}

double MarkovSource::transition_probability(std::span<const TokenId> state_tokens, TokenId next) const {
  ZERO3_CHECK(next >= 0 && next < vocab_size_, fmt::format("token {} outside [0, {})", next, vocab_size_));
  return probability_from_state(state_of(state_tokens), next);
}

std::string MarkovSource::describe() const {
  return fmt::format(
      "synthetic:markov vocab_size={} order={} states={} successors_per_state={} uniform_mix={} "
      "entropy_rate={:.6f} nats/token ({} tokens, heldout_fraction={})",
      vocab_size_, order_, num_states_, successors_, uniform_mix_, entropy_rate_, corpus_tokens_, heldout_fraction_);
}

}  // namespace zero3::data
