// The model types "zero3.model.type" names, one row each: the spelling, and which of the block's keys the type
// takes. The parser, the resolved-config writer and the key table read this one table; what builds each type
// lives with the models (zero3/models/model_factory.hpp).
#pragma once

#include <span>
#include <string_view>

#include "zero3/config/config.hpp"

namespace zero3::config {

struct ModelTypeSpec {
  ModelType type;
  std::string_view name;     // "gpt", as written in the config
  bool sequence_model;       // heads and seq_len are required (else 1 and 1)
  bool heads_divide_hidden;  // hidden_size % heads == 0 is checked while parsing
  bool decoder_options;      // takes hf_config and the Llama keys (kv_heads, head_dim, rope_theta, ...)
};

std::span<const ModelTypeSpec> model_types();
// nullptr for a name no row has.
const ModelTypeSpec* find_model_type(std::string_view name);
const ModelTypeSpec& model_type_spec(ModelType type);

}  // namespace zero3::config
