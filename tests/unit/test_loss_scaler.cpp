// LossScaler against DeepSpeed's DynamicLossScaler.update_scale (deepspeed/runtime/fp16/loss_scaler.py). Each
// scripted overflow sequence comes with the scale after every update, traced by hand from the algorithm
// (docs/optim.md; the trace is in the comments), not from the code.
#include <catch2/catch.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/optim/loss_scaler.hpp"

using zero3::config::Config;
using zero3::optim::LossScaler;

namespace {

Config fp16_dynamic(std::int64_t power, std::int64_t window, std::int64_t hysteresis, bool consecutive = false,
                    std::int64_t min_scale = 1) {
  Config c;
  c.fp16.enabled = true;
  c.fp16.loss_scale = 0.0;
  c.fp16.initial_scale_power = power;
  c.fp16.loss_scale_window = window;
  c.fp16.hysteresis = hysteresis;
  c.fp16.consecutive_hysteresis = consecutive;
  c.fp16.min_loss_scale = min_scale;
  return c;
}

struct Event {
  bool overflow;
  double scale_after;
};

// Runs the script; each step's position is reported on failure.
void run_script(LossScaler& s, const std::vector<Event>& script) {
  for (std::size_t i = 0; i < script.size(); ++i) {
    INFO("update " << i << (script[i].overflow ? " (overflow)" : " (clean)"));
    s.update(script[i].overflow);
    CHECK(s.scale() == script[i].scale_after);
  }
}

}  // namespace

TEST_CASE("dynamic: hysteresis 2, window 3", "[optim][loss_scaler]") {
  LossScaler s = LossScaler::from_config(fp16_dynamic(4, 3, 2));
  CHECK(s.dynamic());
  CHECK(s.checks_overflow());
  CHECK(s.scale() == 16.0);
  // iter: stable = iter - last_overflow - 1 on clean steps; last_overflow starts at -1, hyst at 2.
  run_script(s, {
                    {false, 16},  // 0: stable 0
                    {false, 16},  // 1: stable 1
                    {false, 16},  // 2: stable 2
                    {false, 32},  // 3: stable 3 = window: double (the 4th clean call), hyst = 2
                    {true, 32},   // 4: hyst 2 -> 1, scale kept, last = 4
                    {true, 16},   // 5: hyst 1: halve, last = 5
                    {false, 16},  // 6: stable 0
                    {false, 16},  // 7: stable 1
                    {false, 16},  // 8: stable 2
                    {false, 32},  // 9: stable 3: double, hyst refilled to 2
                    {true, 32},   // 10: hyst 2 -> 1, last = 10
                    {false, 32},  // 11: stable 0; no refill without consecutive_hysteresis
                    {true, 16},   // 12: hyst still 1: halve, last = 12
                    {true, 8},    // 13: halve again
                    {false, 8},   // 14: stable 0
                    {false, 8},   // 15: 1
                    {false, 8},   // 16: 2
                    {false, 16},  // 17: 3: double
                    {false, 16},  // 18: 4
                    {false, 16},  // 19: 5
                    {false, 32},  // 20: 6 = 2 windows: double again
                });
  CHECK(s.state().iteration == 21);
  CHECK(s.state().last_overflow == 13);
  CHECK(s.state().hysteresis_left == 2);
}

TEST_CASE("dynamic: DeepSpeed defaults double exactly at iteration 1000", "[optim][loss_scaler]") {
  Config c;
  c.fp16.enabled = true;  // every other fp16 key at its default: 2**16, window 1000, hysteresis 2, min 1
  LossScaler s = LossScaler::from_config(c);
  CHECK(s.scale() == 65536.0);
  for (int i = 0; i < 1000; ++i) s.update(false);  // iterations 0..999
  CHECK(s.scale() == 65536.0);
  s.update(false);  // iteration 1000: the 1001st call
  CHECK(s.scale() == 131072.0);
  for (int i = 0; i < 999; ++i) s.update(false);  // 1001..1999
  CHECK(s.scale() == 131072.0);
  s.update(false);  // 2000
  CHECK(s.scale() == 262144.0);
}

TEST_CASE("dynamic: consecutive_hysteresis refills on every clean step", "[optim][loss_scaler]") {
  LossScaler s = LossScaler::from_config(fp16_dynamic(10, 100, 2, /*consecutive=*/true));
  CHECK(s.scale() == 1024.0);
  run_script(s, {
                    {true, 1024},   // hyst 2 -> 1
                    {false, 1024},  // refill to 2
                    {true, 1024},   // 2 -> 1 again: isolated overflows never lower the scale
                    {false, 1024},  // refill
                    {true, 1024},   // 2 -> 1
                    {true, 512},    // two in a row: halve
                    {true, 256},    // still 1: halve
                    {false, 256},   // refill
                    {true, 256},    // 2 -> 1
                });
  // Without the flag the same script halves on the third overflow (no refill between them).
  LossScaler plain = LossScaler::from_config(fp16_dynamic(10, 100, 2, /*consecutive=*/false));
  run_script(plain, {{true, 1024}, {false, 1024}, {true, 512}, {false, 512}, {true, 256}});
}

