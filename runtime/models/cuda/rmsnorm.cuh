// RMSNorm of the CUDA Llama, the formulas of llama_ops.hpp: y = w * (x * r) per row of width d with
// r = 1 / sqrt(mean(x^2) + eps), kept per row for the backward. Activations and r are fp32, the weight and
// its gradient of any param dtype. Launchers enqueue on `stream` and return; arguments are trusted.
#pragma once

#include <cuda_runtime.h>

#include "zero3/core/dtype.hpp"

namespace zero3::models::gpu {

// y[i, :] = w * (x[i, :] * inv_rms[i]); x, y, inv_rms fp32, w of `param_dtype`.
void rmsnorm_forward(cudaStream_t stream, DType param_dtype, const float* x, const void* w, float* y, float* inv_rms,
                     int rows, int d, float eps);

// dx += r (w dy - x r^2 mean_k(dy_k w_k x_k)) per row (fp32); dw += sum over rows of dy * x * r, summed in
// fp32 in a fixed order and rounded once into `grad_dtype`. dx must not alias x or dy.
void rmsnorm_backward(cudaStream_t stream, DType param_dtype, DType grad_dtype, const float* x, const void* w,
                      const float* inv_rms, const float* dy, float* dx, void* dw, int rows, int d);

}  // namespace zero3::models::gpu
