#include "device_util.cuh"
#include "rmsnorm.cuh"

namespace zero3::models::gpu {
namespace {

// One warp per row: the sum of squares is a warp reduction in a fixed order.
template <typename P>
__global__ void rmsnorm_forward_kernel(const float* __restrict__ x, const P* __restrict__ w, float* __restrict__ y,
                                       float* __restrict__ inv_rms, int rows, int d, float eps) {
  const std::size_t row = warp_row();
  if (row >= static_cast<std::size_t>(rows)) return;  // the whole warp leaves together
  const int lane = lane_id();
  const float* xr = x + row * d;
  float sq = 0.0f;
  for (int k = lane; k < d; k += kWarp) sq += xr[k] * xr[k];
  const float r = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(d) + eps);
  float* yr = y + row * d;
  for (int k = lane; k < d; k += kWarp) yr[k] = load_f32(w[k]) * (xr[k] * r);
  if (lane == 0) inv_rms[row] = r;
}

// dx_k += r (w_k dy_k - x_k c), c = r^2 mean_j(dy_j w_j x_j); one warp per row.
template <typename P>
__global__ void rmsnorm_dx_kernel(const float* __restrict__ x, const P* __restrict__ w,
                                  const float* __restrict__ inv_rms, const float* __restrict__ dy,
                                  float* __restrict__ dx, int rows, int d) {
  const std::size_t row = warp_row();
  if (row >= static_cast<std::size_t>(rows)) return;
  const int lane = lane_id();
  const float r = inv_rms[row];
  const float* xr = x + row * d;
  const float* dyr = dy + row * d;
  float dot = 0.0f;
  for (int k = lane; k < d; k += kWarp) dot += dyr[k] * load_f32(w[k]) * xr[k];
  const float c = warp_sum(dot) / static_cast<float>(d) * r * r;
  float* dxr = dx + row * d;
  for (int k = lane; k < d; k += kWarp) dxr[k] += r * (load_f32(w[k]) * dyr[k] - xr[k] * c);
}

template <typename G>
__global__ void rmsnorm_weight_grad_kernel(const float* __restrict__ x, const float* __restrict__ inv_rms,
                                           const float* __restrict__ dy, G* __restrict__ dw, int rows, int d) {
  const int c = static_cast<int>(blockIdx.x) * kColumnTile + static_cast<int>(threadIdx.x);
  const bool valid = c < d;
  float total[1];
  block_column_sums<1>(
      rows, valid,
      [&](int r, float(&acc)[1]) {
        const std::size_t i = static_cast<std::size_t>(r) * d + c;
        acc[0] += dy[i] * x[i] * inv_rms[r];
      },
      total);
  if (threadIdx.y == 0 && valid) dw[c] = store_f32<G>(load_f32(dw[c]) + total[0]);
}

}  // namespace

void rmsnorm_forward(cudaStream_t stream, DType param_dtype, const float* x, const void* w, float* y, float* inv_rms,
                     int rows, int d, float eps) {
  if (rows == 0) return;
  dispatch_dtype(param_dtype, [&](auto tag) {
    using P = typename decltype(tag)::type;
    rmsnorm_forward_kernel<P>
        <<<warp_rows_grid(rows), kThreads, 0, stream>>>(x, static_cast<const P*>(w), y, inv_rms, rows, d, eps);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(cudaStream_t stream, DType param_dtype, DType grad_dtype, const float* x, const void* w,
                      const float* inv_rms, const float* dy, float* dx, void* dw, int rows, int d) {
  if (rows == 0) return;
  dispatch_dtype(param_dtype, [&](auto tag) {
    using P = typename decltype(tag)::type;
    rmsnorm_dx_kernel<P>
        <<<warp_rows_grid(rows), kThreads, 0, stream>>>(x, static_cast<const P*>(w), inv_rms, dy, dx, rows, d);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
  dispatch_dtype(grad_dtype, [&](auto tag) {
    using G = typename decltype(tag)::type;
    rmsnorm_weight_grad_kernel<G>
        <<<column_tiles(d), dim3(kColumnTile, kRowLanes), 0, stream>>>(x, inv_rms, dy, static_cast<G*>(dw), rows, d);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace zero3::models::gpu
