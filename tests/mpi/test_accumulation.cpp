// zero3.accumulation's memory policy at world sizes 1 and 2, with the library's host GPT on synthetic data and
// the host device simulating a device of a chosen capacity (MemoryCheck::device_memory_bytes). The capacities
// are chosen from the job's own memory plans at micro-batches 8, 4 and 2, and a model wrapper adds chosen bytes
// to the activations it reports, to drive the measured pressure:
// - a device that cannot hold micro-batch 8 starts at the largest micro-batch planned within `high`, never grows
//   past it however low its use, and trains to the losses of the fixed micro-batch-8 job (fp32 reduction-order
//   tolerance), bitwise those of the fixed job with that micro-batch, on the same samples in the same order;
// - measured use above `high` on one rank for `rounds` steps halves the micro-batch on every rank, and use below
//   `low` on every rank doubles it back; each change is an event, and the samples stay those of the fixed job;
// - a resumed run continues at the micro-batch the checkpoint was saved with, bitwise the straight run;
// - the policy without a device capacity, and low >= high, are named errors.
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test_env.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"
#include "zero3/models/model_factory.hpp"
#include "zero3/train/accumulation.hpp"
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

constexpr std::int64_t kMicro = 8;  // the configured micro-batch (accumulation 1)
constexpr std::int64_t kSeqLen = 32;

// A GPT whose activations dominate its device memory: micro-batch x seq_len rows of every layer's activations
// against a few thousand parameters.
config::Config job_config(std::int64_t micro, const std::string& accumulation) {
  const int world = env().world.size;
  const std::string text = fmt::format(
      R"({{"train_batch_size": {}, "train_micro_batch_size_per_gpu": {}, "gradient_clipping": 1.0,
          "optimizer": {{"type": "AdamW", "params": {{"lr": 0.003}}}},
          "zero_optimization": {{"stage": 3, "stage3_param_persistence_threshold": 0}},
          "zero3": {{"seed": 11, "device": "host",
                    "model": {{"type": "gpt", "layers": 2, "hidden_size": 32, "heads": 2, "vocab_size": 64,
                              "seq_len": {}}},
                    "data": {{"source": "synthetic:markov", "markov_order": 1}}{}}}}})",
      kMicro * world, micro, kSeqLen, accumulation.empty() ? "" : R"(, "accumulation": )" + accumulation);
  config::ParseOptions o;
  o.world_size = world;
  o.world_size_source = "test";
  return config::load_config_text_or_throw(text, o);
}

std::string memory_policy(std::int64_t rounds, double low = 0.75) {
  return fmt::format(R"({{"policy": "memory", "high": 0.9, "low": {}, "rounds": {}}})", low, rounds);
}

// The activation bytes a model reports on top of its own, per train micro-batch call of this rank.
using ExtraBytes = std::function<std::size_t(std::int64_t train_call)>;

class PressureModel final : public models::UnitModel {
 public:
  PressureModel(std::unique_ptr<models::UnitModel> inner, ExtraBytes extra)
      : inner_(std::move(inner)), extra_(std::move(extra)) {}
  const std::vector<UnitSpec>& units() const override { return inner_->units(); }
  std::string describe() const override { return inner_->describe(); }
  void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len,
                 models::Pass pass) override {
    if (pass == models::Pass::train) ++train_calls_;
    pass_ = pass;
    inner_->set_batch(tokens, targets, batch, len, pass);
  }
  void forward_unit(std::size_t unit, std::span<const BufferView> params, Stream& stream) override {
    inner_->forward_unit(unit, params, stream);
  }
  double loss(Stream& stream) override { return inner_->loss(stream); }
  void backward_unit(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                     float seed_scale, Stream& stream) override {
    inner_->backward_unit(unit, params, grads, seed_scale, stream);
  }
  std::size_t activation_bytes() const override {
    const std::size_t extra = extra_ && pass_ == models::Pass::train ? extra_(train_calls_ - 1) : 0;
    return inner_->activation_bytes() + extra;
  }
  MemoryKind activation_memory() const override { return inner_->activation_memory(); }
  std::size_t planned_activation_bytes(const ActivationShape& shape) const override {
    return inner_->planned_activation_bytes(shape);
  }

 private:
  std::unique_ptr<models::UnitModel> inner_;
  ExtraBytes extra_;
  models::Pass pass_ = models::Pass::train;
  std::int64_t train_calls_ = 0;
};

