// The causal softmax of the GPT's attention on the device, over score matrices [len, len] (fp32) that a
// batched GEMM wrote (already scaled by 1/sqrt(head_dim)). Row t keeps keys 0..t; the rest become exact
// zeros, as on the host.
#pragma once

#include <cuda_runtime.h>

namespace zero3::models::gpu {

// In place over `items` contiguous [len, len] matrices.
void causal_softmax_forward(cudaStream_t stream, float* scores, int items, int len);

// dS = P (dP - sum_j P dP) over keys <= query, zero above the diagonal, in place over dP. Matrix m of P
// starts at prob + m * prob_stride, of dP at dprob + m * dprob_stride (elements).
void causal_softmax_backward(cudaStream_t stream, const float* prob, long long prob_stride, float* dprob,
                             long long dprob_stride, int items, int len);

}  // namespace zero3::models::gpu
