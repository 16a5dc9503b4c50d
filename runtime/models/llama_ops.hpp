// Host kernels the Llama-family decoder adds to gpt_ops: RMSNorm, rotary position embeddings (the
// rotate-half pairing Hugging Face's Llama uses), the SwiGLU gate, and the grouped-query layout change
// between separate q, k, v projections (kv_heads <= heads) and flash_attention's, which takes q, k and v
// for every head side by side. Row-major arrays, float and double; gradients of params accumulate (+=).
// Every loop runs on the host pool over chunks fixed by the sizes alone (host_parallel.hpp).
#pragma once

#include <cstddef>
#include <vector>

namespace zero3::models::ops {

using Index = std::size_t;

// y = x / sqrt(mean(x^2) + eps) * w per row of width d; inv_rms[i] = 1 / sqrt(mean(x_i^2) + eps).
template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* inv_rms, Index rows, Index d, double eps);
// dx += dL/dx; dw += sum over rows of dy * x * inv_rms.
template <typename T>
void rmsnorm_backward(const T* x, const T* w, const T* inv_rms, const T* dy, T* dx, T* dw, Index rows, Index d);

// The rotary table of positions [0, len) for heads of width head_dim: cos and sin [len, head_dim / 2] of
// position * theta^(-2j / head_dim), with the frequencies and angles in float as Hugging Face's
// LlamaRotaryEmbedding computes them (so that fp32 logits agree with transformers'), cos/sin in double.
template <typename T>
void rope_table(Index len, Index head_dim, double theta, std::vector<T>& cos, std::vector<T>& sin);

// h = silu(gate) * up, elementwise over n.
template <typename T>
void swiglu_forward(const T* gate, const T* up, T* h, Index n);
// dgate = dh * up * silu'(gate), dup = dh * silu(gate); dgate may alias dh.
template <typename T>
void swiglu_backward(const T* gate, const T* up, const T* dh, T* dgate, T* dup, Index n);

// Grouped-query attention's inputs in flash_attention_forward's layout: qkv [rows, 3 heads head_dim]
// from q [rows, heads head_dim], k and v [rows, kv_heads head_dim]; query head h reads kv head
// h / (heads / kv_heads) (transformers' repeat_kv). q and k are rotated by position row % len.
template <typename T>
void gqa_pack(const T* q, const T* k, const T* v, T* qkv, const T* cos, const T* sin, Index rows, Index len,
              Index heads, Index kv_heads, Index head_dim);
// The transpose: dq, dk, dv from dqkv (dk, dv summed over each kv head's query heads, rotations undone).
// Writes dq, dk, dv (no accumulation).
template <typename T>
void gqa_unpack(const T* dqkv, T* dq, T* dk, T* dv, const T* cos, const T* sin, Index rows, Index len, Index heads,
                Index kv_heads, Index head_dim);

}  // namespace zero3::models::ops
