// Where each param of a Llama-family unit sits among the views a model takes (llama_units() order), shared
// by the host model (llama.cpp) and the CUDA one (cuda/llama_cuda.cpp).
#pragma once

#include <cstddef>

namespace zero3::models {

// A layer unit: these, then the optional biases (q, k, v with qkv_bias; o with o_bias).
enum LlamaLayerParam : std::size_t {
  kNorm1,
  kQProj,
  kKProj,
  kVProj,
  kOProj,
  kNorm2,
  kGateProj,
  kUpProj,
  kDownProj,
  kFixedLayerParams,
};

// The head unit's two views: the final norm's weight, then the output matrix [vocab, hidden]
// (lm_head.weight, or the borrowed embedding when the embeddings are tied).
constexpr std::size_t kFinalNorm = 0;
constexpr std::size_t kOutput = 1;

}  // namespace zero3::models