// TokenWindows that records, per data step, the tokens it handed out (in order) and the micro-batch sizes.
struct Served {
  std::map<std::int64_t, std::vector<std::int32_t>> tokens;
  std::map<std::int64_t, std::vector<std::int64_t>> micro_sizes;
};

class RecordingData final : public train::TrainData {
 public:
  RecordingData(const config::Config& cfg, Served& served)
      : inner_(cfg, rank(), env().world.size,
               {.context = kSeqLen, .predictions_per_window = kSeqLen, .heldout_windows = env().world.size}),
        served_(served) {}
  train::TokenBatch micro_batch(std::int64_t step, std::int64_t micro, std::int64_t micro_size) override {
    train::TokenBatch b = inner_.micro_batch(step, micro, micro_size);
    std::vector<std::int32_t>& t = served_.tokens[step];
    t.insert(t.end(), b.tokens.begin(), b.tokens.end());
    served_.micro_sizes[step].push_back(micro_size);
    return b;
  }
  train::TokenBatch heldout() override { return inner_.heldout(); }
  std::int64_t heldout_windows() const override { return inner_.heldout_windows(); }
  std::int64_t predictions_per_window() const override { return inner_.predictions_per_window(); }
  nlohmann::json position(std::int64_t steps) const override { return inner_.position(steps); }
  void check_resume(const nlohmann::json& saved, std::int64_t step) const override { inner_.check_resume(saved, step); }
  std::string describe() const override { return inner_.describe(); }

 private:
  train::TokenWindows inner_;
  Served& served_;
};

struct LossRecorder final : train::TrainObserver {
  std::vector<double> losses;
  void on_step(const train::StepEvent& e) override { losses.push_back(e.loss); }
};

struct Job {
  std::int64_t micro = kMicro;
  std::string accumulation{};  // the "accumulation" block, empty: fixed
  std::optional<std::uint64_t> device_bytes{};
  ExtraBytes extra{};
  std::int64_t steps = 6;
  std::filesystem::path save_dir{};
  std::optional<std::int64_t> save_interval{};
  std::filesystem::path resume{};
};

struct Outcome {
  std::vector<double> losses;
  Served served;
  std::uint64_t planned_device = 0;  // the start-up plan's device peak
};

Outcome run(const Job& job) {
  const config::Config cfg = job_config(job.micro, job.accumulation);
  Outcome out;
  RecordingData data(cfg, out.served);
  train::MemoryCheck check{.eval_batch = 1, .len = static_cast<int>(kSeqLen), .device_memory_bytes = job.device_bytes};
  train::UnitTrainer unit_trainer(
      cfg, env().world, env().bootstrap,
      [&](Device& d) {
        return std::make_unique<PressureModel>(models::make_train_model(*cfg.zero3.model, d), job.extra);
      },
      check);
  out.planned_device = unit_trainer.memory_plan().peak_total(MemoryKind::device);
  train::TrainerOptions options;
  options.steps = job.steps;
  options.log_interval = 0;
  options.save_dir = job.save_dir;
  options.save_interval = job.save_interval;
  options.resume = job.resume;
  options.checkpoint.async = false;
  train::Trainer trainer(unit_trainer, data, options);
  const auto losses = std::make_shared<LossRecorder>();
  trainer.add_observer(losses);
  trainer.run();
  out.losses = losses->losses;
  return out;
}

