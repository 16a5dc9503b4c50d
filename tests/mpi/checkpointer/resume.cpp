// Exact resume: a run saved at step 3 (sync and async saves) and resumed by an engine made with other
// initial values ends bitwise equal to an uninterrupted run, for AdamW + WarmupLR, bf16 + CPU offload, fp16
// with overflow skips, Lion, Adagrad, frozen params with accumulation, offload_param, and NVMe offload.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "ckpt_fixtures.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/checkpointer.hpp"

using namespace zero3;
using namespace zero3::test::engine_trainer;
using namespace zero3::test::ckpt_fixtures;
using Catch::Matchers::Contains;

namespace {

constexpr std::int64_t kSteps = 6;
constexpr std::int64_t kSaveAt = 3;

struct ResumeCase {
  std::string name;
  ConfigText text = trainer_config();
  bool frozen = false;
  std::set<std::int64_t> overflow;
};

void check_same_step(const StepResult& a, const StepResult& c, std::int64_t step) {
  INFO(fmt::format("step {}: applied {} vs {}, lr {} vs {}, loss scale {} -> {} vs {} -> {}, grad norm {} vs {}", step,
                   a.applied, c.applied, a.lr, c.lr, a.loss_scale, a.next_loss_scale, c.loss_scale, c.next_loss_scale,
                   a.grad_norm, c.grad_norm));
  CHECK(a.applied == c.applied);
  CHECK(a.lr == c.lr);
  CHECK(a.loss_scale == c.loss_scale);
  CHECK(a.next_loss_scale == c.next_loss_scale);
  CHECK(((std::isnan(a.grad_norm) && std::isnan(c.grad_norm)) || a.grad_norm == c.grad_norm));
  CHECK(a.global_step == c.global_step);
  CHECK(a.skipped_steps == c.skipped_steps);
}

// A trains kSteps; B trains kSaveAt and saves (async: B trains on while its writer runs); C, made with
// other initial values, loads and trains the remaining steps on the same data. A and C must agree bitwise.
void run_resume(const ResumeCase& rc, bool async) {
  const std::string what = fmt::format("[np{}] {} ({} save)", world_size(), rc.name, async ? "async" : "sync");
  INFO(what);
  const config::Config cfg = rc.text.parse();
  const model::ModelConfig mc = transformer();
  const std::vector<UnitSpec> units = transformer_units(mc, rc.frozen);
  const SharedTempDir root;
  const Json trainer_state = {{"next_step", kSaveAt}, {"data_seed", kDataSeed}, {"case", rc.name}};

  EngineTrainer a(cfg, mc, units);
  const std::vector<StepResult> a_steps = train_steps(a, 0, kSteps, rc.overflow);
  const Snapshot expected = snapshot(a.engine());

  TrainingState saved_training;
  {
    EngineTrainer b(cfg, mc, units);
    train_steps(b, 0, kSaveAt, rc.overflow);
    const Snapshot at_save = snapshot(b.engine());
    saved_training = at_save.training;
    CHECK(count_differences(at_save, expected, what + ": B at the save vs A at the end") > 0);  // training moves
    ckpt::CheckpointerOptions options;
    options.async = async;
    ckpt::Checkpointer ck(b.engine(), env().bootstrap, options);
    ck.save(root.path(), "step3", kSaveAt, trainer_state);
    std::vector<ckpt::SaveReport> reports;
    if (async) {  // the snapshot is taken: training goes on while the writer runs, polled once per step
      CHECK(ck.in_flight());
      for (std::int64_t s = kSaveAt; s < kSteps; ++s) {
        train_steps(b, s, s + 1, rc.overflow);
        for (ckpt::SaveReport& r : ck.poll()) reports.push_back(std::move(r));
      }
    }
    for (ckpt::SaveReport& r : ck.wait()) reports.push_back(std::move(r));
    CHECK(!ck.in_flight());
    CHECK(reports.size() == 1);
    if (!reports.empty()) check_report(reports[0], root.path(), "step3");
    if (async) CHECK(count_differences(snapshot(b.engine()), expected, what + ": B after the async save") == 0);
  }
  CHECK(ckpt::read_latest(root.path()).value_or("") == "step3");

  EngineTrainer c(cfg, mc, reinitialized(units));
  ckpt::Checkpointer ck(c.engine(), env().bootstrap);
  const ckpt::LoadResult loaded = ck.load(root.path());
  CHECK(loaded.tag == "step3");
  CHECK(loaded.step == kSaveAt);
  CHECK(loaded.saved_world_size == world_size());
  CHECK(loaded.trainer_state == trainer_state);
  CHECK(loaded.bytes_read > 0);
  CHECK(describe(c.engine().state().training_state()) == describe(saved_training));
  const std::vector<StepResult> c_steps = train_steps(c, kSaveAt, kSteps, rc.overflow);
  for (std::size_t i = 0; i < c_steps.size(); ++i) {
    check_same_step(a_steps[static_cast<std::size_t>(kSaveAt) + i], c_steps[i], kSaveAt + static_cast<std::int64_t>(i));
  }
  const Snapshot resumed = snapshot(c.engine());
  const int differing = count_differences(resumed, expected, what + ": resumed C vs uninterrupted A");
  CHECK(differing == 0);
  CHECK(describe(resumed.training) == describe(expected.training));
  if (world_rank() == 0) {
    std::printf("%-72s %d of %zu tensors differ (bitwise)\n", what.c_str(), differing, expected.tensors.size());
    std::fflush(stdout);
  }
}

std::vector<ResumeCase> resume_cases() {
  const std::string offload_opt = R"("offload_optimizer": {"device": "cpu", "pin_memory": true})";
  const std::string offload_param = R"("offload_param": {"device": "cpu", "pin_memory": true})";
  std::vector<ResumeCase> cases;
  {
    ResumeCase c;
    c.name = "AdamW fp32, WarmupLR, clipping";
    c.text.scheduler =
        R"({"type": "WarmupLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 3e-3, "warmup_num_steps": 8}})";
    c.text.clipping = 0.5;
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "bf16, offload_optimizer cpu";
    c.text.precision = R"("bf16": {"enabled": true})";
    c.text.zero += ", " + offload_opt;
    c.text.clipping = 0.5;
    cases.push_back(c);
  }
  {
    // Overflows before and after the save: the scaler's hysteresis, window and last overflow must resume.
    ResumeCase c;
    c.name = "fp16 dynamic loss scaling, overflows at steps 1 and 4";
    c.text.precision = R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8,
                          "loss_scale_window": 2, "hysteresis": 2, "min_loss_scale": 1})";
    c.overflow = {1, 4};
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "Lion";
    c.text.optimizer = R"({"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.1}})";
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "Adagrad";
    c.text.optimizer = R"({"type": "Adagrad", "params": {"lr": 1e-2, "weight_decay": 0.01}})";
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "frozen params, persistent units, gradient accumulation 2";
    c.frozen = true;
    c.text.train_batch = 24;
    c.text.gas = 2;
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "offload_param cpu, persistent units";
    c.text.zero += ", " + offload_param;
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "bf16, offload_optimizer nvme, gradient accumulation 2";
    c.text.precision = R"("bf16": {"enabled": true})";
    c.text.zero += R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + test::nvme_test_directory() +
                   R"(", "pipeline_read": true, "pipeline_write": true})";
    c.text.train_batch = 24;
    c.text.gas = 2;
    c.text.clipping = 0.5;
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "bf16, offload_param + offload_optimizer, frozen params";
    c.frozen = true;
    c.text.precision = R"("bf16": {"enabled": true})";
    c.text.zero += ", " + offload_opt + ", " + offload_param;
    cases.push_back(c);
  }
  return cases;
}

}  // namespace

TEST_CASE("a checkpoint resumes training exactly: sync and async saves", "[ckpt][resume]") {
  for (const ResumeCase& c : resume_cases()) {
    for (const bool async : {true, false}) run_resume(c, async);
  }
}
