#include "device_util.cuh"
#include "swiglu.cuh"

namespace zero3::models::gpu {
namespace {

__device__ __forceinline__ float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__global__ void swiglu_forward_kernel(const float* __restrict__ gate, const float* __restrict__ up,
                                      float* __restrict__ h, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float g = gate[i];
    h[i] = g * sigmoid(g) * up[i];
  }
}

// No __restrict__ on dh and dgate: they may be the same array.
__global__ void swiglu_backward_kernel(const float* __restrict__ gate, const float* __restrict__ up, const float* dh,
                                       float* dgate, float* __restrict__ dup, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float g = gate[i];
    const float s = sigmoid(g);
    const float grad = dh[i];
    dup[i] = grad * g * s;
    dgate[i] = grad * up[i] * s * (1.0f + g * (1.0f - s));  // silu'(g) = s (1 + g (1 - s))
  }
}

}  // namespace

void swiglu_forward(cudaStream_t stream, const float* gate, const float* up, float* h, std::size_t n) {
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, h, n);
  ZERO3_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(cudaStream_t stream, const float* gate, const float* up, const float* dh, float* dgate, float* dup,
                     std::size_t n) {
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_for(n), kThreads, 0, stream>>>(gate, up, dh, dgate, dup, n);
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace zero3::models::gpu
