// `zero3 ckpt export DIR --format hf --out OUT`: a checkpoint of a Llama-family model as a Hugging Face
// model directory that transformers.AutoModelForCausalLM.from_pretrained(OUT) loads: model.safetensors
// (sharded with model.safetensors.index.json above --max-shard-size) under the params' own names, which are
// transformers', and a config.json made from the checkpoint's zero3.model block.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "zero3/ckpt/checkpoint.hpp"

namespace zero3::tools {

// transformers' config.json for the model a checkpoint's resolved config describes: LlamaConfig, or
// Qwen2Config for q/k/v biases without an o_proj bias. ConfigError for another model type, or biases
// neither describes.
nlohmann::ordered_json hf_config_json(const nlohmann::json& resolved_config, DType dtype);

// "5GB", "500MB", "2GiB", "1000000" -> bytes (decimal units as transformers' max_shard_size, binary with
// "i"). ConfigError naming the text when it is not a size.
std::uint64_t parse_size(const std::string& text);

// Writes the weights and config.json into `out`; returns the files written.
std::vector<std::filesystem::path> export_hf(const ckpt::CheckpointReader& reader, const std::filesystem::path& out,
                                             DType dtype, std::uint64_t max_shard_bytes);

}  // namespace zero3::tools
