#include "device_util.cuh"
#include "rope_gqa.cuh"

namespace zero3::models::gpu {
namespace {

// One pair (j, j + half) of a head: y = the pair rotated by the angle whose cosine is c and sine s (s
// negated undoes the rotation). Written like llama_ops' rotate, term for term.
__device__ __forceinline__ void rotate_pair(const float* x, float* y, int j, int half, float c, float s) {
  const float a = x[j];
  const float b = x[j + half];
  y[j] = a * c - b * s;
  y[j + half] = b * c + a * s;
}

// Thread i's pair j of head h (one of `heads`) in row r, and the index of its angle in the rotary table.
struct PairAt {
  int j;
  int h;
  std::size_t r;
  std::size_t angle;
};
__device__ __forceinline__ PairAt pair_at(std::size_t i, int half, int heads, int len) {
  const auto pairs = static_cast<std::size_t>(half);
  const std::size_t r = i / (pairs * static_cast<std::size_t>(heads));
  return {static_cast<int>(i % pairs), static_cast<int>(i / pairs % static_cast<std::size_t>(heads)), r,
          (r % static_cast<std::size_t>(len)) * pairs + i % pairs};
}

// One thread per (row, query head, pair): its q pair rotated, its kv head's k pair rotated, its v pair.
__global__ void gqa_pack_kernel(GqaShape sh, const float* __restrict__ q, const float* __restrict__ k,
                                const float* __restrict__ v, float* __restrict__ qkv, const float* __restrict__ cos,
                                const float* __restrict__ sin, std::size_t n) {
  const int half = sh.head_dim / 2;
  const int group = sh.heads / sh.kv_heads;
  const std::size_t q_width = static_cast<std::size_t>(sh.heads) * sh.head_dim;
  const std::size_t kv_width = static_cast<std::size_t>(sh.kv_heads) * sh.head_dim;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const auto [j, h, r, angle] = pair_at(i, half, sh.heads, sh.len);
    const float c = cos[angle];
    const float s = sin[angle];
    const std::size_t kv_at = r * kv_width + static_cast<std::size_t>(h / group) * sh.head_dim;
    float* out = qkv + r * 3 * q_width + static_cast<std::size_t>(h) * sh.head_dim;
    rotate_pair(q + r * q_width + static_cast<std::size_t>(h) * sh.head_dim, out, j, half, c, s);
    rotate_pair(k + kv_at, out + q_width, j, half, c, s);
    out[2 * q_width + j] = v[kv_at + j];
    out[2 * q_width + j + half] = v[kv_at + j + half];
  }
}

// One thread per (row, query head, pair): the inverse rotation of the q part.
__global__ void gqa_unpack_q_kernel(GqaShape sh, const float* __restrict__ dqkv, float* __restrict__ dq,
                                    const float* __restrict__ cos, const float* __restrict__ sin, std::size_t n) {
  const int half = sh.head_dim / 2;
  const std::size_t q_width = static_cast<std::size_t>(sh.heads) * sh.head_dim;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const auto [j, h, r, angle] = pair_at(i, half, sh.heads, sh.len);
    const std::size_t at = static_cast<std::size_t>(h) * sh.head_dim;
    rotate_pair(dqkv + r * 3 * q_width + at, dq + r * q_width + at, j, half, cos[angle], -sin[angle]);
  }
}

// One thread per (row, kv head, pair): the k and v pairs summed over the kv head's query heads in
// increasing order, then the k pair rotated back.
__global__ void gqa_unpack_kv_kernel(GqaShape sh, const float* __restrict__ dqkv, float* __restrict__ dk,
                                     float* __restrict__ dv, const float* __restrict__ cos,
                                     const float* __restrict__ sin, std::size_t n) {
  const int half = sh.head_dim / 2;
  const int group = sh.heads / sh.kv_heads;
  const std::size_t q_width = static_cast<std::size_t>(sh.heads) * sh.head_dim;
  const std::size_t kv_width = static_cast<std::size_t>(sh.kv_heads) * sh.head_dim;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const auto [j, kv, r, angle] = pair_at(i, half, sh.kv_heads, sh.len);
    const float* in = dqkv + r * 3 * q_width;
    float k_sum[2] = {0.0f, 0.0f};  // the pair (j, j + half)
    float v_sum[2] = {0.0f, 0.0f};
    for (int h = kv * group; h < (kv + 1) * group; ++h) {
      const float* kh = in + q_width + static_cast<std::size_t>(h) * sh.head_dim;
      const float* vh = in + 2 * q_width + static_cast<std::size_t>(h) * sh.head_dim;
      k_sum[0] += kh[j];
      k_sum[1] += kh[j + half];
      v_sum[0] += vh[j];
      v_sum[1] += vh[j + half];
    }
    const float c = cos[angle];
    const float s = -sin[angle];
    const std::size_t out = r * kv_width + static_cast<std::size_t>(kv) * sh.head_dim;
    dk[out + j] = k_sum[0] * c - k_sum[1] * s;
    dk[out + j + half] = k_sum[1] * c + k_sum[0] * s;
    dv[out + j] = v_sum[0];
    dv[out + j + half] = v_sum[1];
  }
}

}  // namespace

void gqa_pack(cudaStream_t stream, const GqaShape& shape, const float* q, const float* k, const float* v, float* qkv,
              const float* cos, const float* sin) {
  const std::size_t n = static_cast<std::size_t>(shape.rows) * shape.heads * (shape.head_dim / 2);
  if (n == 0) return;
  gqa_pack_kernel<<<grid_for(n), kThreads, 0, stream>>>(shape, q, k, v, qkv, cos, sin, n);
  ZERO3_CUDA_CHECK_LAUNCH();
}

void gqa_unpack(cudaStream_t stream, const GqaShape& shape, const float* dqkv, float* dq, float* dk, float* dv,
                const float* cos, const float* sin) {
  const std::size_t pairs = static_cast<std::size_t>(shape.rows) * (shape.head_dim / 2);
  if (pairs == 0) return;
  const std::size_t nq = pairs * shape.heads;
  gqa_unpack_q_kernel<<<grid_for(nq), kThreads, 0, stream>>>(shape, dqkv, dq, cos, sin, nq);
  ZERO3_CUDA_CHECK_LAUNCH();
  const std::size_t nkv = pairs * shape.kv_heads;
  gqa_unpack_kv_kernel<<<grid_for(nkv), kThreads, 0, stream>>>(shape, dqkv, dk, dv, cos, sin, nkv);
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace zero3::models::gpu
