// LR schedules against DeepSpeed's deepspeed/runtime/lr_schedules.py. Every expected value comes from a reference
// written here from its formulas (docs/optim.md) in long double (a different operation order from the code under test,
// hence the relative tolerance), or from a table worked out by hand; none is copied from the code's output.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <iomanip>
#include <string>
#include <vector>

#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/optim/lr_schedule.hpp"

using namespace zero3::config;
using zero3::optim::LrSchedule;
using zero3::optim::LrValues;
using zero3::optim::preview_lr;

namespace {

// The code evaluates in double in DeepSpeed's order; the references use long double and the textbook order.
// A few ulps apart at most: 1e-13 relative leaves room for log/cos rounding without hiding a formula error.
constexpr long double kRelTol = 1e-13L;

bool close(double got, long double want) {
  const long double diff = std::fabs(static_cast<long double>(got) - want);
  return diff <= kRelTol * std::fabs(want) || diff <= 1e-300L;
}

// Reports both values (to 17 digits) when they differ.
#define CHECK_LR(got, want)                                                                          \
  do {                                                                                               \
    const double got_ = (got);                                                                       \
    const long double want_ = (want);                                                                \
    INFO(std::setprecision(17) << #got << " = " << got_ << ", want " << static_cast<double>(want_)); \
    CHECK(close(got_, want_));                                                                       \
  } while (0)

const std::vector<std::int64_t> kProbe = {-1, 0, 1, 2, 5, 9, 10, 11, 18, 19, 20, 21, 22, 50, 99, 100, 101, 110, 1000};

OptimizerConfig adamw(double lr) {
  OptimizerConfig o;
  o.type = OptimizerType::adamw;
  o.lr = lr;
  return o;
}

// ---- references, from deepspeed/runtime/lr_schedules.py ----

long double warmup_fraction(std::int64_t t, std::int64_t n, WarmupType type) {
  if (type == WarmupType::log) return std::log(static_cast<long double>(t + 1)) / std::log(static_cast<long double>(n));
  return static_cast<long double>(t) / static_cast<long double>(n);
}

// WarmupLR (decay = false) and WarmupDecayLR (decay = true).
long double ref_warmup(std::int64_t t, long double min, long double max, std::int64_t warmup, WarmupType type,
                       bool decay = false, std::int64_t total = 0) {
  const std::int64_t n = warmup < 2 ? 2 : warmup;
  if (t < 0) return min;
  long double gamma = 1.0L;
  if (t < n) {
    gamma = warmup_fraction(t, n, type);
  } else if (decay) {
    const long double denom = total - n > 1 ? static_cast<long double>(total - n) : 1.0L;
    gamma = static_cast<long double>(total - t) / denom;
    if (gamma < 0) gamma = 0;
  }
  return min + (max - min) * gamma;
}

long double ref_cosine(std::int64_t t, long double org_lr, std::int64_t warmup, std::int64_t total, long double wmin,
                       long double cmin, WarmupType type) {
  const std::int64_t n = warmup < 2 ? 2 : warmup;
  if (t < 0) return 0.0L;
  long double ratio = 0;
  if (t < n) {
    ratio = wmin + warmup_fraction(t, n, type) * (1 - wmin);
  } else {
    const long double span = total - n > 1 ? static_cast<long double>(total - n) : 1.0L;
    long double p = static_cast<long double>(t - n + 1) / span;
    if (p > 1) p = 1;
    const long double pi = 3.14159265358979323846264338327950288L;
    ratio = cmin + (1 - cmin) * (1 + std::cos(pi * p)) / 2;
    if (ratio < 0) ratio = 0;
  }
  return org_lr * ratio;
}

// OneCycle's continuous cycle position, written from the position c = (t+1) mod S inside the cycle instead of
// DeepSpeed's x = 1 + b/S - floor(1 + b/S) form: s rises c/first, then falls (S-c)/second.
long double ref_one_cycle_scale(std::int64_t t, std::int64_t first, std::int64_t second) {
  const std::int64_t total = first + second;
  const std::int64_t c = (t + 1) % total;
  if (c <= first) return static_cast<long double>(c) / static_cast<long double>(first);
  return static_cast<long double>(total - c) / static_cast<long double>(second);
}

}  // namespace

TEST_CASE("WarmupLR: log and linear warmup, min before the start, max after", "[optim][lr_schedule]") {
  for (WarmupType type : {WarmupType::log, WarmupType::linear}) {
    SchedulerConfig s;
    s.type = SchedulerType::warmup_lr;
    s.warmup_min_lr = 1e-5;
    s.warmup_max_lr = 3e-3;
    s.warmup_num_steps = 20;
    s.warmup_type = type;
    const auto sched = LrSchedule::create(&s, adamw(7e-4));  // the optimizer lr is not used: max is given
    for (std::int64_t t : kProbe) {
      INFO("t = " << t);
      const LrValues v = sched->at(t);
      CHECK_LR(v.lr, ref_warmup(t, 1e-5L, 3e-3L, 20, type));
      CHECK_FALSE(v.betas.has_value());
    }
    CHECK(sched->at(-1).lr == 1e-5);  // the constructor's lr is exactly min
    CHECK(sched->at(20).lr == 3e-3);  // exactly max once warmup is over (gamma = 1)
    CHECK(sched->at(10'000).lr == 3e-3);
  }
}

TEST_CASE("WarmupLR: warmup_num_steps = 1 is raised to N = 2", "[optim][lr_schedule]") {
  SchedulerConfig s;
  s.type = SchedulerType::warmup_lr;
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr = 1e-3;
  s.warmup_num_steps = 1;
  s.warmup_type = WarmupType::linear;
  const auto lin = LrSchedule::create(&s, adamw(1e-3));
  // With N = 1, t = 1 would already be at max; with N = 2 it is half way (1/2).
  CHECK_LR(lin->at(1).lr, 0.5e-3L);
  CHECK(lin->at(0).lr == 0.0);
  CHECK(lin->at(2).lr == 1e-3);
  s.warmup_type = WarmupType::log;
  const auto log = LrSchedule::create(&s, adamw(1e-3));
  CHECK(log->at(0).lr == 0.0);     // ln(1) / ln(2)
  CHECK_LR(log->at(1).lr, 1e-3L);  // ln(2) / ln(2)
  CHECK(log->at(2).lr == 1e-3);
}

TEST_CASE("WarmupLR: an absent warmup_max_lr is the optimizer lr (parsed config)", "[optim][lr_schedule]") {
  const ParseResult r = parse_config_text(R"({
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3}},
    "zero_optimization": {"stage": 3},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4, "warmup_type": "linear"}}})");
  REQUIRE(r.ok());
  const auto sched = LrSchedule::create(*r.config);
  CHECK_LR(sched->at(2).lr, 2e-3L * 2 / 4);
  CHECK(sched->at(4).lr == 2e-3);
}

