// The test model (bench_model.hpp) trained through the engine's gather and grad scopes, for the benchmarks:
// forward and backward run as host functions on the engine's compute stream (host device), so the
// engine's streams, prefetch and reductions overlap them as they would a GPU's kernels. One thread drives
// a Zero3Trainer.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_model.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/engine/engine.hpp"

namespace zero3::tools {

inline constexpr std::uint64_t kDataSeed = 7;

// The transformer the engine, offload and checkpoint benchmarks train (d_ff = 4 x d_model, 64 input
// features and 64 classes per position) and the micro-batch of each rank.
struct ModelShape {
  int d_model = 256;
  int layers = 4;
  int seq_len = 8;
  int micro_batch = 4;
};

// --d-model and --layers; with `with_batch`, --seq-len and --micro-batch too.
inline void add_model_shape_options(CLI::App& cmd, ModelShape& shape, bool with_batch) {
  bench::add_count_option(cmd, "--d-model", shape.d_model, "Model width (d_ff = 4 x d_model)");
  bench::add_count_option(cmd, "--layers", shape.layers, "Transformer blocks");
  if (!with_batch) return;
  bench::add_count_option(cmd, "--seq-len", shape.seq_len, "Positions per sample");
  bench::add_count_option(cmd, "--micro-batch", shape.micro_batch, "Samples per step per rank");
}

inline model::ModelConfig transformer_config(const ModelShape& shape) {
  model::ModelConfig m;
  m.arch = model::Arch::transformer;
  m.d_in = 64;
  m.d_model = shape.d_model;
  m.d_ff = 4 * shape.d_model;
  m.layers = shape.layers;
  m.seq_len = shape.seq_len;
  m.d_out = 64;
  return m;
}

inline model::Batch<float> batch_for(const model::ModelConfig& mc, const comm::World& world, int micro_batch,
                                     std::int64_t step) {
  return model::make_batch<float>(mc, kDataSeed, step, model::micro_batch_ids(world.rank, world.size, 0, micro_batch));
}

class Zero3Trainer {
 public:
  Zero3Trainer(const config::Config& config, const comm::World& world, const model::ModelConfig& mc,
               const std::vector<UnitSpec>& units, std::shared_ptr<comm::Bootstrap> bootstrap = nullptr)
      : world_(world), mc_(mc), units_(units), net_(mc), engine_(config, world, resources(std::move(bootstrap))) {
    for (const UnitSpec& u : units_) engine_.add_unit(u);
    engine_.finalize();
  }

  Engine& engine() { return engine_; }
  static EngineResources resources(std::shared_ptr<comm::Bootstrap> bootstrap) {
    EngineResources r;
    r.bootstrap = std::move(bootstrap);
    return r;
  }

  // One optimizer step; returns this rank's loss.
  double step(std::int64_t s) {
    Stream& cs = engine_.compute_stream();
    auto batch = std::make_shared<const model::Batch<float>>(
        batch_for(mc_, world_, static_cast<int>(engine_.config().batch.train_micro_batch_size_per_gpu), s));
    cs.launch_host([this, batch] { net_.set_batch(*batch); });
    for (std::size_t u = 0; u < units_.size(); ++u) {
      Engine::GatherScope g = engine_.gather(units_[u].name);
      std::vector<const float*> params;
      for (const ParamSpec& p : units_[u].params) params.push_back(g.param(p.name).as<const float>());
      cs.launch_host([this, u, params] { net_.forward(u, params); });
    }
    cs.launch_host([this] { loss_ = static_cast<double>(net_.loss()); });
    const auto seed = static_cast<float>(engine_.loss_multiplier());
    for (std::size_t u = units_.size(); u-- > 0;) {
      Engine::GatherScope g = engine_.gather(units_[u].name);
      Engine::GradScope gr = engine_.grads(units_[u].name);
      std::vector<const float*> params;
      std::vector<float*> grads;
      for (const ParamSpec& p : units_[u].params) {
        params.push_back(g.param(p.name).as<const float>());
        grads.push_back(gr.grad(p.name).as<float>());
      }
      cs.launch_host([this, u, params, grads, seed] { net_.backward(u, params, grads, seed); });
    }
    engine_.step();
    cs.synchronize();
    return loss_;
  }

 private:
  comm::World world_;
  model::ModelConfig mc_;
  std::vector<UnitSpec> units_;
  model::Network<float> net_;  // used by compute-stream work: outlives the engine, which waits for it
  double loss_ = 0.0;
  Engine engine_;
};

}  // namespace zero3::tools
