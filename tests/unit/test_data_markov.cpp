// The synthetic Markov source: its exact entropy rate against an empirical estimate on a long generated
// sequence, closed-form cases (deterministic -> 0, uniform -> log V), the stationary solve against a brute-force
// pi P, determinism of windows, disjoint splits, and the errors that name config keys.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/data/markov.hpp"

using zero3::data::MarkovOptions;
using zero3::data::MarkovSource;
using zero3::data::Split;
using zero3::data::TokenId;

namespace {

// Average of -log P(x_t | previous k tokens) over a long stream: by the ergodic theorem this converges to the
// entropy rate, and it weights states by how often the generator actually visits them, not by the solved pi.
double empirical_entropy(const MarkovSource& chain, std::int64_t length) {
  const auto tokens = chain.generate(3, length);
  const auto k = static_cast<std::size_t>(chain.order());
  double total = 0.0;
  for (std::size_t t = k; t < tokens.size(); ++t) {
    const std::span<const TokenId> state(tokens.data() + t - k, k);
    total -= std::log(chain.transition_probability(state, tokens[t]));
  }
  return total / static_cast<double>(tokens.size() - k);
}

}  // namespace

TEST_CASE("markov: the exact entropy rate matches an empirical estimate over 1e6 tokens", "[data][markov]") {
  struct Case {
    std::int64_t vocab, order;
  };
  for (const Case c : {Case{16, 2}, Case{64, 1}, Case{8, 3}}) {
    const MarkovSource chain(MarkovOptions{.vocab_size = c.vocab, .markov_order = c.order, .seed = 11});
    const double exact = chain.entropy_rate();
    const double empirical = empirical_entropy(chain, 1'000'000);
    WARN("vocab " << c.vocab << " order " << c.order << ": exact " << exact << " empirical " << empirical
                  << " relative error " << std::abs(empirical - exact) / exact << " (" << chain.stationary_iterations()
                  << " power iterations)");
    REQUIRE(exact > 0.1);
    REQUIRE(exact < std::log(static_cast<double>(c.vocab)));
    REQUIRE(std::abs(empirical - exact) < 0.01 * exact);
  }
}

TEST_CASE("markov: the stationary distribution satisfies pi = pi P (brute force over every transition)",
          "[data][markov]") {
  const MarkovSource chain(MarkovOptions{.vocab_size = 6, .markov_order = 2, .seed = 5});
  const auto pi = chain.stationary();
  const std::int64_t v = chain.vocab_size();
  REQUIRE(static_cast<std::int64_t>(pi.size()) == v * v);
  std::vector<double> pushed(pi.size(), 0.0);
  double total = 0.0;
  for (std::int64_t s = 0; s < v * v; ++s) {
    total += pi[static_cast<std::size_t>(s)];
    REQUIRE(pi[static_cast<std::size_t>(s)] > 0.0);  // irreducible: every state has mass
    const TokenId state[2] = {static_cast<TokenId>(s / v), static_cast<TokenId>(s % v)};
    double row = 0.0;
    for (TokenId t = 0; t < v; ++t) {
      const double p = chain.transition_probability(state, t);
      row += p;
      pushed[static_cast<std::size_t>((s % v) * v + t)] += pi[static_cast<std::size_t>(s)] * p;
    }
    REQUIRE(row == Approx(1.0).margin(1e-12));
  }
  REQUIRE(total == Approx(1.0).margin(1e-12));
  for (std::size_t s = 0; s < pi.size(); ++s) REQUIRE(pushed[s] == Approx(pi[s]).margin(1e-11));
}

TEST_CASE("markov: the varentropy matches the variance of -log P over 1e6 tokens", "[data][markov]") {
  for (const std::int64_t order : {1, 2}) {
    const MarkovSource chain(MarkovOptions{.vocab_size = 16, .markov_order = order, .seed = 5});
    const auto tokens = chain.generate(7, 1'000'000);
    const auto k = static_cast<std::size_t>(chain.order());
    double sum = 0.0;
    double sum_sq = 0.0;
    for (std::size_t t = k; t < tokens.size(); ++t) {
      const double l =
          -std::log(chain.transition_probability(std::span<const TokenId>(tokens.data() + t - k, k), tokens[t]));
      sum += l;
      sum_sq += l * l;
    }
    const double n = static_cast<double>(tokens.size() - k);
    const double variance = sum_sq / n - (sum / n) * (sum / n);
    WARN("order " << order << ": varentropy " << chain.varentropy() << ", empirical " << variance);
    REQUIRE(chain.varentropy() > 0.1);
    REQUIRE(std::abs(variance - chain.varentropy()) < 0.03 * chain.varentropy());
    REQUIRE(chain.floor_loss_sd().value() == Approx(std::sqrt(chain.varentropy())));
  }
  // Uniform tokens: every token costs log V, no spread.
  const MarkovSource uniform(MarkovOptions{.vocab_size = 10, .markov_order = 1, .seed = 3, .uniform_mix = 1.0});
  REQUIRE(uniform.varentropy() == Approx(0.0).margin(1e-9));
}

