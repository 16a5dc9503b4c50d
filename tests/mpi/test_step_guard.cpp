// The training loop's step guard at world sizes 1-3, with the library's host MLP on synthetic Markov data
// and a model wrapper that reports chosen micro-batch losses as NaN or multiplied (its gradients stay the
// real ones, so only the guard can act on them): a non-finite loss on one rank skips that step on every
// rank with the state untouched; a loss spike is detected against the running mean and each action has
// its exact effect: skip (state unchanged), reset_moments (moments zero, the lr ramps k/K over K applied
// steps), rollback (the state equals the checkpoint's bit for bit, and the skipped batches are never
// handed out); a non-finite final held-out loss fails the run. The detector itself is checked on a series.
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine_fixtures.hpp"
#include "mpi_test_env.hpp"
#include "trainer_test_config.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"
#include "zero3/models/model_factory.hpp"
#include "zero3/train/step_guard.hpp"
#include "zero3/train/trainer.hpp"

using namespace zero3;
using Catch::Matchers::Contains;

namespace {

test::MpiTestEnv& env() {
  return test::mpi_env();
}
int rank() {
  return env().world.rank;
}

config::Config mlp_config(std::int64_t steps, const std::string& zero3_extra) {
  return test::mlp_job_config(
      {.steps = steps, .train_batch_size = 24, .gradient_accumulation_steps = 1, .zero3_extra = zero3_extra},
      env().world.size);
}

// What a train micro-batch's loss is reported as: the model's, or NaN / multiplied at chosen calls.
struct LossEdits {
  std::set<std::int64_t> nan_calls;  // train micro-batch calls (0-based, this rank) whose loss reads NaN
  std::set<std::int64_t> spike_calls;
  double spike_factor = 50.0;
  bool nan_on_eval = false;  // every held-out loss reads NaN
};

// The library's model, with its reported losses edited; forward and backward are the model's own.
class EditedLossModel final : public models::UnitModel {
 public:
  EditedLossModel(std::unique_ptr<models::UnitModel> inner, LossEdits edits)
      : inner_(std::move(inner)), edits_(std::move(edits)) {}
  const std::vector<UnitSpec>& units() const override { return inner_->units(); }
  std::string describe() const override { return inner_->describe(); }
  void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len,
                 models::Pass pass) override {
    pass_ = pass;
    if (pass == models::Pass::train) ++train_calls_;
    inner_->set_batch(tokens, targets, batch, len, pass);
  }
  void forward_unit(std::size_t unit, std::span<const BufferView> params, Stream& stream) override {
    inner_->forward_unit(unit, params, stream);
  }
  double loss(Stream& stream) override {
    const double l = inner_->loss(stream);
    if (pass_ == models::Pass::eval) return edits_.nan_on_eval ? std::numeric_limits<double>::quiet_NaN() : l;
    if (edits_.nan_calls.contains(train_calls_ - 1)) return std::numeric_limits<double>::quiet_NaN();
    if (edits_.spike_calls.contains(train_calls_ - 1)) return l * edits_.spike_factor;
    return l;
  }
  void backward_unit(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                     float seed_scale, Stream& stream) override {
    inner_->backward_unit(unit, params, grads, seed_scale, stream);
  }
  std::size_t activation_bytes() const override { return inner_->activation_bytes(); }
  MemoryKind activation_memory() const override { return inner_->activation_memory(); }

 private:
  std::unique_ptr<models::UnitModel> inner_;
  LossEdits edits_;
  models::Pass pass_ = models::Pass::train;
  std::int64_t train_calls_ = 0;
};

// TokenWindows that records the data step of every micro-batch it hands out.
class RecordingData final : public train::TrainData {
 public:
  RecordingData(const config::Config& cfg, std::vector<std::int64_t>& served)
      : inner_(cfg, rank(), env().world.size, {.context = 2, .predictions_per_window = 1, .heldout_windows = 32}),
        served_(served) {}
  train::TokenBatch micro_batch(std::int64_t step, std::int64_t micro, std::int64_t micro_size) override {
    served_.push_back(step);
    return inner_.micro_batch(step, micro, micro_size);
  }
  train::TokenBatch heldout() override { return inner_.heldout(); }
  std::int64_t heldout_windows() const override { return inner_.heldout_windows(); }
  std::int64_t predictions_per_window() const override { return inner_.predictions_per_window(); }
  nlohmann::json position(std::int64_t steps) const override { return inner_.position(steps); }
  void check_resume(const nlohmann::json& saved, std::int64_t step) const override { inner_.check_resume(saved, step); }
  std::string describe() const override { return inner_.describe(); }

 private:
  train::TokenWindows inner_;
  std::vector<std::int64_t>& served_;
};

