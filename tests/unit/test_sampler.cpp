// DistributedSampler: every rank's indices are a pure function of (seed, step); ranks are disjoint, an epoch
// covers every sample once, the global stream is the same for W = 1, 2, 4, resumes need no state, and epochs
// reshuffle.
#include <catch2/catch.hpp>
#include <set>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/data/sampler.hpp"

using zero3::data::DistributedSampler;
using zero3::data::SamplerOptions;

namespace {

DistributedSampler make(std::int64_t n, std::int64_t batch, std::int64_t world, std::int64_t rank,
                        std::int64_t seed = 42, bool drop_last = true) {
  return DistributedSampler(SamplerOptions{.num_samples = n,
                                           .global_batch = batch,
                                           .world_size = world,
                                           .rank = rank,
                                           .seed = seed,
                                           .drop_last = drop_last});
}

// The message of the ConfigError `fn` throws; fails the test when it throws nothing or something else.
template <class Fn>
std::string config_error(Fn fn) {
  try {
    fn();
  } catch (const zero3::ConfigError& e) {
    return e.what();
  }
  FAIL("no ConfigError thrown");
  return {};
}

}  // namespace

TEST_CASE("sampler: each epoch's order is a permutation of [0, n)", "[data][sampler]") {
  for (std::int64_t n : {1, 2, 3, 5, 17, 64, 1000, 4097}) {
    const auto sampler = make(n, 1, 1, 0);
    for (std::int64_t epoch : {0, 1, 7}) {
      std::vector<int> seen(static_cast<std::size_t>(n), 0);
      for (std::int64_t p = 0; p < n; ++p) ++seen[static_cast<std::size_t>(sampler.permuted(epoch, p))];
      for (int count : seen) REQUIRE(count == 1);
    }
  }
}

TEST_CASE("sampler: ranks are disjoint and an epoch covers every sample exactly once", "[data][sampler]") {
  const std::int64_t n = 1000, batch = 40, world = 4;
  std::vector<DistributedSampler> ranks;
  for (std::int64_t r = 0; r < world; ++r) ranks.push_back(make(n, batch, world, r));
  REQUIRE(ranks[0].steps_per_epoch() == 25);
  for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> seen(n, 0);
    for (std::int64_t step = epoch * 25; step < (epoch + 1) * 25; ++step) {
      std::set<std::int64_t> this_step;
      for (const auto& sampler : ranks) {
        const auto idx = sampler.indices(step);
        REQUIRE(static_cast<std::int64_t>(idx.size()) == batch / world);
        for (auto i : idx) {
          REQUIRE((i >= 0 && i < n));
          REQUIRE(this_step.insert(i).second);  // disjoint across ranks
          ++seen[static_cast<std::size_t>(i)];
        }
      }
    }
    for (int count : seen) REQUIRE(count == 1);  // disjoint across steps, and complete
  }
}

TEST_CASE("sampler: the remainder is dropped, or wrapped when drop_last is false", "[data][sampler]") {
  const std::int64_t n = 1003, batch = 40;
  const auto dropping = make(n, batch, 2, 1);
  REQUIRE(dropping.steps_per_epoch() == 25);
  std::set<std::int64_t> seen;
  for (std::int64_t step = 0; step < 25; ++step) {
    for (auto i : dropping.global_indices(step)) REQUIRE(seen.insert(i).second);
  }
  REQUIRE(seen.size() == 1000);

  const auto wrapping = make(n, batch, 2, 1, 42, false);
  REQUIRE(wrapping.steps_per_epoch() == 26);
  std::vector<int> counts(n, 0);
  for (std::int64_t step = 0; step < 26; ++step) {
    const auto idx = wrapping.global_indices(step);
    REQUIRE(idx.size() == 40);
    for (auto i : idx) ++counts[static_cast<std::size_t>(i)];
  }
  int twice = 0;
  for (int c : counts) {
    REQUIRE((c == 1 || c == 2));
    twice += c == 2;
  }
  REQUIRE(twice == 26 * 40 - 1003);
}