TEST_CASE("dynamic: hysteresis 1 halves on every overflow", "[optim][loss_scaler]") {
  LossScaler s = LossScaler::from_config(fp16_dynamic(5, 2, 1));
  // window 2: stable 2 doubles. iter 0 ovf (last 0); 1 clean stable 0; 2 clean 1; 3 clean 2: double.
  run_script(s, {{true, 16}, {false, 16}, {false, 16}, {false, 32}, {true, 16}, {true, 8}});
}

TEST_CASE("dynamic: the scale is clamped at min_loss_scale, and an overflow there throws", "[optim][loss_scaler]") {
  // 8 -> max(4, 3) = 4 -> max(2, 3) = 3 -> overflow at 3 == min: DeepSpeed raises.
  LossScaler s = LossScaler::from_config(fp16_dynamic(3, 1000, 1, false, 3));
  run_script(s, {{true, 4}, {true, 3}});
  try {
    s.update(true);
    FAIL("no error at the minimum scale");
  } catch (const zero3::Error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("min_loss_scale = 3"));
    CHECK_THAT(what, Catch::Contains("optimizer step 3"));
    CHECK_THAT(what, Catch::Contains("bf16"));  // says what to do
  }
}

TEST_CASE("dynamic: with hysteresis the first overflow at the minimum only uses it up", "[optim][loss_scaler]") {
  LossScaler s = LossScaler::from_config(fp16_dynamic(0, 1000, 2));  // starts at 1 == min
  s.update(true);                                                    // hyst 2 -> 1, no error
  CHECK(s.scale() == 1.0);
  CHECK_THROWS_AS(s.update(true), zero3::Error);
}

TEST_CASE("static fp16 scale never changes but overflow is still checked", "[optim][loss_scaler]") {
  Config c;
  c.fp16.enabled = true;
  c.fp16.loss_scale = 128.0;
  LossScaler s = LossScaler::from_config(c);
  CHECK_FALSE(s.dynamic());
  CHECK(s.checks_overflow());
  for (int i = 0; i < 2000; ++i) {
    s.update(i % 3 == 0);
    if (s.scale() != 128.0) FAIL("static scale changed at update " << i);
  }
  CHECK(s.scale() == 128.0);
}

TEST_CASE("bf16 and fp32: fixed scale 1, no overflow checks", "[optim][loss_scaler]") {
  Config bf16;
  bf16.bf16.enabled = true;
  Config fp32;
  for (const Config& c : {bf16, fp32}) {
    LossScaler s = LossScaler::from_config(c);
    CHECK(s.scale() == 1.0);
    CHECK_FALSE(s.checks_overflow());
    CHECK_FALSE(s.dynamic());
    s.update(true);
    CHECK(s.scale() == 1.0);
  }
  const LossScaler f = LossScaler::fixed(4.0);
  CHECK(f.scale() == 4.0);
  CHECK_FALSE(f.checks_overflow());
}

TEST_CASE("state round trip: a restored scaler continues the same sequence", "[optim][loss_scaler]") {
  const Config c = fp16_dynamic(6, 3, 2);
  LossScaler a = LossScaler::from_config(c);
  for (bool o : {false, true, false, false}) a.update(o);
  LossScaler b = LossScaler::from_config(c);
  b.restore(a.state());
  const std::vector<bool> rest = {false, true, true, false, false, false, false, true};
  for (bool o : rest) {
    a.update(o);
    b.update(o);
    CHECK(a.scale() == b.scale());
  }
  CHECK(a.state().iteration == b.state().iteration);
  CHECK(a.state().last_overflow == b.state().last_overflow);
  CHECK(a.state().hysteresis_left == b.state().hysteresis_left);
}

TEST_CASE("from_config rejects a dynamic config the parser would", "[optim][loss_scaler]") {
  CHECK_THROWS_WITH(LossScaler::from_config(fp16_dynamic(16, 0, 2)), Catch::Contains("fp16.loss_scale_window"));
  CHECK_THROWS_AS(LossScaler::from_config(fp16_dynamic(16, 10, 2, false, 0)), zero3::ConfigError);
}
