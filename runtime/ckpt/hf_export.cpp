// Hugging Face export (zero3/ckpt/hf_export.hpp): transformers' config.json beside the safetensors shards.
#include "zero3/ckpt/hf_export.hpp"

#include <fmt/format.h>

#include <fstream>

#include "zero3/core/error.hpp"

namespace zero3::ckpt {

nlohmann::ordered_json hf_config_json(const nlohmann::json& resolved_config, DType dtype) {
  const nlohmann::json* model = nullptr;
  if (resolved_config.contains("zero3") && resolved_config["zero3"].contains("model")) {
    model = &resolved_config["zero3"]["model"];
  }
  if (model == nullptr || model->value("type", "") != "llama") {
    throw ConfigError(
        fmt::format("the checkpoint's model is \"{}\"; Hugging Face export is for \"type\": \"llama\" models",
                    model == nullptr ? "unknown" : model->value("type", "unknown")));
  }
  const nlohmann::json& m = *model;
  const bool qkv_bias = m.value("qkv_bias", false);
  const bool o_bias = m.value("o_bias", false);
  if (o_bias && !qkv_bias) {
    throw ConfigError("an o_proj bias without q/k/v biases is neither a Llama nor a Qwen2 model");
  }
  const bool qwen2 = qkv_bias && !o_bias;
  const std::int64_t heads = m.at("heads").get<std::int64_t>();
  const std::int64_t kv = m.value("kv_heads", std::int64_t{0});
  const std::int64_t head_dim = m.value("head_dim", std::int64_t{0});
  nlohmann::ordered_json c;
  c["architectures"] = {qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM"};
  c["model_type"] = qwen2 ? "qwen2" : "llama";
  c["vocab_size"] = m.at("vocab_size");
  c["hidden_size"] = m.at("hidden_size");
  c["intermediate_size"] = m.at("intermediate_size");
  c["num_hidden_layers"] = m.at("layers");
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = kv == 0 ? heads : kv;
  c["head_dim"] = head_dim == 0 ? m.at("hidden_size").get<std::int64_t>() / heads : head_dim;
  c["max_position_embeddings"] = m.at("seq_len");
  c["rms_norm_eps"] = m.value("rms_norm_eps", 1e-6);
  c["rope_theta"] = m.value("rope_theta", 10000.0);
  c["hidden_act"] = "silu";
  if (!qwen2) {
    c["attention_bias"] = o_bias;
    c["mlp_bias"] = false;
  }
  c["tie_word_embeddings"] = m.value("tie_word_embeddings", false);
  c["initializer_range"] = 0.02;
  c["torch_dtype"] = dtype == DType::bf16 ? "bfloat16" : "float32";
  return c;
}

std::vector<std::filesystem::path> export_hf(const CheckpointReader& reader, const std::filesystem::path& out,
                                             DType dtype, std::uint64_t max_shard_bytes) {
  const nlohmann::ordered_json config = hf_config_json(reader.manifest().config, dtype);
  std::vector<std::filesystem::path> files = export_safetensors_shards(reader, out, dtype, max_shard_bytes);
  const std::filesystem::path path = out / "config.json";
  std::ofstream f(path);
  f << config.dump(2) << '\n';
  f.close();
  if (!f) throw Error(fmt::format("{}: writing failed", path.string()));
  files.push_back(path);
  return files;
}

}  // namespace zero3::ckpt