TEST_CASE("markov: a deterministic chain has entropy rate 0 and a uniform one log(vocab)", "[data][markov]") {
  const MarkovSource deterministic(
      MarkovOptions{.vocab_size = 7, .markov_order = 2, .seed = 3, .successors_per_state = 1, .uniform_mix = 0.0});
  REQUIRE(deterministic.entropy_rate() == Approx(0.0).margin(1e-12));
  const auto tokens = deterministic.generate(0, 200);
  for (std::size_t t = 2; t < tokens.size(); ++t) {
    REQUIRE(deterministic.transition_probability(std::span<const TokenId>(tokens.data() + t - 2, 2), tokens[t]) == 1.0);
  }

  for (std::int64_t vocab : {2, 10, 257}) {
    const MarkovSource uniform(MarkovOptions{.vocab_size = vocab, .markov_order = 1, .seed = 3, .uniform_mix = 1.0});
    REQUIRE(uniform.entropy_rate() == Approx(std::log(static_cast<double>(vocab))).epsilon(1e-12));
  }
  // Every token a successor with Dirichlet weights and no mixing: strictly between 0 and log V.
  const MarkovSource dense(
      MarkovOptions{.vocab_size = 5, .markov_order = 1, .seed = 3, .successors_per_state = 5, .uniform_mix = 0.0});
  REQUIRE(dense.entropy_rate() > 0.0);
  REQUIRE(dense.entropy_rate() < std::log(5.0));
}

TEST_CASE("markov: windows are a pure function of the seed, split and index", "[data][markov]") {
  const MarkovOptions options{.vocab_size = 50, .markov_order = 2, .seed = 9, .corpus_tokens = 1 << 16};
  const MarkovSource a(options);
  const MarkovSource b(options);
  MarkovOptions other_seed = options;
  other_seed.seed = 10;
  const MarkovSource c(other_seed);
  const std::int64_t context = 127;
  std::vector<TokenId> wa(context + 1, -1), wb(context + 1, -2), wc(context + 1, -3);
  // Visit indices out of order, as a rank that owns a later slice would.
  for (std::int64_t i : {400, 3, 0, 17}) {
    a.tokens(Split::train, i, context, wa);
    b.tokens(Split::train, i, context, wb);
    c.tokens(Split::train, i, context, wc);
    REQUIRE(wa == wb);
    int same = 0;
    for (std::size_t t = 0; t < wa.size(); ++t) {
      REQUIRE((wa[t] >= 0 && wa[t] < 50));
      same += wa[t] == wc[t];
    }
    REQUIRE(same < 40);
  }
  REQUIRE(a.entropy_rate() == b.entropy_rate());
  REQUIRE(a.entropy_rate() != c.entropy_rate());
  REQUIRE(a.generate(4, 1000) == b.generate(4, 1000));
  REQUIRE(a.generate(4, 1000) != a.generate(5, 1000));
  // A longer stream extends a shorter one with the same id.
  const auto longer = a.generate(4, 1500);
  REQUIRE(std::vector<TokenId>(longer.begin(), longer.begin() + 1000) == a.generate(4, 1000));
}

TEST_CASE("markov: train and held-out splits are disjoint and sized by heldout_fraction", "[data][markov]") {
  const std::int64_t context = 16;
  const MarkovSource chain(MarkovOptions{
      .vocab_size = 64, .markov_order = 1, .seed = 2, .heldout_fraction = 0.1, .corpus_tokens = 17 * 1000 + 5});
  const std::int64_t train = chain.num_samples(Split::train, context);
  const std::int64_t heldout = chain.num_samples(Split::heldout, context);
  REQUIRE(train + heldout == 1000);
  REQUIRE(heldout == 100);
  std::set<std::vector<TokenId>> train_windows;
  std::vector<TokenId> window(context + 1);
  for (std::int64_t i = 0; i < train; ++i) {
    chain.tokens(Split::train, i, context, window);
    train_windows.insert(window);
  }
  REQUIRE(static_cast<std::int64_t>(train_windows.size()) == train);
  for (std::int64_t i = 0; i < heldout; ++i) {
    chain.tokens(Split::heldout, i, context, window);
    REQUIRE(train_windows.count(window) == 0);
  }
  REQUIRE(chain.entropy_floor().value() == chain.entropy_rate());
}

TEST_CASE("markov: errors name the config keys and the contract", "[data][markov]") {
  try {
    MarkovSource chain(MarkovOptions{.vocab_size = 50257, .markov_order = 2});
    FAIL("a 50257^2-state chain was accepted");
  } catch (const zero3::ConfigError& e) {
    const std::string what = e.what();
    REQUIRE_THAT(what, Catch::Contains("zero3.data.markov_order") && Catch::Contains("zero3.model.vocab_size") &&
                           Catch::Contains("50257^2"));
  }
  REQUIRE_NOTHROW(MarkovSource(MarkovOptions{.vocab_size = 2048, .markov_order = 1, .corpus_tokens = 100}));
  REQUIRE_THROWS_AS(MarkovSource(MarkovOptions{.vocab_size = 1, .markov_order = 1}), zero3::ConfigError);
  REQUIRE_THROWS_AS(MarkovSource(MarkovOptions{.vocab_size = 8, .markov_order = 0}), zero3::ConfigError);
  REQUIRE_THROWS_AS(MarkovSource(MarkovOptions{.vocab_size = 8, .markov_order = 1, .heldout_fraction = 1.0}),
                    zero3::ConfigError);

  const MarkovSource chain(MarkovOptions{.vocab_size = 8, .markov_order = 1, .corpus_tokens = 1000});
  std::vector<TokenId> window(10);
  REQUIRE_THROWS_AS(chain.tokens(Split::train, 0, 10, window), zero3::UsageError);  // needs 11 tokens
  const std::int64_t train = chain.num_samples(Split::train, 9);
  REQUIRE_NOTHROW(chain.tokens(Split::train, train - 1, 9, window));
  REQUIRE_THROWS_AS(chain.tokens(Split::train, train, 9, window), zero3::UsageError);
}
