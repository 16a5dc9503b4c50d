#include "bench_trainer.hpp"

#include <fmt/format.h>

#include <utility>

#include "bench_common.hpp"
#include "zero3/models/gpt.hpp"

namespace zero3::tools {

void add_model_shape_options(CLI::App& cmd, ModelShape& shape, bool with_batch) {
  bench::add_count_option(cmd, "--d-model", shape.d_model, "Model width (the MLP's is 4 x d_model)");
  bench::add_count_option(cmd, "--layers", shape.layers, "Transformer blocks");
  bench::add_count_option(cmd, "--heads", shape.heads, "Attention heads (d_model must be a multiple)");
  if (!with_batch) return;
  bench::add_count_option(cmd, "--seq-len", shape.seq_len, "Tokens per window");
  bench::add_count_option(cmd, "--micro-batch", shape.micro_batch, "Windows per step per rank");
}

models::GptConfig gpt_config(const ModelShape& shape) {
  models::GptConfig g;
  g.vocab_size = kVocab;
  g.seq_len = shape.seq_len;
  g.layers = shape.layers;
  g.hidden = shape.d_model;
  g.heads = shape.heads;
  return g;
}

std::string zero3_block(const ModelShape& shape) {
  return fmt::format(
      R"({{"seed": {}, "device": "host", "model": {{"type": "gpt", "layers": {}, "hidden_size": {}, "heads": {},
          "vocab_size": {}, "seq_len": {}}}}})",
      kSeed, shape.layers, shape.d_model, shape.heads, kVocab, shape.seq_len);
}

BenchData::BenchData(const config::Config& config, const comm::World& world)
    : windows_(config, world.rank, world.size,
               {.context = config.zero3.model->seq_len, .predictions_per_window = config.zero3.model->seq_len}),
      micro_(config.batch.train_micro_batch_size_per_gpu) {}

Zero3Trainer::Zero3Trainer(const config::Config& config, const comm::World& world, const ModelShape& shape,
                           std::shared_ptr<comm::Bootstrap> bootstrap)
    : trainer_(config, world, std::move(bootstrap),
               [&shape](Device& /*device*/) { return models::make_host_gpt(gpt_config(shape)); }),
      data_(config, world) {}

double Zero3Trainer::step(std::int64_t s) {
  const train::TokenBatch b = data_.batch(s);
  const double loss = trainer_.micro_batch(b.tokens, b.targets, b.batch, b.len);
  trainer_.step();
  engine().compute_stream().synchronize();
  return loss;
}

}  // namespace zero3::tools
