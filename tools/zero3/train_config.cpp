#include "train_config.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>

#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/json_text.hpp"
#include "zero3/models/model_factory.hpp"
#include "zero3/train/train_data.hpp"

namespace zero3::tools {
namespace {

using Json = nlohmann::json;

// The config file with the overrides written into its "zero3" block.
std::string patched_config(const TrainConfigOptions& o) {
  std::ifstream in(o.config);
  if (!in)
    throw ConfigError(fmt::format("{}: cannot read the config: {}", o.config, std::generic_category().message(errno)));
  std::stringstream text;
  text << in.rdbuf();
  if (o.overrides.empty() && !o.steps) return text.str();
  Json j;
  try {
    j = Json::parse(text.str());
  } catch (const Json::exception& e) {
    throw ConfigError(fmt::format("{}: not valid JSON: {}", o.config, e.what()));
  }
  if (!j.is_object()) throw ConfigError(fmt::format("{}: the config must be a JSON object", o.config));
  Json& z = j["zero3"];
  for (const auto& [path, value] : o.overrides) {
    Json* at = &z;
    std::string_view rest = path;
    for (std::size_t dot = rest.find('.'); dot != std::string_view::npos; dot = rest.find('.')) {
      at = &(*at)[std::string(rest.substr(0, dot))];
      rest.remove_prefix(dot + 1);
    }
    // A config is JSON, and JSON text is UTF-8: a value that is not (a file name in another encoding) is
    // named here, not left to the JSON library's error when the patched config is written out.
    if (!valid_utf8(value)) {
      throw ConfigError(
          fmt::format("--{}: the value is not valid UTF-8 (\"{}\"); a config's strings, file names "
                      "included, must be UTF-8: rename the file or link to it under a UTF-8 name",
                      path, utf8_or_replacement(value)));
    }
    Json v;
    try {
      v = Json::parse(value);
    } catch (const Json::exception&) {
      v = value;  // a bare string, e.g. --data.source tokens:/data/x.bin
    }
    (*at)[std::string(rest)] = v;
  }
  if (o.steps) z["run"]["steps"] = *o.steps;
  return j.dump();
}

}  // namespace

void add_train_config_options(CLI::App& cmd, TrainConfigOptions& o) {
  cmd.add_option("--config", o.config, "DeepSpeed JSON config with a \"zero3\" block (model, data, run)")->required();
  cmd.add_option("--steps", o.steps, "Optimizer steps of the run (zero3.run.steps)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  cmd.add_option("--heldout-samples", o.heldout_samples,
                 "Held-out windows measured at each log line (default: 4096 predicted tokens' worth)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 30));
  for (const char* key :
       {"model.type", "model.layers", "model.hidden_size", "model.heads", "model.vocab_size", "model.seq_len",
        "model.activation_checkpointing", "data.source", "data.markov_order", "seed", "device"}) {
    cmd.add_option_function<std::string>(
        fmt::format("--{}", key), [&o, k = std::string(key)](const std::string& v) { o.overrides[k] = v; },
        fmt::format("Override zero3.{}", key));
  }
}

config::Config load_train_config(const TrainConfigOptions& o, int world_size, const std::string& world_size_source) {
  config::ParseOptions po;
  po.world_size = world_size;
  po.world_size_source = world_size_source;
  po.source_name = o.config;
  config::Config cfg = config::load_config_text_or_throw(patched_config(o), po);
  if (!cfg.zero3.model) {
    throw ConfigError(fmt::format("{}: zero3.model: zero3 train needs a model block (\"gpt\" or \"mlp\")", o.config));
  }
  if (!cfg.zero3.run) throw ConfigError(fmt::format("{}: zero3.run.steps (or --steps) is required", o.config));
  models::validate_train_model(*cfg.zero3.model);
  return cfg;
}

int heldout_batch_per_rank(const config::Config& cfg, const TrainConfigOptions& o, int world_size) {
  const config::ModelSettings& ms = *cfg.zero3.model;
  const train::TokenWindowsOptions options{.context = ms.seq_len,
                                           .predictions_per_window = models::predictions_per_window(ms),
                                           .heldout_windows = o.heldout_samples.value_or(0)};
  std::int64_t total = 0;
  if (cfg.zero3.data.source.starts_with("synthetic:")) {
    total = train::heldout_windows_for(options, std::numeric_limits<std::int64_t>::max());
  } else {
    total = train::TokenWindows(cfg, 0, world_size, options).heldout_windows();
  }
  return static_cast<int>((total + world_size - 1) / world_size);
}

}  // namespace zero3::tools
