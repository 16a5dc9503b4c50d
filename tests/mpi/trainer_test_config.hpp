// The small MLP job the training-loop tests run (host device, synthetic Markov data, ZeRO-3 with nothing
// persistent), with what the tests vary: steps, batch, accumulation, seed and extra "zero3" keys.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "zero3/config/parse.hpp"

namespace zero3::test {

struct MlpJob {
  std::int64_t steps = 1;
  std::int64_t train_batch_size = 48;
  std::int64_t gradient_accumulation_steps = 2;
  std::int64_t seed = 5;
  std::string zero3_extra{};  // more keys of the "zero3" block, e.g. "\"spike\": {...}"
};

inline config::Config mlp_job_config(const MlpJob& job, int world_size) {
  const std::string text = fmt::format(
      R"({{"train_batch_size": {}, "gradient_accumulation_steps": {}, "gradient_clipping": 1.0,
          "optimizer": {{"type": "AdamW", "params": {{"lr": 0.01, "weight_decay": 0.01}}}},
          "zero_optimization": {{"stage": 3, "stage3_param_persistence_threshold": 0}},
          "zero3": {{"seed": {}, "device": "host",
                    "model": {{"type": "mlp", "layers": 2, "hidden_size": 32, "vocab_size": 16, "seq_len": 2}},
                    "data": {{"source": "synthetic:markov", "markov_order": 2}}, "run": {{"steps": {}}}{}}}}})",
      job.train_batch_size, job.gradient_accumulation_steps, job.seed, job.steps,
      job.zero3_extra.empty() ? "" : ", " + job.zero3_extra);
  config::ParseOptions o;
  o.world_size = world_size;
  o.world_size_source = "test";
  return config::load_config_text_or_throw(text, o);
}

}  // namespace zero3::test
