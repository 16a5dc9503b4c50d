// A trainer's own model and data trained with zero3's loop (zero3/train/trainer.hpp), as an embedder
// would write them against the installed package: a bigram model (one engine unit, a [V, V] table of
// logits) computed on the host through Stream::launch_host on the engine's compute stream, and data from
// a first-order Markov chain whose entropy rate is computed here exactly. The run trains half way with a
// checkpoint, resumes from it in a second Trainer, and must end within 0.1 nats/token of the floor.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "consumer_checks.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/train/sinks.hpp"
#include "zero3/train/trainer.hpp"

namespace {

constexpr int kVocab = 8;
constexpr int kLen = 16;

// P[i][j]: the chain's transition probabilities, skewed so that the floor is well below log(kVocab).
std::vector<double> transitions() {
  std::vector<double> p(kVocab * kVocab);
  for (int i = 0; i < kVocab; ++i) {
    double sum = 0.0;
    for (int j = 0; j < kVocab; ++j) {
      p[i * kVocab + j] = std::exp(-1.5 * std::abs(((j - i + kVocab) % kVocab) - 1));
      sum += p[i * kVocab + j];
    }
    for (int j = 0; j < kVocab; ++j) p[i * kVocab + j] /= sum;
  }
  return p;
}

class BigramChain final : public zero3::train::TrainData {
 public:
  explicit BigramChain(int heldout) : p_(transitions()) {
    // Stationary distribution by power iteration; windows start from it, so every prediction's expected
    // loss is the entropy rate.
    pi_.assign(kVocab, 1.0 / kVocab);
    for (int it = 0; it < 2000; ++it) {
      std::vector<double> next(kVocab, 0.0);
      for (int i = 0; i < kVocab; ++i)
        for (int j = 0; j < kVocab; ++j) next[j] += pi_[i] * p_[i * kVocab + j];
      pi_ = next;
    }
    floor_ = 0.0;
    for (int i = 0; i < kVocab; ++i)
      for (int j = 0; j < kVocab; ++j) floor_ -= pi_[i] * p_[i * kVocab + j] * std::log(p_[i * kVocab + j]);
    heldout_ = windows(heldout, 1u << 30);
  }

  zero3::train::TokenBatch micro_batch(std::int64_t step, std::int64_t micro, std::int64_t micro_size) override {
    return windows(static_cast<int>(micro_size), static_cast<std::uint64_t>(step * 1000 + micro));
  }
  zero3::train::TokenBatch heldout() override { return heldout_; }
  std::int64_t heldout_windows() const override { return heldout_.batch; }
  std::int64_t predictions_per_window() const override { return kLen; }
  std::optional<double> entropy_floor() const override { return floor_; }
  nlohmann::json position(std::int64_t steps) const override { return {{"step", steps}}; }
  void check_resume(const nlohmann::json& saved, std::int64_t step) const override {
    consumer::expect(saved.value("step", -1) == step, "the checkpoint's trainer state holds its step");
  }
  std::string describe() const override { return "first-order Markov chain over 8 tokens"; }

 private:
  zero3::train::TokenBatch windows(int count, std::uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::discrete_distribution<int> start(pi_.begin(), pi_.end());
    zero3::train::TokenBatch b;
    b.batch = count;
    b.len = kLen;
    for (int w = 0; w < count; ++w) {
      int t = start(rng);
      for (int k = 0; k < kLen; ++k) {
        std::discrete_distribution<int> next(p_.begin() + t * kVocab, p_.begin() + (t + 1) * kVocab);
        const int n = next(rng);
        b.tokens.push_back(t);
        b.targets.push_back(n);
        t = n;
      }
    }
    return b;
  }

