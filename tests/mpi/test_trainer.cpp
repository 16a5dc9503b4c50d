// The training loop of zero3/train at world sizes 1-4, with the library's host MLP on synthetic Markov
// data (TokenWindows): observers are called as documented (a step event per step, a log event per
// interval with the same figures on every rank); a run stopped and resumed from its checkpoint continues
// bit for bit like the straight run; an observer that throws ends the run with its error after every
// observer's on_error; options that cannot work are ConfigErrors. Collectives are unconditional on every
// rank and results are checked with CHECK after them.
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi_test_env.hpp"
#include "trainer_test_config.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/models/model_factory.hpp"
#include "zero3/train/sinks.hpp"
#include "zero3/train/trainer.hpp"

using namespace zero3;

namespace {

test::MpiTestEnv& env() {
  return test::mpi_env();
}

config::Config mlp_config(std::int64_t steps) {
  return test::mlp_job_config({.steps = steps}, env().world.size);
}

// Records every event it is told of.
struct Recorder final : train::TrainObserver {
  std::vector<train::StepEvent> steps;
  std::vector<train::LogEvent> logs;
  std::vector<ckpt::SaveReport> saves;
  int resumes = 0;
  int errors = 0;
  std::string error_text;
  void on_resume(const ckpt::LoadResult&) override { ++resumes; }
  void on_step(const train::StepEvent& e) override { steps.push_back(e); }
  void on_log(const train::LogEvent& e) override { logs.push_back(e); }
  void on_save(const ckpt::SaveReport& r) override { saves.push_back(r); }
  void on_error(const std::exception_ptr& error) noexcept override {
    ++errors;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      error_text = e.what();
    }
  }
};

// Throws from on_log at `step`.
struct ThrowAt final : train::TrainObserver {
  std::int64_t step;
  explicit ThrowAt(std::int64_t s) : step(s) {}
  void on_log(const train::LogEvent& e) override {
    if (e.step == step) throw Error(fmt::format("policy stop at step {}", e.step));
  }
};

struct Run {
  train::TrainSummary summary;
  std::shared_ptr<Recorder> recorder = std::make_shared<Recorder>();
  std::string error;  // what run() threw, if it did
};

Run train_run(std::int64_t steps, const std::filesystem::path& save_dir, bool resume,
              std::shared_ptr<train::TrainObserver> extra = nullptr) {
  const config::Config cfg = mlp_config(steps);
  const config::ModelSettings& ms = *cfg.zero3.model;
  train::TokenWindows data(cfg, env().world.rank, env().world.size,
                           {.context = ms.seq_len, .predictions_per_window = 1, .heldout_windows = 64});
  train::UnitTrainer unit_trainer(cfg, env().world, env().bootstrap,
                                  [&](Device& d) { return models::make_train_model(ms, d); });
  train::TrainerOptions options;
  options.steps = steps;
  options.log_interval = 2;
  options.save_dir = save_dir;
  if (resume) options.resume = save_dir;
  options.checkpoint.async = false;
  train::Trainer trainer(unit_trainer, data, options);
  Run run;
  trainer.add_observer(run.recorder);
  if (extra) trainer.add_observer(extra);
  try {
    run.summary = trainer.run();
  } catch (const std::exception& e) {
    run.error = e.what();
  }
  return run;
}

// A directory every rank agrees on, empty.
std::filesystem::path shared_dir(const std::string& name) {
  return test::shared_empty_dir(*env().bootstrap, "zero3-trainer", name);
}

}  // namespace

