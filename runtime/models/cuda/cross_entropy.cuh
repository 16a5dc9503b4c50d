// Cross-entropy of the GPT's logits on the device, as the host (gpt_ops.hpp): per-position loss
// logsumexp(row) - row[target], their mean, and dlogits = scale (softmax - onehot). Logits fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "zero3/core/dtype.hpp"

namespace zero3::models::gpu {

// lse[i] = logsumexp(logits row i); losses[i] = lse[i] - logits[i, targets[i]]. Then *mean = the mean of
// losses over the rows (rows > 0), summed in double in a fixed order.
void cross_entropy_forward(cudaStream_t stream, const float* logits, const std::int32_t* targets, float* lse,
                           float* losses, double* mean, int rows, int vocab);

// dlogits = scale * (exp(logits - lse) - onehot(targets)), stored as `out_dtype`. dlogits may be the
// logits themselves when out_dtype is f32 (each element is read, then written, by one thread).
void cross_entropy_backward(cudaStream_t stream, DType out_dtype, const float* logits, const float* lse,
                            const std::int32_t* targets, void* dlogits, int rows, int vocab, float scale);

}  // namespace zero3::models::gpu
