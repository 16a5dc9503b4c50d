// EntropyFloorCheck (zero3/train/sinks.hpp): a held-out loss below the data's entropy floor by more than
// the margin (at least 0.05 nats, else 5 standard errors of the held-out measurement) stops the run, naming the step,
// the loss and the floor; at or above it, within the margin, or non-finite (a diverged model, which the trainer reports
// itself) it does not.
#include <catch2/catch.hpp>
#include <limits>
#include <string>

#include "zero3/core/error.hpp"
#include "zero3/train/sinks.hpp"

using namespace zero3;

namespace {

train::LogEvent event(double heldout, double floor) {
  train::LogEvent e;
  e.step = 30;
  e.steps = 40;
  e.heldout_loss = heldout;
  e.entropy_floor = floor;
  return e;
}

}  // namespace

TEST_CASE("the entropy-floor check stops a run whose held-out loss beats the floor", "[train][sinks]") {
  train::EntropyFloorCheck check(0.05);
  CHECK_NOTHROW(check.on_log(event(1.90, 1.80)));
  CHECK_NOTHROW(check.on_log(event(1.76, 1.80)));  // within the margin: sampling noise of the estimate
  try {
    check.on_log(event(1.70, 1.80));
    FAIL("a held-out loss 0.1 nats below the floor went through");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find("step 30") != std::string::npos);
    CHECK(what.find("1.7000") != std::string::npos);
    CHECK(what.find("1.8000") != std::string::npos);
  }
  // No floor known (a token file): nothing to check.
  train::LogEvent unknown = event(0.1, 1.8);
  unknown.entropy_floor.reset();
  CHECK_NOTHROW(check.on_log(unknown));
}

TEST_CASE("the margin widens with the held-out measurement's standard error", "[train][sinks]") {
  train::EntropyFloorCheck check;  // at least 0.05 nats, else 5 standard errors
  train::LogEvent small_sample = event(1.65, 1.80);
  small_sample.entropy_floor_se = 0.04;  // 8 windows of 64 tokens, a per-token deviation near 0.9 nats
  CHECK(check.margin(small_sample) == Approx(0.20));
  CHECK_NOTHROW(check.on_log(small_sample));  // 3.75 standard errors below: chance, not a leak
  small_sample.heldout_loss = 1.55;
  try {
    check.on_log(small_sample);
    FAIL("a held-out loss 6.25 standard errors below the floor went through");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK(what.find("by 0.2500") != std::string::npos);
    CHECK(what.find("margin 0.2000") != std::string::npos);
    CHECK(what.find("standard error 0.0400") != std::string::npos);
  }
  // A large sample: the minimum margin holds.
  train::LogEvent large_sample = event(1.74, 1.80);
  large_sample.entropy_floor_se = 0.002;
  CHECK(check.margin(large_sample) == Approx(0.05));
  CHECK_THROWS_AS(check.on_log(large_sample), Error);
}

TEST_CASE("a non-finite held-out loss is not taken for one below the floor", "[train][sinks]") {
  train::EntropyFloorCheck check(0.05);
  CHECK_NOTHROW(check.on_log(event(std::numeric_limits<double>::quiet_NaN(), 1.80)));
  CHECK_NOTHROW(check.on_log(event(std::numeric_limits<double>::infinity(), 1.80)));
  CHECK_NOTHROW(check.on_log(event(-std::numeric_limits<double>::quiet_NaN(), 1.80)));
}
