// One warp per row. A lane holds the elements lane, lane + 32, ... of a head's row (head_dim / 32 rounded
// up, at most kMaxHeadDim / 32), and each dot product is a butterfly warp_sum: the order of every sum is
// fixed by the sizes. Backward runs three kernels: delta = rowsum(dO O) per query, then dQ with a warp per
// query walking its keys, then dK and dV with a warp per key walking its queries; each recomputes the
// probabilities from the saved log-sum-exp and writes its own rows only.
#include <cmath>

#include "device_util.cuh"
#include "flash_attention.cuh"

namespace zero3::models::gpu {
namespace {

constexpr int kPerLane = kMaxHeadDim / kWarp;

// Where row `t` of sequence s, head h lives in qkv (q; k and v follow at + d and + 2 d) and in att.
struct Layout {
  int len, heads, head_dim;
  __device__ std::size_t d() const { return static_cast<std::size_t>(heads) * head_dim; }
  __device__ std::size_t qkv_row(std::size_t s, int h, int t) const {
    return (s * len + t) * 3 * d() + static_cast<std::size_t>(h) * head_dim;
  }
  __device__ std::size_t att_row(std::size_t s, int h, int t) const {
    return (s * len + t) * d() + static_cast<std::size_t>(h) * head_dim;
  }
};

__device__ __forceinline__ void load_row(const float* __restrict__ src, int head_dim, int lane, float scale,
                                         float (&dst)[kPerLane]) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarp;
    dst[i] = e < head_dim ? src[e] * scale : 0.0f;
  }
}

__device__ __forceinline__ float dot_row(const float (&x)[kPerLane], const float* __restrict__ y, int head_dim,
                                         int lane) {
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarp;
    if (e < head_dim) acc += x[i] * y[e];
  }
  return warp_sum(acc);
}

__device__ __forceinline__ void store_row(float* __restrict__ dst, const float (&x)[kPerLane], int head_dim, int lane,
                                          float scale) {
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int e = lane + i * kWarp;
    if (e < head_dim) dst[e] = x[i] * scale;
  }
}

// Rows are numbered (sequence, head, position); the warp's row, split.
struct RowId {
  std::size_t s;
  int h, t;
};
__device__ __forceinline__ RowId row_id(std::size_t row, const Layout& L) {
  const std::size_t sh = row / static_cast<std::size_t>(L.len);
  return {sh / static_cast<std::size_t>(L.heads), static_cast<int>(sh % L.heads), static_cast<int>(row % L.len)};
}

__global__ void forward_kernel(const float* __restrict__ qkv, float* __restrict__ lse, float* __restrict__ att,
                               std::size_t rows, Layout L, float scale) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const RowId r = row_id(row, L);
  const int lane = lane_id();
  const std::size_t ld = 3 * L.d();
  float q[kPerLane], acc[kPerLane];
  load_row(qkv + L.qkv_row(r.s, r.h, r.t), L.head_dim, lane, scale, q);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
  const float* k = qkv + L.qkv_row(r.s, r.h, 0) + L.d();
  const float* v = k + L.d();
  float running_max = -CUDART_INF_F, denom = 0.0f;
  for (int j = 0; j <= r.t; ++j) {
    const float score = dot_row(q, k + j * ld, L.head_dim, lane);
    const float new_max = fmaxf(running_max, score);
    const float shrink = expf(running_max - new_max);  // 0 for the first key
    const float p = expf(score - new_max);
    denom = denom * shrink + p;
    const float* vj = v + j * ld;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + i * kWarp;
      acc[i] = acc[i] * shrink + (e < L.head_dim ? p * vj[e] : 0.0f);
    }
    running_max = new_max;
  }
  store_row(att + L.att_row(r.s, r.h, r.t), acc, L.head_dim, lane, 1.0f / denom);
  if (lane == 0) lse[row] = running_max + logf(denom);
}

__global__ void delta_kernel(const float* __restrict__ att, const float* __restrict__ datt, float* __restrict__ delta,
                             std::size_t rows, Layout L) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const RowId r = row_id(row, L);
  const int lane = lane_id();
  float o[kPerLane];
  load_row(att + L.att_row(r.s, r.h, r.t), L.head_dim, lane, 1.0f, o);
  const float d = dot_row(o, datt + L.att_row(r.s, r.h, r.t), L.head_dim, lane);
  if (lane == 0) delta[row] = d;
}

