// The model the engine, offload and checkpoint benchmarks train, and its trainer through the engine: the
// library's host GPT (runtime/include/zero3/models/gpt.hpp) behind UnitModel, on synthetic Markov tokens
// (zero3.data's default source), driven by train::UnitTrainer, i.e. the engine's unit walk
// (runtime/include/zero3/train/unit_walk.hpp) as `zero3 train` runs it. Host device; the model computes on
// the engine's thread while the engine's streams gather ahead and reduce behind it. One thread drives a
// Zero3Trainer.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <memory>
#include <string>

#include "zero3/comm/communicator.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/engine.hpp"
#include "zero3/models/gpt.hpp"
#include "zero3/train/train_data.hpp"
#include "zero3/train/unit_trainer.hpp"

namespace zero3::tools {

// The GPT's size (MLP width 4 x d_model, a vocabulary of 64 tokens) and each rank's micro-batch of
// windows of seq_len tokens.
struct ModelShape {
  int d_model = 256;
  int layers = 4;
  int heads = 4;
  int seq_len = 8;
  int micro_batch = 4;
};
inline constexpr int kVocab = 64;
inline constexpr std::int64_t kSeed = 42;

// --d-model, --layers and --heads; with `with_batch`, --seq-len and --micro-batch too.
void add_model_shape_options(CLI::App& cmd, ModelShape& shape, bool with_batch);
models::GptConfig gpt_config(const ModelShape& shape);
// The benchmarks' "zero3" block: seed kSeed, the host device, the GPT of `shape` as zero3.model (the data,
// zero3.data, is the default synthetic Markov chain).
std::string zero3_block(const ModelShape& shape);

// This rank's windows of the config's data (zero3.model, zero3.data, the batch keys): micro-batch 0 of
// optimizer step `step` (the benchmarks accumulate no gradients).
class BenchData {
 public:
  BenchData(const config::Config& config, const comm::World& world);
  train::TokenBatch batch(std::int64_t step) { return windows_.micro_batch(step, 0, micro_); }

 private:
  train::TokenWindows windows_;
  std::int64_t micro_;
};

class Zero3Trainer {
 public:
  // `config`: the benchmark's config with zero3_block(shape). A null bootstrap lets the engine make the
  // MPI one.
  Zero3Trainer(const config::Config& config, const comm::World& world, const ModelShape& shape,
               std::shared_ptr<comm::Bootstrap> bootstrap = nullptr);

  Engine& engine() { return trainer_.engine(); }
  models::UnitModel& model() { return trainer_.model(); }

  // One optimizer step on this rank's batch of step `s`; returns this rank's loss.
  double step(std::int64_t s);

 private:
  train::UnitTrainer trainer_;
  BenchData data_;
};

}  // namespace zero3::tools