TEST_CASE("the loop calls its observers per step and per interval", "[train]") {
  const Run r = train_run(7, {}, false);
  CHECK(r.error.empty());
  REQUIRE(r.recorder->steps.size() == 7);
  for (std::size_t i = 0; i < r.recorder->steps.size(); ++i) {
    const train::StepEvent& e = r.recorder->steps[i];
    CHECK(e.step == static_cast<std::int64_t>(i) + 1);
    CHECK(e.samples == e.step * 48);
    CHECK(e.result.boundary);
  }
  // Every 2 steps, and the last one.
  std::vector<std::int64_t> logged;
  for (const train::LogEvent& e : r.recorder->logs) logged.push_back(e.step);
  CHECK(logged == std::vector<std::int64_t>{2, 4, 6, 7});
  CHECK(r.recorder->errors == 0);
  CHECK(r.summary.heldout_loss == r.recorder->logs.back().heldout_loss);
  // The log figures are global: every rank got the same bits.
  const double mine = r.recorder->logs.back().train_loss + 1e3 * r.recorder->logs.back().heldout_loss;
  std::vector<std::byte> bytes(sizeof mine);
  std::memcpy(bytes.data(), &mine, sizeof mine);
  const std::vector<std::byte> all = env().bootstrap->all_gather(bytes);
  for (std::size_t off = 0; off < all.size(); off += sizeof mine) {
    double v = 0.0;
    std::memcpy(&v, all.data() + off, sizeof v);
    CHECK(v == mine);
  }
  // It trained: the held-out loss of the last interval is below the first one's.
  CHECK(r.recorder->logs.back().heldout_loss < r.recorder->logs.front().heldout_loss);
}

TEST_CASE("a run resumed from its checkpoint continues like the straight run", "[train][ckpt]") {
  const std::filesystem::path dir = shared_dir("resume");
  const Run straight = train_run(8, {}, false);
  const Run first = train_run(4, dir, false);
  const Run second = train_run(8, dir, true);
  CHECK(first.error.empty());
  CHECK(second.error.empty());
  CHECK(first.recorder->saves.size() == 1);  // the final state
  CHECK(second.recorder->resumes == 1);
  CHECK(second.summary.start_step == 4);
  REQUIRE(second.recorder->steps.size() == 4);
  REQUIRE(straight.recorder->steps.size() == 8);
  for (std::size_t i = 0; i < 4; ++i) {
    const train::StepEvent& a = straight.recorder->steps[i + 4];
    const train::StepEvent& b = second.recorder->steps[i];
    CHECK(a.step == b.step);
    CHECK(a.loss == b.loss);
    CHECK(a.result.grad_norm == b.result.grad_norm);
    CHECK(a.result.lr == b.result.lr);
  }
  CHECK(straight.summary.heldout_loss == second.summary.heldout_loss);
  env().bootstrap->barrier();
  if (env().world.rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("an observer that throws ends the run after on_error", "[train]") {
  const Run r = train_run(10, {}, false, std::make_shared<ThrowAt>(4));
  CHECK_THAT(r.error, Catch::Matchers::Contains("policy stop at step 4"));
  CHECK(r.recorder->errors == 1);
  CHECK_THAT(r.recorder->error_text, Catch::Matchers::Contains("policy stop at step 4"));
  CHECK(r.recorder->steps.size() == 4);
}

TEST_CASE("trainer options that cannot work are ConfigErrors", "[train]") {
  const config::Config cfg = mlp_config(2);
  const config::ModelSettings& ms = *cfg.zero3.model;
  train::TokenWindows data(cfg, env().world.rank, env().world.size,
                           {.context = ms.seq_len, .predictions_per_window = 1, .heldout_windows = 8});
  train::UnitTrainer unit_trainer(cfg, env().world, env().bootstrap,
                                  [&](Device& d) { return models::make_train_model(ms, d); });
  train::TrainerOptions zero_steps;
  CHECK_THROWS_AS(train::Trainer(unit_trainer, data, zero_steps), ConfigError);
  train::TrainerOptions latest;
  latest.steps = 2;
  latest.resume = "latest";
  CHECK_THROWS_WITH(train::Trainer(unit_trainer, data, latest), Catch::Matchers::Contains("--save-dir"));
  train::TrainerOptions interval;
  interval.steps = 2;
  interval.save_interval = 0;
  CHECK_THROWS_AS(train::Trainer(unit_trainer, data, interval), ConfigError);
}
