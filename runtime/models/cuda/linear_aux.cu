#include "device_util.cuh"
#include "linear_aux.cuh"

namespace zero3::models::gpu {
namespace {

template <typename P>
__global__ void bias_rows_kernel(float* __restrict__ y, const P* __restrict__ bias, const float* __restrict__ residual,
                                 std::size_t n, int cols) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float b = load_f32(bias[i % static_cast<std::size_t>(cols)]);
    y[i] = residual != nullptr ? b + residual[i] : b;
  }
}

template <typename G>
__global__ void bias_grad_kernel(const float* __restrict__ dy, G* __restrict__ dbias, int rows, int cols) {
  const int c = static_cast<int>(blockIdx.x) * kColumnTile + static_cast<int>(threadIdx.x);
  const bool valid = c < cols;
  float total[1];
  block_column_sums<1>(
      rows, valid, [&](int r, float(&acc)[1]) { acc[0] += dy[static_cast<std::size_t>(r) * cols + c]; }, total);
  if (threadIdx.y == 0 && valid) dbias[c] = store_f32<G>(load_f32(dbias[c]) + total[0]);
}

template <typename D>
__global__ void add_into_kernel(D* __restrict__ dst, const float* __restrict__ src, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) dst[i] = store_f32<D>(load_f32(dst[i]) + src[i]);
}

}  // namespace

void bias_rows(cudaStream_t stream, DType param_dtype, float* y, const void* bias, const float* residual, int rows,
               int cols) {
  const std::size_t n = static_cast<std::size_t>(rows) * cols;
  if (n == 0) return;
  dispatch_dtype(param_dtype, [&](auto tag) {
    using P = typename decltype(tag)::type;
    bias_rows_kernel<P><<<grid_for(n), kThreads, 0, stream>>>(y, static_cast<const P*>(bias), residual, n, cols);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
}

void bias_grad(cudaStream_t stream, DType grad_dtype, const float* dy, void* dbias, int rows, int cols) {
  if (cols == 0) return;
  dispatch_dtype(grad_dtype, [&](auto tag) {
    using G = typename decltype(tag)::type;
    bias_grad_kernel<G>
        <<<column_tiles(cols), dim3(kColumnTile, kRowLanes), 0, stream>>>(dy, static_cast<G*>(dbias), rows, cols);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
}

void add_into(cudaStream_t stream, DType dst_dtype, void* dst, const float* src, std::size_t n) {
  if (n == 0) return;
  dispatch_dtype(dst_dtype, [&](auto tag) {
    using D = typename decltype(tag)::type;
    add_into_kernel<D><<<grid_for(n), kThreads, 0, stream>>>(static_cast<D*>(dst), src, n);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace zero3::models::gpu
