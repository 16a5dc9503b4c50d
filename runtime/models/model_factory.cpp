#include "zero3/models/model_factory.hpp"

#include <fmt/format.h>

#include "zero3/core/error.hpp"
#include "zero3/models/gpt.hpp"
#include "zero3/models/gpt_cuda.hpp"
#include "zero3/models/llama.hpp"
#include "zero3/models/llama_cuda.hpp"
#include "zero3/models/mlp.hpp"

namespace zero3::models {
namespace {

GptConfig gpt_config(const config::ModelSettings& m) {
  GptConfig g;
  g.vocab_size = static_cast<int>(m.vocab_size);
  g.seq_len = static_cast<int>(m.seq_len);
  g.layers = static_cast<int>(m.layers);
  g.hidden = static_cast<int>(m.hidden_size);
  g.heads = static_cast<int>(m.heads);
  return g;
}

MlpConfig mlp_config(const config::ModelSettings& m) {
  MlpConfig c;
  c.vocab_size = static_cast<int>(m.vocab_size);
  c.context = static_cast<int>(m.seq_len);
  c.layers = static_cast<int>(m.layers);
  c.hidden = static_cast<int>(m.hidden_size);
  return c;
}

}  // namespace

LlamaConfig llama_config(const config::ModelSettings& m) {
  LlamaConfig c;
  c.vocab_size = static_cast<int>(m.vocab_size);
  c.seq_len = static_cast<int>(m.seq_len);
  c.layers = static_cast<int>(m.layers);
  c.hidden = static_cast<int>(m.hidden_size);
  c.heads = static_cast<int>(m.heads);
  c.kv_heads = static_cast<int>(m.kv_heads);
  c.head_dim = static_cast<int>(m.head_dim);
  c.intermediate = static_cast<int>(m.intermediate_size);
  c.rope_theta = m.rope_theta;
  c.rms_norm_eps = m.rms_norm_eps;
  c.qkv_bias = m.qkv_bias;
  c.o_bias = m.o_bias;
  c.tie_word_embeddings = m.tie_word_embeddings;
  return c;
}

void validate_train_model(const config::ModelSettings& model) {
  switch (model.type) {
    case config::ModelType::mlp:
      return validate(mlp_config(model));
    case config::ModelType::llama:
      return validate(llama_config(model));
    case config::ModelType::gpt:
      return validate(gpt_config(model));
  }
}

std::size_t train_model_params(const config::ModelSettings& model) {
  switch (model.type) {
    case config::ModelType::mlp:
      return mlp_num_params(mlp_config(model));
    case config::ModelType::llama:
      return llama_num_params(llama_config(model));
    case config::ModelType::gpt:
      break;
  }
  return gpt_num_params(gpt_config(model));
}

std::int64_t predictions_per_window(const config::ModelSettings& model) {
  return model.type == config::ModelType::mlp ? 1 : model.seq_len;
}

std::unique_ptr<UnitModel> make_train_model(const config::ModelSettings& model, Device& device) {
  validate_train_model(model);
  if (model.type == config::ModelType::mlp) {
    if (device.kind() != DeviceKind::host) {
      throw ConfigError(
          "zero3.model.type: the MLP is computed on the host only; use \"zero3\": {\"device\": \"host\"} or the "
          "\"gpt\" model");
    }
    return make_host_mlp(mlp_config(model));
  }
  if (model.type == config::ModelType::llama) {
    if (device.kind() == DeviceKind::host) return make_host_llama(llama_config(model));
    return make_cuda_llama(llama_config(model), device);
  }
  if (device.kind() == DeviceKind::host) return make_host_gpt(gpt_config(model));
  return make_cuda_gpt(gpt_config(model), device);
}

}  // namespace zero3::models