TEST_CASE("sampler: the global stream is the same for world sizes 1, 2 and 4", "[data][sampler]") {
  const std::int64_t n = 777, batch = 32;
  const auto single = make(n, batch, 1, 0, 5);
  for (std::int64_t world : {1, 2, 4}) {
    for (std::int64_t rank = 0; rank < world; ++rank) {
      const auto sampler = make(n, batch, world, rank, 5);
      for (std::int64_t step = 0; step < 60; ++step) {  // crosses two epoch boundaries (24 steps each)
        const auto global = single.indices(step);
        REQUIRE(sampler.global_indices(step) == global);
        const auto mine = sampler.indices(step);
        for (std::size_t i = 0; i < mine.size(); ++i) {
          REQUIRE(mine[i] == global[static_cast<std::size_t>(rank) + i * static_cast<std::size_t>(world)]);
        }
      }
    }
  }
}

TEST_CASE("sampler: resuming mid-epoch from a fresh sampler gives the same remaining stream", "[data][sampler]") {
  const auto original = make(500, 20, 2, 1, 8);
  std::vector<std::vector<std::int64_t>> stream;
  for (std::int64_t step = 0; step < 60; ++step) stream.push_back(original.indices(step));
  const auto resumed = make(500, 20, 2, 1, 8);  // nothing carried over but the options
  for (std::int64_t step = 37; step < 60; ++step) REQUIRE(resumed.indices(step) == stream[step]);
}

TEST_CASE("sampler: epochs and seeds reshuffle", "[data][sampler]") {
  const std::int64_t n = 1000;
  const auto a = make(n, 10, 1, 0, 1);
  const auto b = make(n, 10, 1, 0, 2);
  int same_epoch = 0, same_seed = 0, identity = 0;
  for (std::int64_t p = 0; p < n; ++p) {
    same_epoch += a.permuted(0, p) == a.permuted(1, p);
    same_seed += a.permuted(0, p) == b.permuted(0, p);
    identity += a.permuted(0, p) == p;
  }
  REQUIRE(same_epoch < 20);  // a random pair of permutations agrees in about 1 place
  REQUIRE(same_seed < 20);
  REQUIRE(identity < 20);
  REQUIRE(a.indices(0) != a.indices(100));  // step 0 of epochs 0 and 1
}

TEST_CASE("sampler: micro-batches split a rank's step in order", "[data][sampler]") {
  const auto sampler = make(4096, 64, 4, 3, 3);
  for (std::int64_t step : {0, 5, 70}) {
    const auto whole = sampler.indices(step);
    std::vector<std::int64_t> joined;
    for (std::int64_t micro = 0; micro < 4; ++micro) {
      const auto part = sampler.micro_batch(step, micro, 4);
      REQUIRE(part.size() == 4);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    REQUIRE(joined == whole);
  }
  REQUIRE_THROWS_AS(sampler.micro_batch(0, 0, 3), zero3::ConfigError);  // 3 does not divide 16
  REQUIRE_THROWS_AS(sampler.micro_batch(0, 4, 4), zero3::UsageError);
}

TEST_CASE("sampler: configuration errors are ConfigErrors that name the numbers", "[data][sampler]") {
  REQUIRE_THAT(config_error([] { make(100, 30, 4, 0); }),
               Catch::Contains("global batch 30 is not divisible by world size 4"));
  REQUIRE_THAT(config_error([] { make(10, 16, 2, 0); }),
               Catch::Contains("holds 10 samples, fewer than one global batch of 16"));
  REQUIRE_THROWS_AS(make(0, 16, 2, 0), zero3::ConfigError);  // a context longer than the data: no windows
  REQUIRE_THROWS_AS(make(100, 16, 2, 2), zero3::ConfigError);
  REQUIRE_THROWS_AS(make(100, 0, 1, 0), zero3::ConfigError);
  REQUIRE_THROWS_AS(make(100, 16, 2, 0).indices(-1), zero3::UsageError);
}
