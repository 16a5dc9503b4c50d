// The element-wise parts of the GPT's linear layers on the device: the bias (and residual) a GEMM then
// accumulates onto, bias gradients as column sums, and adding fp32 results into gradients of any dtype.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "zero3/core/dtype.hpp"

namespace zero3::models::gpu {

// y[r, c] = bias[c] + residual[r, c] (residual may be null); bias of `param_dtype`; y, residual fp32.
void bias_rows(cudaStream_t stream, DType param_dtype, float* y, const void* bias, const float* residual, int rows,
               int cols);

// dbias[c] += sum over rows of dy[r, c] (fp32 sums in a fixed order, one rounding to `grad_dtype`).
void bias_grad(cudaStream_t stream, DType grad_dtype, const float* dy, void* dbias, int rows, int cols);

// dst[i] = dst[i] + src[i] computed in fp32 and rounded once to `dst_dtype`.
void add_into(cudaStream_t stream, DType dst_dtype, void* dst, const float* src, std::size_t n);

}  // namespace zero3::models::gpu
