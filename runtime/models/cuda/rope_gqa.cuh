// The grouped-query layout change of the CUDA Llama with rotary position embeddings, the formulas of
// llama_ops.hpp (gqa_pack, gqa_unpack): separate q [rows, heads dim], k and v [rows, kv_heads dim] to and
// from the packed qkv [rows, 3 heads dim] the attention of flash_attention.cuh reads. Query
// head h reads kv head h / (heads / kv_heads); row r sits at position r % len and is rotated by the
// angles of row r % len of cos and sin [len, dim / 2] (the rotate-half pairing (j, j + dim / 2)). All
// fp32; enqueued on `stream`; arguments trusted (heads a multiple of kv_heads, dim even).
#pragma once

#include <cuda_runtime.h>

namespace zero3::models::gpu {

struct GqaShape {
  int rows = 0;  // batch * len
  int len = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
};

// qkv = [rotate(q) | rotate(k) per query head | v per query head]; every element of qkv is written.
void gqa_pack(cudaStream_t stream, const GqaShape& shape, const float* q, const float* k, const float* v, float* qkv,
              const float* cos, const float* sin);

// The transpose: dq = the rotation undone on dqkv's q part; dk and dv the sums over each kv head's query
// heads, in increasing head order (dk rotated back after the sum). Writes dq, dk, dv (no accumulation).
void gqa_unpack(cudaStream_t stream, const GqaShape& shape, const float* dqkv, float* dq, float* dk, float* dv,
                const float* cos, const float* sin);

}  // namespace zero3::models::gpu
