// The SwiGLU gate of the CUDA Llama's MLP, the formulas of llama_ops.hpp: h = silu(gate) * up with
// silu(g) = g / (1 + e^-g). fp32 in and out, element-wise over n; enqueued on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace zero3::models::gpu {

void swiglu_forward(cudaStream_t stream, const float* gate, const float* up, float* h, std::size_t n);

// dgate = dh * up * silu'(gate), dup = dh * silu(gate); dgate may be dh (each element is read, then written,
// by one thread). dup must be distinct from both.
void swiglu_backward(cudaStream_t stream, const float* gate, const float* up, const float* dh, float* dgate, float* dup,
                     std::size_t n);

}  // namespace zero3::models::gpu