// dQ of one query: sum over keys j <= t of dS_tj k_j, dS = P (dO v_j - delta), scaled by 1/sqrt(head_dim).
__global__ void dq_kernel(const float* __restrict__ qkv, const float* __restrict__ lse, const float* __restrict__ datt,
                          const float* __restrict__ delta, float* __restrict__ dqkv, std::size_t rows, Layout L,
                          float scale) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const RowId r = row_id(row, L);
  const int lane = lane_id();
  const std::size_t ld = 3 * L.d();
  float q[kPerLane], dout[kPerLane], dq[kPerLane];
  load_row(qkv + L.qkv_row(r.s, r.h, r.t), L.head_dim, lane, scale, q);
  load_row(datt + L.att_row(r.s, r.h, r.t), L.head_dim, lane, 1.0f, dout);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) dq[i] = 0.0f;
  const float* k = qkv + L.qkv_row(r.s, r.h, 0) + L.d();
  const float* v = k + L.d();
  const float row_lse = lse[row], row_delta = delta[row];
  for (int j = 0; j <= r.t; ++j) {
    const float p = expf(dot_row(q, k + j * ld, L.head_dim, lane) - row_lse);
    const float ds = p * (dot_row(dout, v + j * ld, L.head_dim, lane) - row_delta);
    const float* kj = k + j * ld;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + i * kWarp;
      if (e < L.head_dim) dq[i] += ds * kj[e];
    }
  }
  store_row(dqkv + L.qkv_row(r.s, r.h, r.t), dq, L.head_dim, lane, scale);
}

// dK and dV of one key j: sums over queries t >= j of dS_tj q_t (scaled) and P_tj dO_t.
__global__ void dkv_kernel(const float* __restrict__ qkv, const float* __restrict__ lse, const float* __restrict__ datt,
                           const float* __restrict__ delta, float* __restrict__ dqkv, std::size_t rows, Layout L,
                           float scale) {
  const std::size_t row = warp_row();
  if (row >= rows) return;
  const RowId r = row_id(row, L);  // r.t is the key's position here
  const int lane = lane_id();
  const std::size_t ld = 3 * L.d();
  float k[kPerLane], v[kPerLane], dk[kPerLane], dv[kPerLane];
  const float* key_row = qkv + L.qkv_row(r.s, r.h, r.t) + L.d();
  load_row(key_row, L.head_dim, lane, scale, k);
  load_row(key_row + L.d(), L.head_dim, lane, 1.0f, v);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) dk[i] = dv[i] = 0.0f;
  const std::size_t first = row - static_cast<std::size_t>(r.t);  // the (sequence, head)'s row 0
  for (int t = r.t; t < L.len; ++t) {
    const float* q = qkv + L.qkv_row(r.s, r.h, t);
    const float* dout = datt + L.att_row(r.s, r.h, t);
    const float p = expf(dot_row(k, q, L.head_dim, lane) - lse[first + t]);
    const float ds = p * (dot_row(v, dout, L.head_dim, lane) - delta[first + t]);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int e = lane + i * kWarp;
      if (e < L.head_dim) {
        dv[i] += p * dout[e];
        dk[i] += ds * q[e];
      }
    }
  }
  float* out = dqkv + L.qkv_row(r.s, r.h, r.t) + L.d();
  store_row(out, dk, L.head_dim, lane, scale);
  store_row(out + L.d(), dv, L.head_dim, lane, 1.0f);
}

void check_head_dim(int head_dim) {
  if (head_dim < 1 || head_dim > kMaxHeadDim) {
    throw UsageError("CUDA attention: head_dim " + std::to_string(head_dim) + " is outside [1, " +
                     std::to_string(kMaxHeadDim) + "]");
  }
}

}  // namespace

void flash_attention_forward(cudaStream_t stream, const float* qkv, float* lse, float* att, int batch, int len,
                             int heads, int head_dim) {
  check_head_dim(head_dim);
  const std::size_t rows = static_cast<std::size_t>(batch) * heads * len;
  if (rows == 0) return;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  forward_kernel<<<warp_rows_grid(rows), kThreads, 0, stream>>>(qkv, lse, att, rows, Layout{len, heads, head_dim},
                                                                scale);
  ZERO3_CUDA_CHECK_LAUNCH();
}

void flash_attention_backward(cudaStream_t stream, const float* qkv, const float* att, const float* lse,
                              const float* datt, float* dqkv, float* delta, int batch, int len, int heads,
                              int head_dim) {
  check_head_dim(head_dim);
  const std::size_t rows = static_cast<std::size_t>(batch) * heads * len;
  if (rows == 0) return;
  const Layout layout{len, heads, head_dim};
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const unsigned int grid = warp_rows_grid(rows);
  delta_kernel<<<grid, kThreads, 0, stream>>>(att, datt, delta, rows, layout);
  ZERO3_CUDA_CHECK_LAUNCH();
  dq_kernel<<<grid, kThreads, 0, stream>>>(qkv, lse, datt, delta, dqkv, rows, layout, scale);
  ZERO3_CUDA_CHECK_LAUNCH();
  dkv_kernel<<<grid, kThreads, 0, stream>>>(qkv, lse, datt, delta, dqkv, rows, layout, scale);
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace zero3::models::gpu