// The planned device peak of the fixed job at `micro` (no run).
std::uint64_t planned(std::int64_t micro) {
  const config::Config cfg = job_config(micro, "");
  train::UnitTrainer t(
      cfg, env().world, env().bootstrap, [&](Device& d) { return models::make_train_model(*cfg.zero3.model, d); },
      train::MemoryCheck{.eval_batch = 1, .len = static_cast<int>(kSeqLen), .device_memory_bytes = std::nullopt});
  return t.memory_plan().peak_total(MemoryKind::device);
}

// A directory every rank agrees on, empty.
std::filesystem::path shared_dir(const std::string& name) {
  return test::shared_empty_dir(*env().bootstrap, "zero3-accum", name);
}

// The "accumulation_changed" events of a run directory: [micro_batch_from, micro_batch_to, step].
std::vector<std::array<double, 3>> changes(const std::filesystem::path& dir) {
  std::vector<std::array<double, 3>> out;
  std::ifstream in(dir / "events.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json e = nlohmann::json::parse(line);
    if (e.value("kind", "") != "accumulation_changed") continue;
    out.push_back({e["figures"]["micro_batch_from"].get<double>(), e["figures"]["micro_batch_to"].get<double>(),
                   e["step"].get<double>()});
  }
  return out;
}

void check_same_samples(const Served& a, const Served& b) {
  REQUIRE(a.tokens.size() == b.tokens.size());
  for (const auto& [step, tokens] : a.tokens) {
    INFO("data step " << step);
    REQUIRE(b.tokens.contains(step));
    CHECK(tokens == b.tokens.at(step));
  }
}

void check_close_losses(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("step " << i + 1 << ": " << a[i] << " vs " << b[i]);
    CHECK(std::abs(a[i] - b[i]) <= 1e-5 * std::abs(b[i]));
  }
}

}  // namespace

TEST_CASE("a device that cannot hold micro-batch 8 starts smaller and trains as the fixed job", "[train][accum]") {
  const std::uint64_t p8 = planned(8);
  const std::uint64_t p4 = planned(4);
  const std::uint64_t p2 = planned(2);
  REQUIRE(p2 < p4);
  REQUIRE(p4 < p8);
  // high x budget between the plans of micro-batches 2 and 4: the job starts at 2, accumulating 4.
  const auto budget = static_cast<std::uint64_t>(static_cast<double>(p2 + p4) / 2.0 / 0.9);
  REQUIRE(budget < p8);
  const std::filesystem::path dir = shared_dir("plan");
  events::configure({.run_dir = dir, .rank = rank()});
  // Its use at micro-batch 2 stays below `low` (0.89 here) every step, and the policy still does not grow
  // past what the plan started with: micro-batch 4 is planned past `high`.
  const Outcome adaptive = run({.accumulation = memory_policy(1, 0.89), .device_bytes = budget});
  events::configure({});
  const Outcome fixed8 = run({});
  const Outcome fixed2 = run({.micro = 2});
  CHECK(adaptive.planned_device == p2);
  for (const auto& [step, sizes] : adaptive.served.micro_sizes) CHECK(sizes == std::vector<std::int64_t>(4, 2));
  check_same_samples(adaptive.served, fixed8.served);
  check_close_losses(adaptive.losses, fixed8.losses);
  CHECK(adaptive.losses == fixed2.losses);  // the same computation, bit for bit
  if (rank() == 0) {
    const auto c = changes(dir);
    REQUIRE(c.size() == 1);
    CHECK(c[0] == std::array<double, 3>{8, 2, 0});
  }
  // Below micro-batch 1's plan nothing helps: the start-up refusal names the policy's last resort.
  REQUIRE_THROWS_WITH(run({.accumulation = memory_policy(1000), .device_bytes = planned(1) / 2}),
                      Contains("memory: the job's plan needs"));
}

