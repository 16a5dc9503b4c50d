// A checkpoint of a Llama-family model as a Hugging Face model directory, the one that
// transformers.AutoModelForCausalLM.from_pretrained(dir) loads: the weights as safetensors under the params'
// own names (the Llama's units name them as transformers does) and a config.json made from the checkpoint's
// zero3.model block: LlamaConfig, or Qwen2Config for q/k/v biases without an o_proj bias.
//
//   const zero3::ckpt::CheckpointReader reader("run/ckpt");  // a checkpoint, or a root through its `latest`
//   const auto files = zero3::ckpt::export_hf(reader, "run/hf", zero3::DType::bf16, 5'000'000'000);
//   // run/hf/model.safetensors (or model-0000i-of-0000N.safetensors + model.safetensors.index.json), then
//   // run/hf/config.json, last in `files`
//
// The weights stream through export_safetensors_shards (checkpoint.hpp): memory stays bounded by the
// checkpoint's chunk size, whatever the model's. Errors: ConfigError when the checkpoint's model is not one
// transformers' Llama or Qwen2 describes (nothing is written then), CheckpointError for a checkpoint file
// missing or corrupt or a shard that cannot be written, Error when config.json cannot be written.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/core/dtype.hpp"

namespace zero3::ckpt {

// transformers' config.json for the model a checkpoint's resolved config (Manifest::config) describes, its
// torch_dtype `dtype` (f32 or bf16). ConfigError for a model whose "type" is not "llama", or for an o_proj
// bias without q/k/v biases (neither a Llama nor a Qwen2).
nlohmann::ordered_json hf_config_json(const nlohmann::json& resolved_config, DType dtype);

// Writes the weights, converted to `dtype` (f32 or bf16), into the directory `out` (created if missing),
// sharded above `max_shard_bytes` as Hugging Face shards them, then config.json. Returns the files written,
// config.json last.
std::vector<std::filesystem::path> export_hf(const CheckpointReader& reader, const std::filesystem::path& out,
                                             DType dtype, std::uint64_t max_shard_bytes);

}  // namespace zero3::ckpt
