// The model a config's "zero3.model" block names, built for the engine's device: the GPT on the host
// (OpenBLAS) or on CUDA (cuBLAS + kernels), the Llama-family decoder and the MLP on the host. Each model type
// has one registry row (model_factory.cpp) that checks, counts and builds it; its spelling and keys are the
// config's (zero3/config/model_types.hpp). Library zero3_model_factory (links the CUDA GPT's library, a stub
// without nvcc); a trainer that brings its own UnitModel does not need it.
#pragma once

#include <cstdint>
#include <memory>

#include "zero3/config/config.hpp"
#include "zero3/device/device.hpp"
#include "zero3/models/llama.hpp"
#include "zero3/models/unit_model.hpp"

namespace zero3::models {

// Throws ConfigError naming the zero3.model field for a model that cannot be built, or for a model and
// device with no implementation (the MLP on CUDA).
std::unique_ptr<UnitModel> make_train_model(const config::ModelSettings& model, Device& device);
// The Llama shape a "type": "llama" block describes (seq_len as given).
LlamaConfig llama_config(const config::ModelSettings& model);
// Validates the block without building anything (ConfigError naming the field).
void validate_train_model(const config::ModelSettings& model);
// Elements of all params.
std::size_t train_model_params(const config::ModelSettings& model);
// Tokens of each window (of seq_len inputs) the model predicts: the GPT and Llama every position, the MLP the
// last.
std::int64_t predictions_per_window(const config::ModelSettings& model);

}  // namespace zero3::models
