#include "attention_softmax.cuh"
#include "device_util.cuh"

namespace zero3::models::gpu {
namespace {

// One warp per row of one matrix.
__global__ void causal_softmax_forward_kernel(float* __restrict__ scores, int items, int len) {
  const std::size_t row = warp_row();
  if (row >= static_cast<std::size_t>(items) * len) return;
  const int t = static_cast<int>(row % static_cast<std::size_t>(len));
  const int lane = lane_id();
  float* r = scores + row * len;
  float mx = -CUDART_INF_F;
  for (int j = lane; j <= t; j += kWarp) mx = fmaxf(mx, r[j]);
  mx = warp_max(mx);
  float sum = 0.0f;
  for (int j = lane; j <= t; j += kWarp) {
    const float e = expf(r[j] - mx);
    r[j] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int j = lane; j < len; j += kWarp) r[j] = j <= t ? r[j] * inv : 0.0f;
}

__global__ void causal_softmax_backward_kernel(const float* __restrict__ prob, long long prob_stride,
                                               float* __restrict__ dprob, long long dprob_stride, int items, int len) {
  const std::size_t row = warp_row();
  if (row >= static_cast<std::size_t>(items) * len) return;
  const std::size_t item = row / static_cast<std::size_t>(len);
  const int t = static_cast<int>(row % static_cast<std::size_t>(len));
  const int lane = lane_id();
  const float* p = prob + static_cast<long long>(item) * prob_stride + static_cast<long long>(t) * len;
  float* dp = dprob + static_cast<long long>(item) * dprob_stride + static_cast<long long>(t) * len;
  float dot = 0.0f;
  for (int j = lane; j <= t; j += kWarp) dot += p[j] * dp[j];
  dot = warp_sum(dot);
  for (int j = lane; j < len; j += kWarp) dp[j] = j <= t ? p[j] * (dp[j] - dot) : 0.0f;
}

}  // namespace

void causal_softmax_forward(cudaStream_t stream, float* scores, int items, int len) {
  const std::size_t rows = static_cast<std::size_t>(items) * len;
  if (rows == 0) return;
  causal_softmax_forward_kernel<<<warp_rows_grid(rows), kThreads, 0, stream>>>(scores, items, len);
  ZERO3_CUDA_CHECK_LAUNCH();
}

void causal_softmax_backward(cudaStream_t stream, const float* prob, long long prob_stride, float* dprob,
                             long long dprob_stride, int items, int len) {
  const std::size_t rows = static_cast<std::size_t>(items) * len;
  if (rows == 0) return;
  causal_softmax_backward_kernel<<<warp_rows_grid(rows), kThreads, 0, stream>>>(prob, prob_stride, dprob, dprob_stride,
                                                                                items, len);
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace zero3::models::gpu
