// The config of a `zero3 train` job as `zero3 train` and `zero3 mem plan` read it: the file, with
// "--model.layers 4"-style overrides written into its "zero3" block before parsing (so "auto" values
// follow them), parsed for the job's world size, its model block validated.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "zero3/config/config.hpp"

namespace zero3::tools {

struct TrainConfigOptions {
  std::string config;
  std::optional<std::int64_t> steps;  // zero3.run.steps
  // "--model.layers 4" and the like: key path under "zero3" -> JSON value text.
  std::map<std::string, std::string> overrides;
  // Held-out windows per measurement; default: enough for 4096 predicted tokens (128 GPT windows of 32).
  std::optional<std::int64_t> heldout_samples;
};

// --config (required), --steps, --heldout-samples and the --model.* / --data.* / --seed / --device overrides.
void add_train_config_options(CLI::App& cmd, TrainConfigOptions& o);

// The job's config, parsed for `world_size` (from `world_size_source`): ConfigError naming what is missing
// or wrong (the model block, run.steps, a model field).
config::Config load_train_config(const TrainConfigOptions& o, int world_size, const std::string& world_size_source);

// Windows of the held-out pass of rank 0 (the largest share) for `world_size` ranks. Synthetic sources hold
// more held-out windows than any measurement takes; a token file is opened to count them.
int heldout_batch_per_rank(const config::Config& cfg, const TrainConfigOptions& o, int world_size);

}  // namespace zero3::tools
