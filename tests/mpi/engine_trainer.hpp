// The float test model (tests/model) trained through the engine, for the MPI equivalence tests: the job's
// world and bootstrap, the job's config (trainer_config, a ConfigText of tests/support/engine_fixtures.hpp),
// and EngineTrainer, which drives the model's forward and backward through the engine's unit walk
// (train::EngineUnits, walk_forward, walk_backward) with explicit staging of params and grads
// (tests/support/device_staging.hpp), so the same path runs on the host device and on CUDA.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "device_staging.hpp"
#include "engine_fixtures.hpp"
#include "model.hpp"
#include "mpi_test_env.hpp"
#include "zero3/engine/engine.hpp"
#include "zero3/train/unit_walk.hpp"

namespace zero3::test::engine_trainer {

using model::Arch;

constexpr std::uint64_t kDataSeed = 2024;

inline test::MpiTestEnv& env() {
  return test::mpi_env();
}
inline int world_size() {
  return env().world.size;
}
inline int world_rank() {
  return env().world.rank;
}

inline double mean_over_ranks(double v) {
  std::vector<std::byte> mine(sizeof v);
  std::memcpy(mine.data(), &v, sizeof v);
  const std::vector<std::byte> all = env().bootstrap->all_gather(mine);
  double sum = 0.0;
  for (std::size_t off = 0; off < all.size(); off += sizeof v) {
    double x = 0.0;
    std::memcpy(&x, all.data() + off, sizeof x);
    sum += x;
  }
  return sum / world_size();
}

inline double rel(double a, double b) {
  if (a == b) return 0.0;
  return std::fabs(a - b) / std::max(std::fabs(b), 1e-300);
}

inline model::ModelConfig transformer(int layers = 2) {
  model::ModelConfig m;
  m.arch = Arch::transformer;
  m.d_in = 8;
  m.d_model = 16;
  m.d_ff = 32;
  m.layers = layers;
  m.seq_len = 8;
  m.d_out = 5;
  return m;
}

inline model::ModelConfig mlp() {
  model::ModelConfig m;
  m.arch = Arch::mlp;
  m.d_in = 8;
  m.d_model = 16;
  m.layers = 2;
  m.d_out = 4;
  m.activation = model::Activation::tanh;
  return m;
}

using test::ConfigText;
using test::EngineOptions;
using test::make_engine;

// The training job of these tests: 12 samples per optimizer step (divisible by 1, 2, 3 and 4 ranks), AdamW,
// and units up to 200 elements (the transformer's input projection and head) persistent, blocks sharded.
inline ConfigText trainer_config() {
  ConfigText text;
  text.train_batch = 12;
  text.optimizer = R"({"type": "AdamW", "params": {"lr": 2e-3, "weight_decay": 0.05}})";
  text.zero = R"("stage3_param_persistence_threshold": 200)";
  return text;
}

// The zero3 side: the float model driven through the engine, computed on the host over the engine's device
// buffers through explicit staging (tests/support/device_staging.hpp): each gathered param is copied to the
// host on the compute stream (after the gather the stream waits for), and each gradient is copied back into
// the engine's buffer on the compute stream before its GradScope closes. The same path runs on the host
// device and on CUDA.
class EngineTrainer {
 public:
  EngineTrainer(const config::Config& config, const model::ModelConfig& model, std::vector<UnitSpec> units)
      : model_(model), units_(std::move(units)), net_(model), engine_(config, env().world, resources()) {
    for (const UnitSpec& u : units_) engine_.add_unit(u);
    engine_.finalize();
    pbuf_.resize(units_.size());
    gbuf_.resize(units_.size());
    for (std::size_t u = 0; u < units_.size(); ++u) {
      for (const ParamSpec& p : units_[u].params) {
        pbuf_[u].emplace_back(model::numel(p));
        gbuf_[u].emplace_back(model::numel(p));
      }
    }
  }

  Engine& engine() { return engine_; }

  // Forward and backward of micro-step `micro` of optimizer step `step`; this rank's micro-batch loss.
  // `inject`: the name of a param whose first gradient element becomes +Inf on the last rank.
  double forward_backward(std::int64_t step, int micro, const std::string& inject = {}) {
    const int w = world_size();
    const int r = world_rank();
    const auto mb = static_cast<int>(engine_.config().batch.train_micro_batch_size_per_gpu);
    const model::Batch<float> batch =
        model::make_batch<float>(model_, kDataSeed, step, model::micro_batch_ids(r, w, micro, mb));
    net_.set_batch(batch);
    train::EngineUnits units(engine_, units_);
    train::walk_forward(units, [&](const train::UnitViews& u) { net_.forward(u.unit, load_params(u)); });
    const auto loss = static_cast<double>(net_.loss());
    const auto seed = static_cast<float>(engine_.loss_multiplier());
    const std::string poison = r == w - 1 ? inject : std::string();
    train::walk_backward(units, [&](const train::UnitViews& u) { backward_unit(u, seed, poison); });
    engine_.compute_stream().synchronize();
    return loss;
  }

  // One optimizer step (all micro-steps); `global_loss`: the mean loss over the global batch.
  StepResult train_step(std::int64_t step, double* global_loss = nullptr) {
    const auto gas = static_cast<int>(engine_.config().batch.gradient_accumulation_steps);
    double sum = 0.0;
    StepResult r;
    for (int m = 0; m < gas; ++m) {
      sum += forward_backward(step, m);
      r = engine_.step();
      CHECK(r.boundary == (m == gas - 1));
    }
    const double mean = mean_over_ranks(sum / gas);
    if (global_loss != nullptr) *global_loss = mean;
    return r;
  }

 private:
  static EngineResources resources() {
    EngineResources res;
    res.bootstrap = env().bootstrap;
    return res;
  }

  // The unit's params, staged to the host as floats (into pbuf_).
  std::vector<const float*> load_params(const train::UnitViews& u) {
    std::vector<const float*> ptrs;
    for (std::size_t k = 0; k < u.params.size(); ++k) {
      pbuf_[u.unit][k] = test::download_floats(engine_.device(), engine_.compute_stream(), u.params[k]);
      ptrs.push_back(pbuf_[u.unit][k].data());
    }
    return ptrs;
  }

  // Backward of the unit on the host into gbuf_ (zero-filled first, as the engine's grad buffers are), then
  // each trainable param's gradient staged into the engine's grad buffer.
  void backward_unit(const train::UnitViews& u, float seed, const std::string& poison) {
    const std::vector<const float*> ptrs = load_params(u);
    std::vector<float*> gptrs;
    for (std::vector<float>& b : gbuf_[u.unit]) {
      std::fill(b.begin(), b.end(), 0.0f);
      gptrs.push_back(b.data());
    }
    net_.backward(u.unit, ptrs, gptrs, seed);
    for (std::size_t k = 0; k < units_[u.unit].params.size(); ++k) {
      const ParamSpec& p = units_[u.unit].params[k];
      if (!p.trainable) continue;  // frozen: no gradient
      std::vector<float>& b = gbuf_[u.unit][k];
      if (!poison.empty() && p.name == poison && !b.empty()) b[0] = std::numeric_limits<float>::infinity();
      test::upload_floats(engine_.device(), engine_.compute_stream(), u.grads[k], b);
    }
  }

  // Declared before the engine, so it outlives the engine's destructor (which waits for its streams).
  model::ModelConfig model_;
  std::vector<UnitSpec> units_;
  model::Network<float> net_;
  std::vector<std::vector<std::vector<float>>> pbuf_, gbuf_;  // params staged as float; grads before storing
  Engine engine_;
};

}  // namespace zero3::test::engine_trainer