TEST_CASE("WarmupDecayLR: an absent warmup_max_lr is 0.001, not the optimizer lr (parsed config)",
          "[optim][lr_schedule]") {
  const ParseResult r = parse_config_text(R"({
    "train_batch_size": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-3}},
    "zero_optimization": {"stage": 3},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": 100, "warmup_num_steps": 4}}})");
  REQUIRE(r.ok());
  const auto sched = LrSchedule::create(*r.config);
  CHECK(sched->at(4).lr == 1e-3);  // t = N: gamma = (100 - 4) / (100 - 4) = 1
  CHECK_LR(sched->at(52).lr, 1e-3L * 48 / 96);
}

TEST_CASE("WarmupDecayLR: warmup, linear decay to 0 at T, clamped at 0 after", "[optim][lr_schedule]") {
  for (WarmupType type : {WarmupType::log, WarmupType::linear}) {
    SchedulerConfig s;
    s.type = SchedulerType::warmup_decay_lr;
    s.warmup_min_lr = 2e-5;
    s.warmup_max_lr = 1e-3;
    s.warmup_num_steps = 10;
    s.total_num_steps = 100;
    s.warmup_type = type;
    const auto sched = LrSchedule::create(&s, adamw(5.0));
    for (std::int64_t t : kProbe) {
      INFO("t = " << t);
      CHECK_LR(sched->at(t).lr, ref_warmup(t, 2e-5L, 1e-3L, 10, type, true, 100));
    }
    CHECK(sched->at(100).lr == 2e-5);                               // gamma = 0 at T: exactly min
    CHECK(sched->at(110).lr == 2e-5);                               // max(0, negative)
    CHECK_LR(sched->at(10).lr, 2e-5L + (1e-3L - 2e-5L) * 90 / 90);  // first decay step: gamma = (T - N) / (T - N)
    CHECK_LR(sched->at(55).lr, 2e-5L + (1e-3L - 2e-5L) * 45 / 90);
  }
}