// Per step: the result and the engine's state after it; the state at each on_resume.
struct StateRecorder final : train::TrainObserver {
  Engine* engine = nullptr;
  std::vector<train::StepEvent> steps;
  std::vector<std::vector<std::byte>> states;  // after each step event
  std::vector<std::vector<float>> exp_avg;
  std::vector<std::vector<std::byte>> resumed;  // at each on_resume
  void on_step(const train::StepEvent& e) override {
    steps.push_back(e);
    states.push_back(test::state_bytes(*engine));
    exp_avg.push_back(test::local_floats(*engine, TensorKind::exp_avg));
  }
  void on_resume(const ckpt::LoadResult&) override { resumed.push_back(test::state_bytes(*engine)); }
  std::string save_errors;
  void on_save(const ckpt::SaveReport& r) override {
    if (!r.ok) save_errors += r.tag + ": " + r.error + "\n";
  }
};

struct Run {
  std::shared_ptr<StateRecorder> recorder = std::make_shared<StateRecorder>();
  std::vector<std::int64_t> served;
  std::string error;
  train::TrainSummary summary;
};

Run train_run(std::int64_t steps, const std::string& zero3_extra, const LossEdits& edits,
              const std::filesystem::path& save_dir = {}, std::optional<std::int64_t> save_interval = {}) {
  const config::Config cfg = mlp_config(steps, zero3_extra);
  Run run;
  RecordingData data(cfg, run.served);
  train::UnitTrainer unit_trainer(cfg, env().world, env().bootstrap, [&](Device& d) {
    return std::make_unique<EditedLossModel>(models::make_train_model(*cfg.zero3.model, d), edits);
  });
  train::TrainerOptions options;
  options.steps = steps;
  options.log_interval = 0;
  options.save_dir = save_dir;
  options.save_interval = save_interval;
  options.checkpoint.async = false;
  train::Trainer trainer(unit_trainer, data, options);
  run.recorder->engine = &unit_trainer.engine();
  trainer.add_observer(run.recorder);
  try {
    run.summary = trainer.run();
  } catch (const std::exception& e) {
    run.error = e.what();
  }
  return run;
}

// A directory every rank agrees on, empty.
std::filesystem::path shared_dir(const std::string& name) {
  return test::shared_empty_dir(*env().bootstrap, "zero3-guard", name);
}

std::string read_events(const std::filesystem::path& dir) {
  std::ifstream in(dir / "events.jsonl");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Spike detection armed after 4 steps, ratio 3 over a window of 4.
constexpr const char* kSpike =
    R"("spike": {{"enabled": true, "detector": "ratio", "threshold": 3, "window": 4, "warmup_steps": 4,
                 "action": "{}", "rewarm_steps": 3, "skip_batches": 3}})";

}  // namespace

TEST_CASE("the detector flags a loss above the running mean by a ratio or a z-score", "[train][guard]") {
  config::SpikeSettings s;
  s.detector = config::SpikeDetector::ratio;
  s.threshold = 2.0;
  s.window = 3;
  s.warmup_steps = 3;
  train::LossSpikeDetector ratio(s);
  CHECK_FALSE(ratio.check(100.0).armed);
  for (const double l : {1.0, 2.0, 3.0, 4.0}) ratio.accept(l);  // the window keeps 2, 3, 4: mean 3
  train::LossSpikeDetector::Verdict v = ratio.check(6.5);
  CHECK(v.armed);
  CHECK(v.mean == 3.0);
  CHECK(v.score == 6.5 / 3.0);
  CHECK(v.spike);
  CHECK_FALSE(ratio.check(6.0).spike);  // exactly 2x is not above
  CHECK_FALSE(ratio.check(std::numeric_limits<double>::quiet_NaN()).spike);
  s.detector = config::SpikeDetector::zscore;
  s.threshold = 3.0;
  train::LossSpikeDetector z(s);
  for (const double l : {2.0, 4.0, 6.0}) z.accept(l);  // mean 4, population std sqrt(8/3)
  v = z.check(10.0);
  CHECK(v.std == std::sqrt(8.0 / 3.0));
  CHECK(v.score == (10.0 - 4.0) / std::sqrt(8.0 / 3.0));
  CHECK(v.spike);
  CHECK_FALSE(z.check(8.0).spike);  // 2.45 deviations
  // Its state round-trips through JSON exactly.
  train::LossSpikeDetector copy(s);
  copy.restore(nlohmann::json::parse(z.state().dump()));
  CHECK(copy.check(10.0).score == v.score);
}

TEST_CASE("a non-finite loss on one rank skips that step on every rank, state untouched", "[train][guard]") {
  const int last = env().world.size - 1;
  LossEdits edits;
  if (rank() == last) edits.nan_calls = {3};
  const Run r = train_run(6, "", edits);
  CHECK(r.error.empty());
  REQUIRE(r.recorder->steps.size() == 6);
  for (std::size_t i = 0; i < 6; ++i) {
    INFO("step " << i + 1);
    const StepResult& res = r.recorder->steps[i].result;
    CHECK(res.applied == (i != 3));
    CHECK(res.nonfinite == (i == 3));
  }
  CHECK(r.recorder->steps.back().result.skipped_steps == 1);
  CHECK(r.recorder->states[3] == r.recorder->states[2]);
  CHECK(r.recorder->states[4] != r.recorder->states[3]);
}

