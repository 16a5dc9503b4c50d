// Causal attention on the device without a len x len matrix, in the layout of the host's
// (runtime/models/flash_attention.hpp): qkv [batch, len, 3 d] with q, k, v side by side (d = heads head_dim),
// att and datt [batch, len, d], lse [batch, heads, len]. One warp owns one row and walks its keys (forward,
// dQ) or its queries (dK, dV) in order with an online softmax, so every sum has one order: no atomics, the
// same bits on every run. fp32 throughout; head_dim at most kMaxHeadDim.
#pragma once

#include <cuda_runtime.h>

namespace zero3::models::gpu {

inline constexpr int kMaxHeadDim = 256;

// att = softmax(q k^T / sqrt(head_dim), keys <= query) v; lse the rows' log-sum-exp of the scaled scores.
void flash_attention_forward(cudaStream_t stream, const float* qkv, float* lse, float* att, int batch, int len,
                             int heads, int head_dim);

// dqkv (written, no accumulation) from datt, given the forward's qkv, att and lse; `delta` is scratch of
// batch heads len floats.
void flash_attention_backward(cudaStream_t stream, const float* qkv, const float* att, const float* lse,
                              const float* datt, float* dqkv, float* delta, int batch, int len, int heads,
                              int head_dim);

}  // namespace zero3::models::gpu