  std::vector<double> p_;
  std::vector<double> pi_;
  double floor_ = 0.0;
  zero3::train::TokenBatch heldout_;
};

// logits[token] is a row of the table; softmax cross-entropy per position. Host compute, enqueued on the
// engine's compute stream so that it runs after the gather the stream waits for.
class BigramModel final : public zero3::models::UnitModel {
 public:
  BigramModel() {
    zero3::ParamSpec table;
    table.name = "bigram.logits";
    table.shape = {kVocab, kVocab};
    table.init = zero3::ParamInit::zeros();
    table.weight_decay = false;
    units_.push_back({"bigram", {table}});
  }
  const std::vector<zero3::UnitSpec>& units() const override { return units_; }
  std::string describe() const override { return "bigram table 8 x 8"; }
  void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len,
                 zero3::models::Pass /*pass*/) override {
    tokens_.assign(tokens.begin(), tokens.end());
    targets_.assign(targets.begin(), targets.end());
    rows_ = batch * len;
    // Sized here, on the calling thread: activation_bytes() reads the size while the stream may still run.
    probs_.assign(static_cast<std::size_t>(rows_) * kVocab, 0.0);
  }
  void forward_unit(std::size_t /*unit*/, std::span<const zero3::BufferView> params, zero3::Stream& stream) override {
    const float* w = params[0].as<const float>();
    stream.launch_host([this, w] {
      double total = 0.0;
      for (int r = 0; r < rows_; ++r) {
        const float* row = w + tokens_[r] * kVocab;
        const float top = *std::max_element(row, row + kVocab);
        double z = 0.0;
        for (int j = 0; j < kVocab; ++j) z += std::exp(static_cast<double>(row[j] - top));
        for (int j = 0; j < kVocab; ++j) probs_[r * kVocab + j] = std::exp(static_cast<double>(row[j] - top)) / z;
        total -= std::log(probs_[r * kVocab + targets_[r]]);
      }
      loss_ = rows_ > 0 ? total / rows_ : 0.0;
    });
  }
  double loss(zero3::Stream& stream) override {
    stream.synchronize();
    return loss_;
  }
  void backward_unit(std::size_t /*unit*/, std::span<const zero3::BufferView> /*params*/,
                     std::span<const zero3::BufferView> grads, float seed_scale, zero3::Stream& stream) override {
    float* g = grads[0].as<float>();
    stream.launch_host([this, g, seed_scale] {
      const double scale = static_cast<double>(seed_scale) / rows_;
      for (int r = 0; r < rows_; ++r) {
        for (int j = 0; j < kVocab; ++j) {
          const double d = probs_[r * kVocab + j] - (j == targets_[r] ? 1.0 : 0.0);
          g[tokens_[r] * kVocab + j] += static_cast<float>(scale * d);
        }
      }
    });
  }
  std::size_t activation_bytes() const override { return probs_.size() * sizeof(double); }
  zero3::MemoryKind activation_memory() const override { return zero3::MemoryKind::pageable_host; }

 private:
  std::vector<zero3::UnitSpec> units_;
  std::vector<std::int32_t> tokens_, targets_;
  int rows_ = 0;
  std::vector<double> probs_;
  double loss_ = 0.0;
};

// Counts the hooks the loop calls.
struct Counter final : zero3::train::TrainObserver {
  int steps = 0, logs = 0, saves = 0, resumes = 0;
  void on_step(const zero3::train::StepEvent&) override { ++steps; }
  void on_log(const zero3::train::LogEvent&) override { ++logs; }
  void on_save(const zero3::ckpt::SaveReport& r) override { saves += r.ok ? 1 : 0; }
  void on_resume(const zero3::ckpt::LoadResult&) override { ++resumes; }
};

zero3::train::TrainSummary train(const zero3::config::Config& config,
                                 const std::shared_ptr<zero3::comm::Bootstrap>& bootstrap,
                                 const std::filesystem::path& dir, std::int64_t steps, bool resume, Counter& counter) {
  zero3::comm::World world;  // one process
  world.source = "consumer";
  BigramChain data(256);
  zero3::train::UnitTrainer unit_trainer(config, world, bootstrap,
                                         [](zero3::Device&) { return std::make_unique<BigramModel>(); });
  zero3::train::TrainerOptions options;
  options.steps = steps;
  options.log_interval = 50;
  options.save_dir = dir;
  if (resume) options.resume = dir;
  zero3::train::Trainer trainer(unit_trainer, data, options);
  auto shared = std::shared_ptr<Counter>(&counter, [](Counter*) {});
  trainer.add_observer(shared);
  trainer.add_observer(std::make_shared<zero3::train::EntropyFloorCheck>());
  return trainer.run();
}

}  // namespace

namespace consumer {

void check_train_loop(const std::shared_ptr<zero3::comm::Bootstrap>& bootstrap) {
  const char* text = R"({
    "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.05, "weight_decay": 0}},
    "zero_optimization": {"stage": 3}, "zero3": {"device": "host", "seed": 3}
  })";
  zero3::config::ParseOptions opts;
  opts.world_size = 1;
  opts.world_size_source = "consumer";
  const zero3::config::Config config = zero3::config::load_config_text_or_throw(text, opts);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("zero3-consumer-" + std::to_string(static_cast<long long>(::getpid())));
  std::filesystem::remove_all(dir);

  Counter first;
  const zero3::train::TrainSummary a = train(config, bootstrap, dir, 150, false, first);
  expect(first.steps == 150 && first.logs == 3 && first.saves == 1, "first run: 150 steps, 3 log lines, 1 save");
  Counter second;
  const zero3::train::TrainSummary b = train(config, bootstrap, dir, 300, true, second);
  expect(second.resumes == 1 && b.start_step == 150 && second.steps == 150, "second run resumes at step 150");
  const double floor = *b.entropy_floor;
  expect(std::log(static_cast<double>(kVocab)) - floor > 0.5, "the floor is well below the untrained loss");
  expect(b.heldout_loss - floor < 0.1, "held-out loss " + std::to_string(b.heldout_loss) + " within 0.1 of the floor " +
                                           std::to_string(floor) +
                                           " (after 150 steps: " + std::to_string(a.heldout_loss) + ")");
  std::printf("consumer: bigram trained by zero3::train::Trainer: held-out %.4f, floor %.4f (%.4f at the resume)\n",
              b.heldout_loss, floor, a.heldout_loss);
  std::filesystem::remove_all(dir);
}

}  // namespace consumer
