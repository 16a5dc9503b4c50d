// Exact resume: a run saved at step 3 (sync and async saves) and resumed by an engine made with other
// initial values ends bitwise equal to an uninterrupted run, for AdamW + WarmupLR, bf16 + CPU offload, fp16
// with overflow skips, Lion, Adagrad, frozen params with accumulation, offload_param, NVMe offload, and 16-bit
// optimizer storage (bf16 master and moments, fp16 master) on the device and offloaded. A checkpoint of one
// optimizer storage loads into a job of another converted, with a note naming both.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "ckpt_fixtures.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/checkpointer.hpp"
#include "zero3/core/dtype.hpp"

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
  const std::string bf16_storage =
      R"("bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true})";
  {
    ResumeCase c;
    c.name = "bf16 master + bf16 states, on the device";
    c.text.precision = bf16_storage;
    c.text.clipping = 0.5;
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "bf16 master + bf16 states, offload_optimizer cpu, frozen params";
    c.frozen = true;
    c.text.precision = bf16_storage;
    c.text.zero += ", " + offload_opt;
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "fp16 master, offload_optimizer nvme, Lion";
    c.text.precision = R"("fp16": {"enabled": true, "initial_scale_power": 8, "fp16_master_weights_and_grads": true})";
    c.text.optimizer = R"({"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.1}})";
    c.text.zero +=
        R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + test::nvme_test_directory() + R"("})";
    cases.push_back(c);
  }
  {
    // Frozen params sit after the trainable ones in the params' file: the step's last slice ends inside a
    // block whose rest is theirs.
    ResumeCase c;
    c.name = "bf16, offload_param nvme + offload_optimizer nvme, frozen params";
    c.frozen = true;
    c.text.precision = R"("bf16": {"enabled": true})";
    c.text.zero += R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + test::nvme_test_directory() +
                   R"(", "pipeline_read": true, "pipeline_write": true}, "offload_param": {"device": "nvme", )" +
                   R"("nvme_path": ")" + test::nvme_test_directory() + R"(", "max_in_cpu": 0, "buffer_count": 2})";
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

namespace {

// The values a job whose optimizer stores `dtype` holds after writing `v` (fp32): rounded to nearest even.
float stored_as(DType dtype, float v) {
  if (dtype == DType::bf16) return bf16_to_float(float_to_bf16(v));
  if (dtype == DType::f16) return fp16_to_float(float_to_fp16(v));
  return v;
}

// Saves job `from` at step kSaveAt, loads it into job `to` (other storage dtypes, same model dtype) and checks
// the note and that every optimizer tensor of `to` is `from`'s value as `to` stores it.
void run_converting_load(const std::string& from, const std::string& to, const std::string& name) {
  INFO(fmt::format("[np{}] {}", world_size(), name));
  const model::ModelConfig mc = transformer();
  const std::vector<UnitSpec> units = transformer_units(mc, /*frozen=*/false);
  ConfigText from_text = trainer_config();
  from_text.precision = from;
  ConfigText to_text = trainer_config();
  to_text.precision = to;
  const SharedTempDir root;
  EngineTrainer saver(from_text.parse(), mc, units);
  train_steps(saver, 0, kSaveAt);
  const Snapshot saved = snapshot(saver.engine());
  {
    ckpt::Checkpointer ck(saver.engine(), env().bootstrap, {.async = false});
    ck.save(root.path(), "step3", kSaveAt, Json::object());
    for (const ckpt::SaveReport& r : ck.wait()) CHECK(r.ok);
  }
  EngineTrainer loader(to_text.parse(), mc, reinitialized(units));
  ckpt::Checkpointer ck(loader.engine(), env().bootstrap);
  const ckpt::LoadResult loaded = ck.load(root.path());
  const config::Config& a = saver.engine().config();
  const config::Config& b = loader.engine().config();
  REQUIRE(loaded.notes.size() == 1);
  const std::string& note = loaded.notes[0];
  INFO(note);
  CHECK_THAT(note, Contains(fmt::format("checkpoint's master {} / states {}", dtype_name(a.master_dtype()),
                                        dtype_name(a.optimizer_state_dtype()))));
  CHECK_THAT(note, Contains(fmt::format("job's master {} / states {}", dtype_name(b.master_dtype()),
                                        dtype_name(b.optimizer_state_dtype()))));
  const Snapshot got = snapshot(loader.engine());
  REQUIRE(got.names == saved.names);
  int differing = 0;
  for (std::size_t t = 0; t < got.tensors.size(); ++t) {
    const bool is_master = got.names[t].ends_with("/master");
    const bool is_param = got.names[t].ends_with("/param");
    const DType dtype = is_param ? b.model_dtype() : is_master ? b.master_dtype() : b.optimizer_state_dtype();
    std::vector<float> want = saved.tensors[t];
    for (float& v : want) v = stored_as(dtype, v);
    if (std::memcmp(want.data(), got.tensors[t].data(), want.size() * sizeof(float)) != 0 && ++differing <= 3) {
      UNSCOPED_INFO(fmt::format("{} is not the checkpoint's value rounded to {}", got.names[t], dtype_name(dtype)));
    }
  }
  CHECK(differing == 0);
  // It trains on from there.
  CHECK(train_steps(loader, kSaveAt, kSaveAt + 1).back().applied);
}

}  // namespace

TEST_CASE("a checkpoint of other optimizer storage dtypes loads converted, with a note", "[ckpt][storage]") {
  const std::string fp32_storage = R"("bf16": {"enabled": true})";
  const std::string bf16_storage =
      R"("bf16": {"enabled": true, "bf16_master_weights_and_grads": true, "bf16_optimizer_states": true})";
  const std::string bf16_master = R"("bf16": {"enabled": true, "bf16_master_weights_and_grads": true})";
  run_converting_load(fp32_storage, bf16_storage, "fp32 storage saved, bf16 master + states loaded (rounded)");
  run_converting_load(bf16_storage, fp32_storage, "bf16 master + states saved, fp32 storage loaded (widened)");
  run_converting_load(bf16_storage, bf16_master, "bf16 states saved, fp32 states loaded");
}
