#include "device_util.cuh"
#include "gelu.cuh"

namespace zero3::models::gpu {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__global__ void gelu_forward_kernel(const float* __restrict__ x, float* __restrict__ y, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + tanhf(kGeluScale * (v + kGeluCubic * v * v * v)));
  }
}

// No __restrict__ on dy and dx: they may be the same array (each element is read before it is written).
__global__ void gelu_backward_kernel(const float* __restrict__ x, const float* dy, float* dx, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float v = x[i];
    const float t = tanhf(kGeluScale * (v + kGeluCubic * v * v * v));
    const float dt = (1.0f - t * t) * kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    dx[i] = dy[i] * (0.5f * (1.0f + t) + 0.5f * v * dt);
  }
}

}  // namespace

void gelu_forward(cudaStream_t stream, const float* x, float* y, std::size_t n) {
  if (n == 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, y, n);
  ZERO3_CUDA_CHECK_LAUNCH();
}

void gelu_backward(cudaStream_t stream, const float* x, const float* dy, float* dx, std::size_t n) {
  if (n == 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, dy, dx, n);
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace zero3::models::gpu
