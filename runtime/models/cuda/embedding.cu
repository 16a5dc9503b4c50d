#include "device_util.cuh"
#include "embedding.cuh"

namespace zero3::models::gpu {
namespace {

template <typename P>
__global__ void embedding_forward_kernel(const P* __restrict__ wte, const P* __restrict__ wpe,
                                         const std::int32_t* __restrict__ tokens, float* __restrict__ out,
                                         std::size_t n, int len, int d) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::size_t r = i / static_cast<std::size_t>(d);
    const std::size_t k = i % static_cast<std::size_t>(d);
    const std::size_t t = r % static_cast<std::size_t>(len);
    const std::size_t token = static_cast<std::size_t>(tokens[r]);
    const float e = load_f32(wte[token * d + k]);
    out[i] = wpe != nullptr ? e + load_f32(wpe[t * d + k]) : e;
  }
}

// One block per distinct token; its threads walk the hidden dimension.
template <typename G>
__global__ void token_grad_kernel(const float* __restrict__ dout, const std::int32_t* __restrict__ uniq,
                                  const std::int32_t* __restrict__ offsets, const std::int32_t* __restrict__ row_index,
                                  G* __restrict__ dwte, int d) {
  const int u = static_cast<int>(blockIdx.x);
  const int begin = offsets[u];
  const int end = offsets[u + 1];
  G* row = dwte + static_cast<std::size_t>(uniq[u]) * d;
  for (int k = static_cast<int>(threadIdx.x); k < d; k += static_cast<int>(blockDim.x)) {
    float s = 0.0f;
    for (int j = begin; j < end; ++j) s += dout[static_cast<std::size_t>(row_index[j]) * d + k];
    row[k] = store_f32<G>(load_f32(row[k]) + s);
  }
}

// One thread per (position, hidden) element; it sums the sequences in order.
template <typename G>
__global__ void position_grad_kernel(const float* __restrict__ dout, G* __restrict__ dwpe, int batch, int len, int d) {
  const std::size_t n = static_cast<std::size_t>(len) * d;
  const std::size_t seq_stride = n;  // one sequence of dout is len * d elements
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float s = 0.0f;
    for (int b = 0; b < batch; ++b) s += dout[b * seq_stride + i];
    dwpe[i] = store_f32<G>(load_f32(dwpe[i]) + s);
  }
}

}  // namespace

void embedding_forward(cudaStream_t stream, DType param_dtype, const void* wte, const void* wpe,
                       const std::int32_t* tokens, float* out, int rows, int len, int d) {
  const std::size_t n = static_cast<std::size_t>(rows) * d;
  if (n == 0) return;
  dispatch_dtype(param_dtype, [&](auto tag) {
    using P = typename decltype(tag)::type;
    embedding_forward_kernel<P><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<const P*>(wte), static_cast<const P*>(wpe), tokens, out, n, len, d);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
}

void embedding_backward(cudaStream_t stream, DType grad_dtype, const float* dout, const TokenRows& token_rows,
                        void* dwte, void* dwpe, int batch, int len, int d) {
  if (batch == 0 || len == 0 || d == 0) return;
  dispatch_dtype(grad_dtype, [&](auto tag) {
    using G = typename decltype(tag)::type;
    if (token_rows.num_uniq > 0) {
      token_grad_kernel<G><<<static_cast<unsigned int>(token_rows.num_uniq), kThreads, 0, stream>>>(
          dout, token_rows.uniq, token_rows.offsets, token_rows.row_index, static_cast<G*>(dwte), d);
      ZERO3_CUDA_CHECK_LAUNCH();
    }
    if (dwpe == nullptr) return;
    const std::size_t n = static_cast<std::size_t>(len) * d;
    position_grad_kernel<G><<<grid_for(n), kThreads, 0, stream>>>(dout, static_cast<G*>(dwpe), batch, len, d);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace zero3::models::gpu