TEST_CASE("non-finite losses at max_consecutive steps in a row end the run", "[train][guard]") {
  LossEdits edits;
  edits.nan_calls = {2, 3, 4};
  const Run r = train_run(8, R"("nonfinite": {"max_consecutive": 3})", edits);
  CHECK_THAT(r.error, Contains("step 5"));
  CHECK_THAT(r.error, Contains("3 non-finite steps in a row"));
  CHECK_THAT(r.error, Contains("non-finite loss on rank(s) 0"));
  CHECK(r.recorder->steps.size() == 4);
}

TEST_CASE("a non-finite final held-out loss fails the run", "[train][guard]") {
  LossEdits edits;
  edits.nan_on_eval = true;
  const Run r = train_run(3, "", edits);
  CHECK_THAT(r.error, Contains("held-out loss after 3 steps is nan"));
}

TEST_CASE("a loss spike with action skip leaves the state as the step before", "[train][guard]") {
  const std::filesystem::path dir = shared_dir("skip");
  events::configure({.run_dir = dir, .rank = rank()});
  LossEdits edits;
  edits.spike_calls = {6};
  const Run r = train_run(9, fmt::format(kSpike, "skip"), edits);
  events::configure({});
  CHECK(r.error.empty());
  REQUIRE(r.recorder->steps.size() == 9);
  for (std::size_t i = 0; i < 9; ++i) {
    INFO("step " << i + 1);
    CHECK(r.recorder->steps[i].result.applied == (i != 6));
    CHECK(r.recorder->steps[i].result.discarded == (i == 6));
  }
  CHECK(r.recorder->states[6] == r.recorder->states[5]);
  env().bootstrap->barrier();
  if (rank() == 0) {
    const std::string log = read_events(dir);
    CHECK_THAT(log, Contains("\"kind\": \"loss_spike\""));
    CHECK_THAT(log, Contains("\"step\": 7"));
    CHECK_THAT(log, Contains("\"action\": \"skip\""));
    CHECK_THAT(log, Contains("\"threshold\": 3"));
    CHECK_THAT(log, Contains("\"ratio\": "));
  }
  env().bootstrap->barrier();
  if (rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("a loss spike with reset_moments zeroes the moments and re-warms the lr over K steps", "[train][guard]") {
  LossEdits edits;
  edits.spike_calls = {6};
  const Run r = train_run(12, fmt::format(kSpike, "reset_moments"), edits);
  CHECK(r.error.empty());
  REQUIRE(r.recorder->steps.size() == 12);
  CHECK_FALSE(r.recorder->steps[6].result.applied);
  const std::vector<float>& after_reset = r.recorder->exp_avg[6];
  CHECK(after_reset == std::vector<float>(after_reset.size(), 0.0f));
  CHECK(r.recorder->exp_avg[5] != after_reset);
  // rewarm_steps 3: the next three applied steps run at 1/3, 2/3 and 3/3 of the schedule's lr (0.01).
  for (std::size_t i = 0; i < 12; ++i) {
    INFO("step " << i + 1);
    const double lr = r.recorder->steps[i].result.lr;
    if (i == 6) {
      CHECK(lr == 0.0);
    } else if (i >= 7 && i <= 9) {
      CHECK(lr == 0.01 * (static_cast<double>(i - 6) / 3.0));
    } else {
      CHECK(lr == 0.01);
    }
  }
}

TEST_CASE("a loss spike with rollback restores the checkpoint bit for bit and skips the batches after it",
          "[train][guard][ckpt]") {
  const std::filesystem::path dir = shared_dir("rollback");
  LossEdits edits;
  edits.spike_calls = {6};  // step 7 (index 6); the last checkpoint is global_step6
  const Run r = train_run(10, fmt::format(kSpike, "rollback"), edits, dir, 2);
  INFO(r.error << "\n" << r.recorder->save_errors);
  CHECK(r.error.empty());
  REQUIRE(r.recorder->resumed.size() == 1);
  // on_step of step 6 saw the state that global_step6 holds; the rollback loaded exactly that.
  REQUIRE(r.recorder->states.size() >= 7);
  CHECK(r.recorder->resumed[0] == r.recorder->states[5]);
  // Steps 1-7, then from step 7 again on data batches 9.. (skip_batches 3 after the checkpoint: 6, 7, 8).
  const std::vector<std::int64_t> expected = {0, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12};
  CHECK(r.served == expected);
  std::vector<std::int64_t> done;
  for (const train::StepEvent& e : r.recorder->steps) done.push_back(e.step);
  CHECK(done == std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 7, 8, 9, 10});
  env().bootstrap->barrier();
  if (rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("rollback without a save directory is a ConfigError", "[train][guard]") {
  const config::Config cfg = mlp_config(2, fmt::format(kSpike, "rollback"));
  std::vector<std::int64_t> served;
  RecordingData data(cfg, served);
  train::UnitTrainer unit_trainer(cfg, env().world, env().bootstrap,
                                  [&](Device& d) { return models::make_train_model(*cfg.zero3.model, d); });
  train::TrainerOptions options;
  options.steps = 2;
  CHECK_THROWS_WITH(train::Trainer(unit_trainer, data, options), Contains("zero3.spike.action"));
}
