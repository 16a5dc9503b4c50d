#include "common.cuh"
#include "sum_squares.cuh"

namespace zero3::kernels::gpu {
namespace {

// The reduction's shape is a function of the element count only (never of the GPU model or its SM
// count), and every addition happens in a fixed order: the same input gives the same bits on every run
// and every device.
constexpr int kPartialThreads = 256;
constexpr std::size_t kElemsPerThread = 8;  // before the grid is capped
constexpr int kMaxPartials = 1024;          // blocks of the first pass = threads of the final pass

unsigned int partial_blocks(std::size_t num_elems) {
  const std::size_t per_block = kPartialThreads * kElemsPerThread;
  const std::size_t blocks = (num_elems + per_block - 1) / per_block;
  return static_cast<unsigned int>(std::clamp<std::size_t>(blocks, 1, kMaxPartials));
}

// Adds shared[0..kWidth) into shared[0] by a fixed pairwise tree. Ends with a barrier.
template <int kWidth>
__device__ void tree_sum(double* shared) {
  for (int stride = kWidth / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
}

// Accumulates in double: each square of an fp32 value is exact in double (24 + 24 bits < 53), so the
// only rounding is in the additions, far below the fp32 result's resolution.
template <typename T>
__global__ void __launch_bounds__(kPartialThreads)
    partial_sums_kernel(const T* __restrict__ x, std::size_t n, double* __restrict__ partials) {
  __shared__ double shared[kPartialThreads];
  double acc = 0.0;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const double v = load_f32(x[i]);
    acc = __fma_rn(v, v, acc);  // exact product, so the same value as v * v + acc
  }
  shared[threadIdx.x] = acc;
  __syncthreads();
  tree_sum<kPartialThreads>(shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = shared[0];
}

__global__ void __launch_bounds__(kMaxPartials)
    final_sum_kernel(const double* __restrict__ partials, unsigned int num_partials, float* out, bool accumulate) {
  __shared__ double shared[kMaxPartials];
  shared[threadIdx.x] = threadIdx.x < num_partials ? partials[threadIdx.x] : 0.0;
  __syncthreads();
  tree_sum<kMaxPartials>(shared);
  if (threadIdx.x == 0) {
    double total = shared[0];
    if (accumulate) total = static_cast<double>(*out) + total;
    *out = __double2float_rn(total);
  }
}

template <typename T>
void launch_partials(cudaStream_t stream, ConstBufferView x, unsigned int blocks, double* partials) {
  partial_sums_kernel<T><<<blocks, kPartialThreads, 0, stream>>>(static_cast<const T*>(x.data), x.count, partials);
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_sum_squares(cudaStream_t stream, ConstBufferView x, BufferView out, bool accumulate) {
  if (x.count == 0) {
    if (!accumulate) {  // the sum of nothing: the final pass with no partials writes 0 (also into pinned memory)
      final_sum_kernel<<<1, kMaxPartials, 0, stream>>>(nullptr, 0, out.as<float>(), false);
      ZERO3_CUDA_CHECK_LAUNCH();
    }
    return;
  }
  const unsigned int blocks = partial_blocks(x.count);
  // Scratch for the partials (at most 8 KiB) comes from the stream-ordered pool and goes back to it in
  // stream order: correct on any stream, and cheap once the pool has cached a block.
  double* partials = nullptr;
  ZERO3_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partials), blocks * sizeof(double), stream));
  try {
    switch (x.dtype) {
      case DType::f32:
        launch_partials<float>(stream, x, blocks, partials);
        break;
      case DType::f16:
        launch_partials<__half>(stream, x, blocks, partials);
        break;
      case DType::bf16:
        launch_partials<__nv_bfloat16>(stream, x, blocks, partials);
        break;
    }
    final_sum_kernel<<<1, kMaxPartials, 0, stream>>>(partials, blocks, out.as<float>(), accumulate);
    ZERO3_CUDA_CHECK_LAUNCH();
  } catch (...) {
    ZERO3_CUDA_CHECK_NOTHROW(cudaFreeAsync(partials, stream));
    throw;
  }
  ZERO3_CUDA_CHECK(cudaFreeAsync(partials, stream));
}

}  // namespace zero3::kernels::gpu