TEST_CASE("WarmupDecayLR: T < N decays to min at once after warmup", "[optim][lr_schedule]") {
  SchedulerConfig s;
  s.type = SchedulerType::warmup_decay_lr;
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr = 1e-3;
  s.warmup_num_steps = 10;
  s.total_num_steps = 5;
  s.warmup_type = WarmupType::linear;
  const auto sched = LrSchedule::create(&s, adamw(1e-3));
  for (std::int64_t t : kProbe) {
    INFO("t = " << t);
    CHECK_LR(sched->at(t).lr, ref_warmup(t, 0.0L, 1e-3L, 10, WarmupType::linear, true, 5));
  }
  CHECK_LR(sched->at(9).lr, 0.9e-3L);
  CHECK(sched->at(10).lr == 0.0);  // (5 - 10) / max(1, -5) < 0
}

TEST_CASE("WarmupCosineLR: ratio of the optimizer lr, 0 before the start, clamped at cos_min_ratio",
          "[optim][lr_schedule]") {
  for (WarmupType type : {WarmupType::log, WarmupType::linear}) {
    SchedulerConfig s;
    s.type = SchedulerType::warmup_cosine_lr;
    s.warmup_num_steps = 20;
    s.total_num_steps = 100;
    s.warmup_min_ratio = 0.05;
    s.cos_min_ratio = 0.1;
    s.warmup_type = type;
    const auto sched = LrSchedule::create(&s, adamw(3e-3));
    for (std::int64_t t : kProbe) {
      INFO("t = " << t);
      if (t < 0) {
        CHECK(sched->at(t).lr == 0.0);
      } else {
        CHECK_LR(sched->at(t).lr, ref_cosine(t, 3e-3L, 20, 100, 0.05L, 0.1L, type));
      }
    }
    CHECK_LR(sched->at(0).lr, 3e-3L * 0.05L);   // warmup starts at warmup_min_ratio
    CHECK_LR(sched->at(99).lr, 3e-3L * 0.1L);   // p = 80/80 = 1: cos(pi) = -1
    CHECK_LR(sched->at(110).lr, 3e-3L * 0.1L);  // p clamped at 1, no climb back up
    CHECK_LR(sched->at(1000).lr, 3e-3L * 0.1L);
  }
}

TEST_CASE("WarmupCosineLR: T <= N stays at the floor after warmup", "[optim][lr_schedule]") {
  SchedulerConfig s;
  s.type = SchedulerType::warmup_cosine_lr;
  s.warmup_num_steps = 10;
  s.total_num_steps = 10;
  s.cos_min_ratio = 0.25;
  s.warmup_type = WarmupType::linear;
  const auto sched = LrSchedule::create(&s, adamw(1.0));
  // p = (t - N + 1) / max(1, 0) >= 1 from t = N on.
  for (std::int64_t t : {10, 11, 50}) CHECK_LR(sched->at(t).lr, 0.25L);
}

