// TokenSource: where training and held-out token windows come from, behind one interface that a
// synthetic Markov chain (markov.hpp) and a token file (token_file.hpp) both implement.
// Every window is a pure function of (split, sample index, context length), so any rank can produce any
// sample without producing the rest. Sources are immutable after construction; all methods are const and
// safe to call from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace zero3::data {

using TokenId = std::int32_t;

enum class Split { train, heldout };

const char* split_name(Split split);

class TokenSource {
 public:
  virtual ~TokenSource() = default;

  // Token ids lie in [0, vocab_size()).
  virtual std::int64_t vocab_size() const = 0;
  // How many windows of context_len + 1 tokens the split holds (0 when the split is shorter than one window).
  virtual std::int64_t num_samples(Split split, std::int64_t context_len) const = 0;
  // Writes sample `sample_index` of `split`: context_len + 1 tokens (inputs are out[0, n-1), targets out[1, n)).
  // out.size() must be context_len + 1 and sample_index < num_samples(split, context_len); else UsageError.
  virtual void tokens(Split split, std::int64_t sample_index, std::int64_t context_len,
                      std::span<TokenId> out) const = 0;
  // The lowest achievable expected loss in nats/token, when the source knows it (the Markov chain's entropy
  // rate); nullopt for real data.
  virtual std::optional<double> entropy_floor() const { return std::nullopt; }
  // The standard deviation of the best model's per-token loss -log P(next | past) around that floor (the
  // square root of the source's varentropy), when known: how far the loss of a finite sample can fall below
  // the floor by chance.
  virtual std::optional<double> floor_loss_sd() const { return std::nullopt; }
  // One line for logs: what the source is and its sizes.
  virtual std::string describe() const = 0;
};

// The `zero3.data` and related settings a source needs; field names follow config.hpp.
struct TokenSourceOptions {
  std::string source = "synthetic:markov";  // zero3.data.source (docs/data.md)
  std::int64_t vocab_size = 0;              // zero3.model.vocab_size
  std::int64_t markov_order = 2;            // zero3.data.markov_order (synthetic:markov only)
  std::int64_t seed = 42;                   // zero3.seed (synthetic:markov only: the chain and its corpus)
  double heldout_fraction = 0.1;            // zero3.data.heldout_fraction, in (0, 1)
  std::int64_t markov_corpus_tokens = std::int64_t{1} << 26;  // synthetic corpus size, both splits together
};

// Parses options.source and builds the source. ConfigError for an unknown scheme (naming zero3.data.source),
// a bad heldout_fraction, or any error of the chosen source (a token file whose vocabulary exceeds
// zero3.model.vocab_size, a Markov chain too large, ...).
std::unique_ptr<TokenSource> make_token_source(const TokenSourceOptions& options);

}  // namespace zero3::data
