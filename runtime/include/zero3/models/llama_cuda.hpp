// The Llama-family decoder of llama.hpp computed on a CUDA device: the same units, params, architecture and
// loss as the host LlamaModel, behind the UnitModel interface. Matrix products go to cuBLAS (A and B in the
// params' dtype, fp32 accumulate and output), RMSNorm, rotary embeddings, the grouped-query layout, SwiGLU,
// the causal softmax and cross-entropy to the kernels of runtime/models/cuda; activations are fp32. The
// model owns its activations, scratch and rotary tables (cudaMalloc'd, as the CUDA GPT's), never params or
// grads. One host thread drives a model; all its work of a pass is enqueued on the stream given to its calls.
#pragma once

#include <memory>

#include "zero3/device/device.hpp"
#include "zero3/models/llama.hpp"
#include "zero3/models/unit_model.hpp"

namespace zero3::models {

// A CUDA Llama for `config` on `device` (a cuda device). Throws ConfigError for a bad config, for a device
// of another kind, and in a build without CUDA. Blocking: creates the cuBLAS handle; activations are
// allocated by the first pass (and grown, never shrunk, by a larger one).
//
// Calls (UnitModel): as make_cuda_gpt's. The head unit takes two params positionally, the final norm's
// weight and the output matrix [vocab, hidden]; gradients are added into whatever buffer the caller passes
// for the latter (+=), so it may be the embedding's. Params and grads must be device memory of one dtype per
// unit (f32, bf16 or f16); grads are added into, rounded once per unit to their dtype.
std::unique_ptr<UnitModel> make_cuda_llama(const LlamaConfig& config, Device& device);

// True when this build contains the CUDA Llama (it still needs a CUDA device to run).
bool cuda_llama_available();

}  // namespace zero3::models
