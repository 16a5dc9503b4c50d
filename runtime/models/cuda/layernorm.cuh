// LayerNorm of the GPT on the device, fp32 activations and statistics, params and grads of any dtype.
// Same formulas as the host (gpt_ops.hpp): eps 1e-5, stat[2 i] = mean, stat[2 i + 1] = 1/std.
#pragma once

#include <cuda_runtime.h>

#include "zero3/core/dtype.hpp"

namespace zero3::models::gpu {

// y = (x - mean) / sqrt(var + eps) * w + b per row of width d; x, y, stat fp32; w, b of `param_dtype`.
void layernorm_forward(cudaStream_t stream, DType param_dtype, const float* x, const void* w, const void* b, float* y,
                       float* stat, int rows, int d);

// dx += dL/dx (fp32); dw += sum over rows of dy * xhat; db += sum over rows of dy (grads of `grad_dtype`).
// dx must not alias x or dy.
void layernorm_backward(cudaStream_t stream, DType param_dtype, DType grad_dtype, const float* x, const void* w,
                        const float* stat, const float* dy, float* dx, void* dw, void* db, int rows, int d);

}  // namespace zero3::models::gpu
