// Causal multi-head self-attention that never holds a len x len matrix: the FlashAttention algorithm
// (Dao et al., 2022; FlashAttention-2's loop order) on the host. Forward walks the keys in tiles with an
// online softmax and keeps only each row's output and log-sum-exp; backward recomputes each tile's
// probabilities from the log-sum-exp. Memory per (sequence, head) is O(len), scratch per thread O(tile^2).
//
// Layout, shared with the GPT and the Llama (llama_ops.hpp packs grouped-query heads into it): qkv is
// [batch, len, 3 d] with q, k and v side by side (d = heads * head_dim), att and datt [batch, len, d],
// lse [batch, heads, len]. The products are fp32 (fp64 for double), or with bf16_products (float only, on a CPU
// with bf16 dot products) bf16 operands with fp32 accumulation as the models' linear layers: q, k, v, dO, the
// probabilities and their gradient rounded to bf16 as they enter a product; the softmax, the log-sum-exp and
// the row terms stay fp32. Deterministic: the tiles are
// fixed by the sizes, each output is written by one chunk of the host pool (host_parallel.hpp) and its sums
// run in a fixed order, so the bits do not depend on the thread count or on scheduling. The products run on
// the chunk's own thread: call gemm::configure_backends() first (host_gemm.hpp; the models' constructors do).
#pragma once

#include <cstddef>

namespace zero3::models::ops {

using Index = std::size_t;

// Queries per tile, and keys per key tile (wider, so that each product's fixed cost spreads over more work): the
// score products are kAttentionTile x kAttentionKeyTile x head_dim.
inline constexpr Index kAttentionTile = 64;
inline constexpr Index kAttentionKeyTile = 4 * kAttentionTile;

// att = softmax(q k^T / sqrt(head_dim), keys <= query) v per (sequence, head); lse[s, h, t] = log of the
// softmax's denominator with its max shift added back (the row's log-sum-exp of the scaled scores).
template <typename T>
void flash_attention_forward(const T* qkv, T* lse, T* att, Index batch, Index len, Index heads, Index head_dim,
                             bool bf16_products);

// Writes dqkv [batch, len, 3 d] (no accumulation) from datt, given the forward's qkv, att and lse.
template <typename T>
void flash_attention_backward(const T* qkv, const T* att, const T* lse, const T* datt, T* dqkv, Index batch, Index len,
                              Index heads, Index head_dim, bool bf16_products);

}  // namespace zero3::models::ops
