// GELU of the GPT's MLP on the device, the tanh approximation exactly as the host (gpt_ops.hpp):
// y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). fp32 in and out.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace zero3::models::gpu {

void gelu_forward(cudaStream_t stream, const float* x, float* y, std::size_t n);
// dx = dy * gelu'(x); dx may be dy.
void gelu_backward(cudaStream_t stream, const float* x, const float* dy, float* dx, std::size_t n);

}  // namespace zero3::models::gpu
