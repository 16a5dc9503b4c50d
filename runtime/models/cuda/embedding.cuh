// The decoders' embedding on the device: token (and, for the GPT, learned position) lookup, and its
// deterministic backward.
// Launchers are host functions (non-blocking, enqueued on `stream`); arguments are trusted (checked by
// the model). Token ids are int32 device arrays.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "zero3/core/dtype.hpp"

namespace zero3::models::gpu {

// out[r, :] = wte[tokens[r], :] + wpe[r % len, :] for the rows = batch * len positions; wte and wpe are
// of `param_dtype`, out fp32 [rows, d]. A null wpe (no learned positions, as the Llama's) adds nothing.
void embedding_forward(cudaStream_t stream, DType param_dtype, const void* wte, const void* wpe,
                       const std::int32_t* tokens, float* out, int rows, int len, int d);

// The rows of the batch grouped by token id (built on the host): for the u-th distinct token uniq[u], the
// rows row_index[offsets[u] .. offsets[u + 1]) in increasing order.
struct TokenRows {
  const std::int32_t* uniq = nullptr;
  const std::int32_t* offsets = nullptr;
  const std::int32_t* row_index = nullptr;
  int num_uniq = 0;
};

// dwte[v, :] += sum of dout over the rows whose token is v; dwpe[t, :] += sum over sequences of dout at
// position t. Each element is summed by one thread in a fixed order (no atomics): the same bits every run.
// Gradients are of `grad_dtype`, dout fp32 [batch * len, d]. A null dwpe skips the position gradient.
void embedding_backward(cudaStream_t stream, DType grad_dtype, const float* dout, const TokenRows& token_rows,
                        void* dwte, void* dwpe, int batch, int len, int d);

}  // namespace zero3::models::gpu