TEST_CASE("OneCycle: continuous cycle, momentum cycling with beta2 = 0.99, decay phase", "[optim][lr_schedule]") {
  SchedulerConfig s;
  s.type = SchedulerType::one_cycle;
  s.cycle_min_lr = 1e-4;
  s.cycle_max_lr = 1e-3;
  s.cycle_first_step_size = 10;
  s.cycle_second_step_size = 6;  // asymmetric: S = 16
  s.cycle_min_mom = 0.85;
  s.cycle_max_mom = 0.95;
  s.decay_step_size = 5;
  s.decay_lr_rate = 0.5;
  s.decay_mom_rate = 0.1;
  const auto sched = LrSchedule::create(&s, adamw(42.0));
  // As constructed: lr = min and betas = (min_mom, 0.99), not the cycle formula's (max_mom, 0.99).
  REQUIRE(sched->at(-1).betas.has_value());
  CHECK(sched->at(-1).lr == 1e-4);
  CHECK((*sched->at(-1).betas)[0] == 0.85);
  CHECK((*sched->at(-1).betas)[1] == 0.99);
  for (std::int64_t t = 0; t < 16; ++t) {
    INFO("t = " << t);
    const long double sc = ref_one_cycle_scale(t, 10, 6);
    const LrValues v = sched->at(t);
    CHECK_LR(v.lr, 1e-4L + (1e-3L - 1e-4L) * sc);
    REQUIRE(v.betas.has_value());
    CHECK_LR((*v.betas)[0], 0.95L - (0.95L - 0.85L) * sc);
    CHECK((*v.betas)[1] == 0.99);
  }
  CHECK_LR(sched->at(9).lr, 1e-3L);  // b = first: the peak
  CHECK_LR((*sched->at(9).betas)[0], 0.85L);
  CHECK_LR(sched->at(12).lr, 1e-4L + 0.9e-3L * 3 / 6);  // b = 13: (16 - 13) / 6 down
  // Decay phase from t = S = 16: d = t - 16 + 1, lr = min / (1 + rate d / size), beta1 = max_mom (1 + rate d / size).
  for (std::int64_t t = 16; t < 40; ++t) {
    INFO("t = " << t);
    const long double d = static_cast<long double>(t - 16 + 1);
    const LrValues v = sched->at(t);
    CHECK_LR(v.lr, 1e-4L / (1 + 0.5L * d / 5));
    REQUIRE(v.betas.has_value());
    CHECK_LR((*v.betas)[0], 0.95L * (1 + 0.1L * d / 5));
    CHECK((*v.betas)[1] == 0.99);
  }
  CHECK_LR(sched->at(20).lr, 1e-4L / 1.5L);  // d = 5: one decay interval
}

TEST_CASE("OneCycle: stairs in each half, counted from the integer cycle position", "[optim][lr_schedule]") {
  SchedulerConfig s;
  s.type = SchedulerType::one_cycle;
  s.cycle_min_lr = 0.0;
  s.cycle_max_lr = 1.0;
  s.cycle_first_step_size = 10;
  s.cycle_second_step_size = 6;
  s.cycle_first_stair_count = 4;
  s.cycle_second_stair_count = 2;
  const auto sched = LrSchedule::create(&s, adamw(1e-3));
  // By hand, b = t + 1: up, floor(b * 4 / 10) / 4 for b = 0..10; down, floor((16 - b) * 2 / 6) / 2 for b = 11..15;
  // b = 16 starts the next cycle at 0.
  const double want[17] = {0, 0, 0, 0.25, 0.25, 0.5, 0.5, 0.5, 0.75, 0.75, 1, 0.5, 0.5, 0.5, 0, 0, 0};
  for (std::int64_t b = 1; b <= 16; ++b) {
    const std::int64_t t = b - 1;
    INFO("t = " << t);
    CHECK(sched->at(t).lr == want[b]);
    CHECK((*sched->at(t).betas)[0] == Approx(0.9 - 0.1 * want[b]).epsilon(1e-15));
  }
  // decay_step_size 0: after the cycle lr stays at min and betas at (max_mom, 0.99).
  for (std::int64_t t : {16, 17, 100}) {
    INFO("t = " << t);
    CHECK(sched->at(t).lr == 0.0);
    CHECK((*sched->at(t).betas)[0] == 0.9);
    CHECK((*sched->at(t).betas)[1] == 0.99);
  }
}

