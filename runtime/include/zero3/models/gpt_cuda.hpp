// The GPT of gpt.hpp computed on a CUDA device: the same units, params, architecture and loss as the host
// GptModel, behind the UnitModel interface. Matrix products go to cuBLAS (A and B in the params' dtype,
// fp32 accumulate and output), everything else to the kernels of runtime/models/cuda; activations are fp32.
// The model owns its activations and scratch, allocated with cudaMalloc (not Device::allocate: the trainer
// accounts activation_bytes() itself, and may destroy the Device before the model); never params or grads.
// One host thread drives a model; all its work of a pass is enqueued on the stream given to its calls.
#pragma once

#include <memory>

#include "zero3/device/device.hpp"
#include "zero3/models/gpt.hpp"
#include "zero3/models/unit_model.hpp"

namespace zero3::models {

// A CUDA GPT for `config` on `device` (a cuda device). Throws ConfigError for a bad config, for a device
// of another kind, and in a build without CUDA. Blocking: creates the cuBLAS handle; activations are
// allocated by the first pass (and grown, never shrunk, by a larger one).
//
// Calls (UnitModel): forward_unit/backward_unit enqueue their work on `stream` and return without waiting;
// loss() waits for the head's forward. Every call of a pass must use the same stream (or the caller must
// order the streams): the model reuses its buffers in call order. Params and grads must be device memory
// of one dtype per unit (f32, bf16 or f16); grads are added into (+=), rounded once to their dtype.
std::unique_ptr<UnitModel> make_cuda_gpt(const GptConfig& config, Device& device);

// True when this build contains the CUDA GPT (it still needs a CUDA device to run).
bool cuda_gpt_available();

}  // namespace zero3::models
