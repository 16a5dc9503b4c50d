#include "zero3/models/model_factory.hpp"

#include <fmt/format.h>

#include "zero3/core/checked.hpp"
#include "zero3/core/error.hpp"
#include "zero3/models/gpt.hpp"
#include "zero3/models/gpt_cuda.hpp"
#include "zero3/models/llama.hpp"
#include "zero3/models/llama_cuda.hpp"
#include "zero3/models/mlp.hpp"

namespace zero3::models {
namespace {

// The config's int64 size as the model's int; the parser's rows already refuse what does not fit, so this
// holds for settings made in code.
int dim(std::int64_t v, std::string_view key) {
  return checked_narrow<int, ConfigError>(v, fmt::format("zero3.model.{}", key));
}

GptConfig gpt_config(const config::ModelSettings& m) {
  GptConfig g;
  g.vocab_size = dim(m.vocab_size, "vocab_size");
  g.seq_len = dim(m.seq_len, "seq_len");
  g.layers = dim(m.layers, "layers");
  g.hidden = dim(m.hidden_size, "hidden_size");
  g.heads = dim(m.heads, "heads");
  return g;
}

MlpConfig mlp_config(const config::ModelSettings& m) {
  MlpConfig c;
  c.vocab_size = dim(m.vocab_size, "vocab_size");
  c.context = dim(m.seq_len, "seq_len");
  c.layers = dim(m.layers, "layers");
  c.hidden = dim(m.hidden_size, "hidden_size");
  return c;
}

}  // namespace

LlamaConfig llama_config(const config::ModelSettings& m) {
  LlamaConfig c;
  c.vocab_size = dim(m.vocab_size, "vocab_size");
  c.seq_len = dim(m.seq_len, "seq_len");
  c.layers = dim(m.layers, "layers");
  c.hidden = dim(m.hidden_size, "hidden_size");
  c.heads = dim(m.heads, "heads");
  c.kv_heads = dim(m.kv_heads, "kv_heads");
  c.head_dim = dim(m.head_dim, "head_dim");
  c.intermediate = dim(m.intermediate_size, "intermediate_size");
  c.rope_theta = m.rope_theta;
  c.rms_norm_eps = m.rms_norm_eps;
  c.qkv_bias = m.qkv_bias;
  c.o_bias = m.o_bias;
  c.tie_word_embeddings = m.tie_word_embeddings;
  return c;
}

namespace {

// One row per model type: what checks, counts and builds it. The config's own table (config/model_types.hpp)
// gives the spelling and the keys a type takes; this one gives the code behind each type.
struct TrainModelEntry {
  config::ModelType type;
  void (*validate)(const config::ModelSettings&);
  std::size_t (*num_params)(const config::ModelSettings&);
  bool predicts_every_position;  // else only the window's last token (the MLP)
  std::unique_ptr<UnitModel> (*build)(const config::ModelSettings&, Device&);
};

std::unique_ptr<UnitModel> build_gpt(const config::ModelSettings& m, Device& device) {
  if (device.kind() == DeviceKind::host) return make_host_gpt(gpt_config(m));
  return make_cuda_gpt(gpt_config(m), device);
}

std::unique_ptr<UnitModel> build_llama(const config::ModelSettings& m, Device& device) {
  if (device.kind() == DeviceKind::host) return make_host_llama(llama_config(m));
  return make_cuda_llama(llama_config(m), device);
}

std::unique_ptr<UnitModel> build_mlp(const config::ModelSettings& m, Device& device) {
  if (device.kind() != DeviceKind::host) {
    throw ConfigError(
        "zero3.model.type: the MLP is computed on the host only; use \"zero3\": {\"device\": \"host\"} or the "
        "\"gpt\" model");
  }
  return make_host_mlp(mlp_config(m));
}

constinit const TrainModelEntry kTrainModels[] = {
    {config::ModelType::gpt, [](const config::ModelSettings& m) { validate(gpt_config(m)); },
     [](const config::ModelSettings& m) { return gpt_num_params(gpt_config(m)); }, true, build_gpt},
    {config::ModelType::mlp, [](const config::ModelSettings& m) { validate(mlp_config(m)); },
     [](const config::ModelSettings& m) { return mlp_num_params(mlp_config(m)); }, false, build_mlp},
    {config::ModelType::llama, [](const config::ModelSettings& m) { validate(llama_config(m)); },
     [](const config::ModelSettings& m) { return llama_num_params(llama_config(m)); }, true, build_llama},
};

const TrainModelEntry& entry(const config::ModelSettings& model) {
  for (const TrainModelEntry& e : kTrainModels) {
    if (e.type == model.type) return e;
  }
  throw ConfigError(fmt::format("zero3.model.type: no model is registered for \"{}\"", to_string(model.type)));
}

}  // namespace

void validate_train_model(const config::ModelSettings& model) {
  entry(model).validate(model);
}

std::size_t train_model_params(const config::ModelSettings& model) {
  return entry(model).num_params(model);
}

std::int64_t predictions_per_window(const config::ModelSettings& model) {
  return entry(model).predicts_every_position ? model.seq_len : 1;
}

std::unique_ptr<UnitModel> make_train_model(const config::ModelSettings& model, Device& device) {
  const TrainModelEntry& e = entry(model);
  e.validate(model);
  std::unique_ptr<UnitModel> built = e.build(model, device);
  if (!built->can_recompute(model.activation_checkpointing)) {
    throw ConfigError(fmt::format("zero3.model.activation_checkpointing: \"{}\" is not implemented for the {}",
                                  to_string(model.activation_checkpointing), built->describe()));
  }
  built->set_recompute(model.activation_checkpointing);
  return built;
}

}  // namespace zero3::models