TEST_CASE("OneCycle: no betas without cycle_momentum or for Adagrad", "[optim][lr_schedule]") {
  SchedulerConfig s;
  s.type = SchedulerType::one_cycle;
  s.cycle_min_lr = 1e-4;
  s.cycle_max_lr = 1e-3;
  s.cycle_first_step_size = 4;
  s.cycle_second_step_size = 4;
  OptimizerConfig adagrad;
  adagrad.type = OptimizerType::adagrad;
  const auto no_betas = LrSchedule::create(&s, adagrad);
  for (std::int64_t t : {-1, 0, 3, 9}) CHECK_FALSE(no_betas->at(t).betas.has_value());
  s.cycle_momentum = false;
  const auto off = LrSchedule::create(&s, adamw(1e-3));
  for (std::int64_t t : {-1, 0, 3, 9}) CHECK_FALSE(off->at(t).betas.has_value());
  CHECK_LR(off->at(3).lr, 1e-3L);  // b = 4 = first: the peak
}

TEST_CASE("OneCycle: second_step_size 0 is a rise-only cycle", "[optim][lr_schedule]") {
  SchedulerConfig s;
  s.type = SchedulerType::one_cycle;
  s.cycle_min_lr = 0.0;
  s.cycle_max_lr = 1.0;
  s.cycle_first_step_size = 4;
  s.cycle_second_step_size = 0;
  const auto sched = LrSchedule::create(&s, adamw(1e-3));
  for (std::int64_t t : {0, 1, 2}) CHECK_LR(sched->at(t).lr, ref_one_cycle_scale(t, 4, 0));
  CHECK(sched->at(4).lr == 0.0);  // decay phase, decay off: min
}

TEST_CASE("LRRangeTest: continuous and staircase growth", "[optim][lr_schedule]") {
  SchedulerConfig s;
  s.type = SchedulerType::lr_range_test;
  s.lr_range_test_min_lr = 1e-3;
  s.lr_range_test_step_size = 10;
  s.lr_range_test_step_rate = 0.5;
  const auto cont = LrSchedule::create(&s, adamw(9.0));
  for (std::int64_t t : kProbe) {
    INFO("t = " << t);
    CHECK_LR(cont->at(t).lr, 1e-3L * (1 + 0.5L * static_cast<long double>(t + 1) / 10));
  }
  s.lr_range_test_staircase = true;
  const auto stair = LrSchedule::create(&s, adamw(9.0));
  // By hand: the interval is floor((t + 1) / 10).
  const struct {
    std::int64_t t;
    long double intervals;
  } rows[] = {{-1, 0}, {0, 0}, {8, 0}, {9, 1}, {10, 1}, {18, 1}, {19, 2}, {99, 10}, {100, 10}};
  for (const auto& row : rows) {
    const std::int64_t t = row.t;
    INFO("t = " << t);
    CHECK_LR(stair->at(t).lr, 1e-3L * (1 + 0.5L * row.intervals));
  }
}

TEST_CASE("no scheduler block: the optimizer lr at every step", "[optim][lr_schedule]") {
  const auto sched = LrSchedule::create(nullptr, adamw(4e-4));
  for (std::int64_t t : kProbe) CHECK(sched->at(t).lr == 4e-4);
  CHECK(sched->iteration() == -1);
}

