#include "cross_entropy.cuh"
#include "device_util.cuh"

namespace zero3::models::gpu {
namespace {

constexpr int kMeanThreads = 256;

// One block per row: the vocabulary can be tens of thousands wide.
__global__ void cross_entropy_forward_kernel(const float* __restrict__ logits, const std::int32_t* __restrict__ targets,
                                             float* __restrict__ lse, float* __restrict__ losses, int vocab) {
  __shared__ float scratch[kWarp];
  const std::size_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  float mx = -CUDART_INF_F;
  for (int j = static_cast<int>(threadIdx.x); j < vocab; j += static_cast<int>(blockDim.x)) mx = fmaxf(mx, l[j]);
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int j = static_cast<int>(threadIdx.x); j < vocab; j += static_cast<int>(blockDim.x)) sum += expf(l[j] - mx);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    const float row_lse = mx + logf(sum);
    lse[row] = row_lse;
    losses[row] = row_lse - l[targets[row]];
  }
}

// One block: each thread sums a strided slice in double, then a tree in shared memory (fixed shape).
__global__ void mean_kernel(const float* __restrict__ values, double* __restrict__ mean, int n) {
  __shared__ double partial[kMeanThreads];
  double s = 0.0;
  for (int i = static_cast<int>(threadIdx.x); i < n; i += kMeanThreads) s += static_cast<double>(values[i]);
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int half = kMeanThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *mean = partial[0] / static_cast<double>(n);
}

// No __restrict__ on logits and dlogits: they may be one array.
template <typename O>
__global__ void cross_entropy_backward_kernel(const float* logits, const float* __restrict__ lse,
                                              const std::int32_t* __restrict__ targets, O* dlogits, int vocab,
                                              float scale) {
  const std::size_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  O* dl = dlogits + row * vocab;
  const float row_lse = lse[row];
  const int target = targets[row];
  for (int j = static_cast<int>(threadIdx.x); j < vocab; j += static_cast<int>(blockDim.x)) {
    const float p = expf(l[j] - row_lse);
    dl[j] = store_f32<O>(j == target ? scale * p - scale : scale * p);
  }
}

}  // namespace

void cross_entropy_forward(cudaStream_t stream, const float* logits, const std::int32_t* targets, float* lse,
                           float* losses, double* mean, int rows, int vocab) {
  if (rows == 0) return;
  cross_entropy_forward_kernel<<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(logits, targets, lse, losses,
                                                                                         vocab);
  ZERO3_CUDA_CHECK_LAUNCH();
  mean_kernel<<<1, kMeanThreads, 0, stream>>>(losses, mean, rows);
  ZERO3_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(cudaStream_t stream, DType out_dtype, const float* logits, const float* lse,
                            const std::int32_t* targets, void* dlogits, int rows, int vocab, float scale) {
  if (rows == 0) return;
  dispatch_dtype(out_dtype, [&](auto tag) {
    using O = typename decltype(tag)::type;
    cross_entropy_backward_kernel<O><<<static_cast<unsigned int>(rows), kThreads, 0, stream>>>(
        logits, lse, targets, static_cast<O*>(dlogits), vocab, scale);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace zero3::models::gpu
