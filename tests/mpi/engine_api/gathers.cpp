// Gathers against the live budget and their traffic: release after use, prefetch within
// max_live_parameters, reuse within max_reuse_distance, trace rebuilds, untraced evaluation passes, the
// step's wall-clock breakdown, and one all-gather per use and one reduce-scatter per unit.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "api_fixtures.hpp"

using namespace zero3;
using namespace zero3::test::engine_api;
using Catch::Matchers::Contains;

namespace {
// Sizes that are multiples of 64 * 12, so no unit is padded at world sizes 1-4: unpadded element counts
// (stats) and padded bytes (memory tracker) then describe the same buffers.
const std::vector<UnitSpec> kLayers = {flat_unit("l0", 768),  flat_unit("l1", 1536), flat_unit("l2", 768),
                                       flat_unit("l3", 2304), flat_unit("l4", 768),  flat_unit("l5", 1536)};
constexpr std::uint64_t kLayersTotal = 768 * 3 + 1536 * 2 + 2304;
constexpr std::uint64_t kLargest = 2304;
}  // namespace

TEST_CASE("gathers are released after use when reuse is off", "[engine][gather]") {
  ConfigText text;
  text.zero =
      R"("stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0)";
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  declare(*e, kLayers);
  const std::vector<std::string> order = names(kLayers);
  for (int window = 0; window < 2; ++window) {
    for (const UnitSpec& u : kLayers) {
      auto g = e->gather(u.name);
      CHECK(e->stats().gathered_elems == u.params[0].numel());
    }
    CHECK(e->stats().gathered_elems == 0);
    forward_backward(*e, order, window);
    CHECK(e->stats().gathered_elems == 0);
    CHECK(e->step().applied);
  }
  const EngineStats s = e->stats();
  CHECK(s.last_step_all_gather_elems == 3 * kLayersTotal);  // the extra forward above, then forward and backward
  CHECK(s.gathered_peak_elems == kLargest);
  CHECK(e->memory().get(MemoryKind::device, MemCategory::param_gathered).current_bytes == 0);
}

TEST_CASE("prefetch stays within max_live_parameters", "[engine][gather]") {
  ConfigText text;
  text.zero = R"("stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 3000,
                 "stage3_max_live_parameters": 4000, "stage3_param_persistence_threshold": 0)";
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  declare(*e, kLayers);
  const std::vector<std::string> order = names(kLayers);
  forward_backward(*e, order, 0);  // records the trace
  CHECK(e->step().applied);
  e->reset_peaks();
  for (int window = 1; window < 4; ++window) {
    forward_backward(*e, order, window);
    CHECK(e->step().applied);
  }
  const EngineStats s = e->stats();
  CHECK(s.gathered_peak_elems <= 4000 + kLargest);
  CHECK(s.gathered_peak_elems > kLargest);  // prefetching did overlap gathers
  CHECK(e->memory().get(MemoryKind::device, MemCategory::param_gathered).peak_bytes <= (4000 + kLargest) * 4);
  CHECK(s.last_step_all_gather_elems == 2 * kLayersTotal);
  CHECK(s.gathered_elems == 0);
  CHECK(s.trace_rebuilds == 0);
}

TEST_CASE("a unit used again soon stays gathered (max_reuse_distance)", "[engine][gather]") {
  ConfigText text;
  text.zero = R"("stage3_param_persistence_threshold": 0)";  // reuse distance and live budget: DeepSpeed's defaults
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  declare(*e, kLayers);
  const std::vector<std::string> order = names(kLayers);
  forward_backward(*e, order, 0);
  CHECK(e->step().applied);
  CHECK(e->stats().last_step_all_gather_elems == 2 * kLayersTotal);  // no trace yet: nothing kept
  forward_backward(*e, order, 1);
  CHECK(e->step().applied);
  // The last unit of the forward is the first of the backward: kept, so gathered once. The others are
  // kept too when their next use is near enough, which with a 1e9 distance is every backward gather.
  CHECK(e->stats().last_step_all_gather_elems == kLayersTotal);
  CHECK(e->stats().gathered_elems == 0);  // all released at the step: the gathered copies are stale
}