TEST_CASE("preview_lr: step k of a fresh run uses iteration k - 2", "[optim][lr_schedule]") {
  Config c;
  c.optimizer = adamw(3e-3);
  SchedulerConfig s;
  s.type = SchedulerType::warmup_cosine_lr;
  s.warmup_num_steps = 5;
  s.total_num_steps = 30;
  s.warmup_type = WarmupType::linear;
  c.scheduler = s;
  const std::vector<double> lrs = preview_lr(c, 40);
  REQUIRE(lrs.size() == 40);
  CHECK(lrs[0] == 0.0);  // step 1 runs with the constructor's lr: 0 for WarmupCosineLR
  for (std::int64_t k = 2; k <= 40; ++k) {
    const std::int64_t t = k - 2;
    INFO("step " << k << ", t = " << t);
    CHECK_LR(lrs[k - 1], ref_cosine(t, 3e-3L, 5, 30, 0.0L, 1e-4L, WarmupType::linear));
  }
  CHECK(preview_lr(c, 0).empty());
  CHECK_THROWS_AS(preview_lr(c, -1), zero3::UsageError);
}

TEST_CASE("preview_lr: a resumed last_batch_iteration L gives step k the values at L + k - 1", "[optim][lr_schedule]") {
  Config c;
  c.optimizer = adamw(1.0);
  SchedulerConfig s;
  s.type = SchedulerType::warmup_decay_lr;
  s.warmup_min_lr = 1e-5;
  s.warmup_max_lr = 1e-3;
  s.warmup_num_steps = 10;
  s.total_num_steps = 50;
  s.last_batch_iteration = 7;
  c.scheduler = s;
  const std::vector<double> lrs = preview_lr(c, 60);
  REQUIRE(lrs.size() == 60);
  for (std::int64_t k = 1; k <= 60; ++k) {
    const std::int64_t t = 7 + k - 1;
    INFO("step " << k << ", t = " << t);
    CHECK_LR(lrs[k - 1], ref_warmup(t, 1e-5L, 1e-3L, 10, WarmupType::log, true, 50));
  }
  // And the schedule object itself starts there and moves one iteration per applied step.
  const auto sched = LrSchedule::create(c);
  CHECK(sched->iteration() == 7);
  sched->advance();
  CHECK(sched->iteration() == 8);
  CHECK(sched->current().lr == sched->at(8).lr);
}

TEST_CASE("preview_lr: no scheduler block is constant, no optimizer block is an error", "[optim][lr_schedule]") {
  Config c;
  c.optimizer = adamw(6e-4);
  CHECK(preview_lr(c, 3) == std::vector<double>{6e-4, 6e-4, 6e-4});
  c.optimizer.reset();
  CHECK_THROWS_AS(preview_lr(c, 3), zero3::ConfigError);
}

TEST_CASE("create rejects what the parser would, naming the key", "[optim][lr_schedule]") {
  SchedulerConfig s;
  s.type = SchedulerType::one_cycle;
  s.cycle_first_step_size = 0;
  CHECK_THROWS_WITH(LrSchedule::create(&s, adamw(1e-3)), Catch::Contains("scheduler.params.cycle_first_step_size"));
  s = SchedulerConfig{};
  s.type = SchedulerType::lr_range_test;
  s.lr_range_test_step_size = 0;
  CHECK_THROWS_AS(LrSchedule::create(&s, adamw(1e-3)), zero3::ConfigError);
  s = SchedulerConfig{};
  s.warmup_num_steps = 0;
  CHECK_THROWS_WITH(LrSchedule::create(&s, adamw(1e-3)), Catch::Contains("warmup_num_steps"));
  s = SchedulerConfig{};
  s.last_batch_iteration = -2;
  CHECK_THROWS_AS(LrSchedule::create(&s, adamw(1e-3)), zero3::ConfigError);
}
