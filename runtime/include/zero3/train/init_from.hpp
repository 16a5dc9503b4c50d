// Starting a model from pretrained weights (zero3.model.init_from): every param of the units takes its
// initial values from the tensor of the same name in a safetensors checkpoint (one file, or a directory with
// model.safetensors or a sharded model.safetensors.index.json), converted to float from F32, BF16 or F16.
// The engine asks each rank only for the elements it keeps (ParamInit::custom), so a rank reads only its
// slices of the files, with ranged reads in bounded chunks: host memory stays a small multiple of the
// rank's shard, whatever the checkpoint's size.
//
//   std::vector<zero3::UnitSpec> units = model.units();
//   zero3::train::init_from_checkpoint(units, "Llama-3.2-1B/");   // before engine.add_unit(...)
//
// Hugging Face's tied checkpoints hold no lm_head.weight: an untied model's then starts as a copy of
// model.embed_tokens.weight. A tied model (no lm_head.weight param) skips a stored lm_head.weight, as
// transformers does. Rotary inv_freq buffers some checkpoints carry are skipped.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "zero3/units/unit_spec.hpp"

namespace zero3::train {

// Replaces every param's init. ConfigError naming the checkpoint's file and the tensor when a param has no
// tensor, a tensor's shape disagrees with its param's, or a tensor matches no param; the checkpoint's own
// errors (a malformed file) are CheckpointErrors naming the file and the tensor. Returns one line saying
// what was read ("init_from DIR: 201 tensors, 1.10 GiB (BF16)").
std::string init_from_checkpoint(std::vector<UnitSpec>& units, const std::filesystem::path& path);

}  // namespace zero3::train