TEST_CASE("a changed gather order rebuilds the trace once", "[engine][gather]") {
  ConfigText text;
  text.zero = R"("stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 3000,
                 "stage3_max_live_parameters": 5000, "stage3_param_persistence_threshold": 0)";
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  declare(*e, kLayers);
  std::vector<std::string> order = names(kLayers);
  for (int window = 0; window < 3; ++window) {
    forward_backward(*e, order, window);
    CHECK(e->step().applied);
  }
  CHECK(e->stats().trace_rebuilds == 0);
  std::swap(order[1], order[2]);
  for (int window = 3; window < 6; ++window) {
    forward_backward(*e, order, window);
    CHECK(e->step().applied);
    CHECK(e->stats().trace_rebuilds == 1);
    CHECK(e->stats().last_step_all_gather_elems == 2 * kLayersTotal);
  }
  // A shorter window (one unit left out) is a change too.
  order.pop_back();
  forward_backward(*e, order, 6);
  CHECK(e->step().applied);
  CHECK(e->stats().trace_rebuilds == 2);
}

TEST_CASE("an evaluation pass inside untraced() leaves the trace alone", "[engine][gather]") {
  ConfigText text;
  text.zero = R"("stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 3000,
                 "stage3_max_live_parameters": 5000, "stage3_param_persistence_threshold": 0)";
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  declare(*e, kLayers);
  const std::vector<std::string> order = names(kLayers);
  const auto eval = [&] {
    const Engine::UntracedScope untraced = e->untraced();
    for (const std::string& u : order) {
      auto g = e->gather(u);
      check_throws<UsageError>([&] { (void)e->grads(u); }, {"UntracedScope"});
    }
  };
  for (int window = 0; window < 4; ++window) {
    forward_backward(*e, order, window);
    CHECK(e->step().applied);
    eval();
  }
  CHECK(e->stats().trace_rebuilds == 0);
  CHECK(e->stats().gathered_elems == 0);
  {
    const Engine::UntracedScope untraced = e->untraced();
    check_throws<UsageError>([&] { (void)e->untraced(); }, {"already open"});
  }
  // The same pass without untraced() is a change of order (the control: the check above can fail).
  for (const std::string& u : order) auto g = e->gather(u);
  forward_backward(*e, order, 4);
  CHECK(e->step().applied);
  CHECK(e->stats().trace_rebuilds == 1);
}

TEST_CASE("wall_clock_breakdown reports the step's waits and optimizer time", "[engine][timing]") {
  for (const bool timed : {false, true}) {
    ConfigText text;
    text.zero = R"("stage3_param_persistence_threshold": 0)";
    text.top = timed ? R"("wall_clock_breakdown": true)" : R"("wall_clock_breakdown": false)";
    auto e = make_engine(text);
    declare(*e, kLayers);
    double window_ms = 0.0;  // the last window's forward/backward, and its step()
    double step_ms = 0.0;
    for (int window = 0; window < 3; ++window) {
      const auto t0 = std::chrono::steady_clock::now();
      forward_backward(*e, names(kLayers), window);
      const auto t1 = std::chrono::steady_clock::now();
      CHECK(e->step().applied);
      window_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    }
    const StepTimes t = e->stats().last_step_times;
    if (timed) {
      CHECK(t.optimizer_ms > 0.0);
      // Each figure is a part of the wall time it is measured in: the gathers stall the window's
      // forward/backward, the reductions and the optimizer run inside step().
      CHECK(t.gather_wait_ms <= window_ms);
      CHECK(t.reduce_wait_ms + t.optimizer_ms <= step_ms);
    } else {
      CHECK(t.optimizer_ms == 0.0);
      CHECK(t.reduce_wait_ms == 0.0);
      CHECK(t.gather_wait_ms == 0.0);
    }
  }
}

// ------------------------------------------------------------------------------------------------ comm volume

TEST_CASE("one all-gather per use and one reduce-scatter per unit", "[engine][comm]") {
  ConfigText text;
  text.zero = R"("stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 50)";
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  const std::vector<UnitSpec> units = {flat_unit("emb", 1000), flat_unit("norm", 40), flat_unit("h0", 333),
                                       flat_unit("h1", 777)};
  declare(*e, units);
  forward_backward(*e, names(units), 0);
  CHECK(e->step().applied);
  const EngineStats s = e->stats();
  CHECK(s.persistent_elems == 40);
  CHECK(s.last_step_all_gather_elems + s.last_step_reduce_scatter_elems == 3 * (s.total_elems - s.persistent_elems));
  CHECK(s.last_step_reduce_scatter_elems == s.total_elems - s.persistent_elems);
  CHECK(s.last_step_all_reduce_elems == 40);
  CHECK(s.all_gather_elems == 0);
}