TEST_CASE("measured pressure on one rank halves the micro-batch everywhere; low use doubles it back",
          "[train][accum]") {
  const std::uint64_t p8 = planned(8);
  const std::uint64_t budget = 2 * p8;  // the plan of micro-batch 8 is well inside `high`, and `low`
  // The last rank reports a device's worth more after train calls 0 and 1 (steps 1-2 at micro-batch 8,
  // accumulation 1: above high for 2 rounds -> micro-batch 4 from step 3); then nothing more. Step 3 settles
  // (it starts with step 2's buffers held) and is not counted; below low on every rank for 2 rounds (steps 4-5)
  // -> micro-batch 8 from step 6.
  const bool last = rank() == env().world.size - 1;
  const ExtraBytes extra = [&](std::int64_t call) -> std::size_t { return last && call < 2 ? budget : 0; };
  const std::filesystem::path dir = shared_dir("measured");
  events::configure({.run_dir = dir, .rank = rank()});
  const Outcome adaptive = run({.accumulation = memory_policy(2), .device_bytes = budget, .extra = extra, .steps = 6});
  events::configure({});
  const Outcome fixed8 = run({.steps = 6});
  std::vector<std::vector<std::int64_t>> sizes;
  for (const auto& [step, s] : adaptive.served.micro_sizes) sizes.push_back(s);
  const std::vector<std::vector<std::int64_t>> expected = {{8}, {8}, {4, 4}, {4, 4}, {4, 4}, {8}};
  CHECK(sizes == expected);
  check_same_samples(adaptive.served, fixed8.served);
  check_close_losses(adaptive.losses, fixed8.losses);
  if (rank() == 0) {
    const auto c = changes(dir);
    REQUIRE(c.size() == 2);
    CHECK(c[0] == std::array<double, 3>{8, 4, 2});
    CHECK(c[1] == std::array<double, 3>{4, 8, 5});
  }
}

TEST_CASE("a resumed run continues at the checkpoint's micro-batch, bitwise the straight run", "[train][accum]") {
  const std::uint64_t budget = 2 * planned(8);
  const bool last = rank() == env().world.size - 1;
  // Above high through step 2 only: micro-batch 4 from step 3 on, step 3 settling, steps 4-5 below low (the
  // change back comes after the last step). The checkpoint of step 3 holds micro-batch 4 and the counts.
  const ExtraBytes extra = [&](std::int64_t call) -> std::size_t { return last && call < 2 ? budget : 0; };
  const std::string policy = R"({"policy": "memory", "high": 0.9, "low": 0.75, "rounds": 2})";
  const Outcome straight = run({.accumulation = policy, .device_bytes = budget, .extra = extra, .steps = 5});
  const std::filesystem::path dir = shared_dir("resume");
  run({.accumulation = policy, .device_bytes = budget, .extra = extra, .steps = 3, .save_dir = dir});
  // The resumed run's model wrapper counts its own calls from 0: it adds nothing, as the straight run did by then.
  const Outcome resumed = run({.accumulation = policy,
                               .device_bytes = budget,
                               .extra = [](std::int64_t) -> std::size_t { return 0; },
                               .steps = 5,
                               .save_dir = dir,
                               .resume = dir});
  REQUIRE(straight.losses.size() == 5);
  REQUIRE(resumed.losses.size() == 2);
  CHECK(resumed.losses[0] == straight.losses[3]);
  CHECK(resumed.losses[1] == straight.losses[4]);
  CHECK(resumed.served.micro_sizes.at(3) == straight.served.micro_sizes.at(3));
  CHECK(resumed.served.micro_sizes.at(3) == std::vector<std::int64_t>{4, 4});
  if (rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("the memory policy needs a device limit, and low below high", "[train][accum]") {
  REQUIRE_THROWS_WITH(run({.accumulation = memory_policy(3)}), Contains("--device-memory-gb"));
  REQUIRE_THROWS_WITH(job_config(kMicro, R"({"policy": "memory", "high": 0.7, "low": 0.8})"),
                      Contains("zero3.accumulation.low"));
  // The choices a per-rank batch allows: its divisors up to the configured micro-batch.
  CHECK(train::micro_batch_choices(12, 8) == std::vector<std::int64_t>{1, 2, 3, 4, 6});
}
