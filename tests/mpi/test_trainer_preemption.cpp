// A stop request in the training loop at world sizes 1-3 (the library's host MLP): made on one rank only
// (the last), it stops every rank after the same step, saves a checkpoint there, and run() returns
// TrainSummary::preempted; the run resumed from that checkpoint continues bit for bit like the straight
// run. Without save_dir nothing is saved (and the summary says so); with stop_on_request off, or at the
// last step, the request changes nothing. Collectives are unconditional on every rank.
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "mpi_test_env.hpp"
#include "trainer_test_config.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/models/model_factory.hpp"
#include "zero3/train/preemption.hpp"
#include "zero3/train/trainer.hpp"

using namespace zero3;

namespace {

test::MpiTestEnv& env() {
  return test::mpi_env();
}

config::Config mlp_config(std::int64_t steps) {
  return test::mlp_job_config({.steps = steps, .seed = 7}, env().world.size);
}

// Records the steps; on rank `rank` asks for a stop in on_step of step `at` (the other ranks do not).
struct StopAt final : train::TrainObserver {
  int rank = -1;
  std::int64_t at = -1;
  std::vector<train::StepEvent> steps;
  void on_step(const train::StepEvent& e) override {
    steps.push_back(e);
    if (e.step == at && env().world.rank == rank) train::request_stop();
  }
};

struct Run {
  train::TrainSummary summary;
  std::vector<train::StepEvent> steps;
};

Run train_run(std::int64_t steps, const std::filesystem::path& save_dir, bool resume, std::int64_t stop_at,
              bool stop_on_request = true) {
  train::clear_stop_request();
  const config::Config cfg = mlp_config(steps);
  const config::ModelSettings& ms = *cfg.zero3.model;
  train::TokenWindows data(cfg, env().world.rank, env().world.size,
                           {.context = ms.seq_len, .predictions_per_window = 1, .heldout_windows = 32});
  train::UnitTrainer unit_trainer(cfg, env().world, env().bootstrap,
                                  [&](Device& d) { return models::make_train_model(ms, d); });
  train::TrainerOptions options;
  options.steps = steps;
  options.log_interval = 4;
  options.save_dir = save_dir;
  if (resume) options.resume = save_dir;
  options.stop_on_request = stop_on_request;
  train::Trainer trainer(unit_trainer, data, options);
  auto observer = std::make_shared<StopAt>();
  observer->rank = env().world.size - 1;
  observer->at = stop_at;
  trainer.add_observer(observer);
  Run run;
  run.summary = trainer.run();
  run.steps = observer->steps;
  train::clear_stop_request();
  return run;
}

// A directory every rank agrees on, empty.
std::filesystem::path shared_dir(const std::string& name) {
  return test::shared_empty_dir(*env().bootstrap, "zero3-preempt", name);
}

}  // namespace

// The request is made after step 3 (an observer's on_step), so it marks the window of step 4: every rank
// stops after step 4, the step in progress when the request came.
TEST_CASE("a stop asked on one rank stops every rank after the step in progress, with a checkpoint",
          "[train][preemption]") {
  const std::filesystem::path dir = shared_dir("stop");
  const Run straight = train_run(9, {}, false, -1);
  const Run stopped = train_run(9, dir, false, 3);
  REQUIRE(stopped.summary.preempted.has_value());
  const train::Preemption& p = *stopped.summary.preempted;
  CHECK(p.step == 4);
  CHECK(p.reason == train::kStopRequestedByCall);
  CHECK(p.ranks_asked == std::vector<int>{env().world.size - 1});
  REQUIRE(p.checkpoint.has_value());
  CHECK(*p.checkpoint == dir / "global_step4");
  CHECK(stopped.steps.size() == 4);
  CHECK(ckpt::read_latest(dir) == std::optional<std::string>("global_step4"));

  const Run resumed = train_run(9, dir, true, -1);
  CHECK_FALSE(resumed.summary.preempted.has_value());
  CHECK(resumed.summary.start_step == 4);
  REQUIRE(straight.steps.size() == 9);
  REQUIRE(resumed.steps.size() == 5);
  for (std::size_t i = 0; i < 5; ++i) {
    const train::StepEvent& a = straight.steps[i + 4];
    const train::StepEvent& b = resumed.steps[i];
    CHECK(a.step == b.step);
    CHECK(a.loss == b.loss);
    CHECK(a.result.grad_norm == b.result.grad_norm);
    CHECK(a.result.lr == b.result.lr);
  }
  CHECK(straight.summary.heldout_loss == resumed.summary.heldout_loss);
  env().bootstrap->barrier();
  if (env().world.rank == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("a stop without save_dir saves nothing and says so", "[train][preemption]") {
  const Run r = train_run(6, {}, false, 2);
  REQUIRE(r.summary.preempted.has_value());
  CHECK(r.summary.preempted->step == 3);  // asked after step 2
  CHECK_FALSE(r.summary.preempted->checkpoint.has_value());
  CHECK(r.steps.size() == 3);
}

TEST_CASE("a stop at the last step, or with stop_on_request off, changes nothing", "[train][preemption]") {
  const Run last = train_run(4, {}, false, 4);
  CHECK_FALSE(last.summary.preempted.has_value());
  CHECK(last.steps.size() == 4);
  const Run off = train_run(5, {}, false, 2, false);
  CHECK_FALSE(off.summary.preempted.has_value());
  CHECK(off.steps.size() == 5);
}
