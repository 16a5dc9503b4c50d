#include "device_util.cuh"
#include "layernorm.cuh"

namespace zero3::models::gpu {
namespace {

constexpr float kLayerNormEps = 1e-5f;

// One warp per row, two passes over it (mean, then the centred variance) for accuracy at any offset.
template <typename P>
__global__ void layernorm_forward_kernel(const float* __restrict__ x, const P* __restrict__ w, const P* __restrict__ b,
                                         float* __restrict__ y, float* __restrict__ stat, int rows, int d) {
  const std::size_t row = warp_row();
  if (row >= static_cast<std::size_t>(rows)) return;  // the whole warp leaves together
  const int lane = lane_id();
  const float* xr = x + row * d;
  float s = 0.0f;
  for (int k = lane; k < d; k += kWarp) s += xr[k];
  const float mean = warp_sum(s) / static_cast<float>(d);
  float sq = 0.0f;
  for (int k = lane; k < d; k += kWarp) {
    const float c = xr[k] - mean;
    sq += c * c;
  }
  const float rstd = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(d) + kLayerNormEps);
  float* yr = y + row * d;
  for (int k = lane; k < d; k += kWarp) yr[k] = (xr[k] - mean) * rstd * load_f32(w[k]) + load_f32(b[k]);
  if (lane == 0) {
    stat[2 * row] = mean;
    stat[2 * row + 1] = rstd;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * w; one warp per row.
template <typename P>
__global__ void layernorm_dx_kernel(const float* __restrict__ x, const P* __restrict__ w,
                                    const float* __restrict__ stat, const float* __restrict__ dy,
                                    float* __restrict__ dx, int rows, int d) {
  const std::size_t row = warp_row();
  if (row >= static_cast<std::size_t>(rows)) return;
  const int lane = lane_id();
  const float mean = stat[2 * row];
  const float rstd = stat[2 * row + 1];
  const float* xr = x + row * d;
  const float* dyr = dy + row * d;
  float g_sum = 0.0f;
  float gx_sum = 0.0f;
  for (int k = lane; k < d; k += kWarp) {
    const float g = dyr[k] * load_f32(w[k]);
    g_sum += g;
    gx_sum += g * (xr[k] - mean) * rstd;
  }
  const float g_mean = warp_sum(g_sum) / static_cast<float>(d);
  const float gx_mean = warp_sum(gx_sum) / static_cast<float>(d);
  float* dxr = dx + row * d;
  for (int k = lane; k < d; k += kWarp) {
    const float xhat = (xr[k] - mean) * rstd;
    dxr[k] += rstd * (dyr[k] * load_f32(w[k]) - g_mean - xhat * gx_mean);
  }
}

template <typename G>
__global__ void layernorm_param_grad_kernel(const float* __restrict__ x, const float* __restrict__ stat,
                                            const float* __restrict__ dy, G* __restrict__ dw, G* __restrict__ db,
                                            int rows, int d) {
  const int c = static_cast<int>(blockIdx.x) * kColumnTile + static_cast<int>(threadIdx.x);
  const bool valid = c < d;
  float total[2];
  block_column_sums<2>(
      rows, valid,
      [&](int r, float(&acc)[2]) {
        const std::size_t i = static_cast<std::size_t>(r) * d + c;
        const float xhat = (x[i] - stat[2 * r]) * stat[2 * r + 1];
        acc[0] += dy[i] * xhat;
        acc[1] += dy[i];
      },
      total);
  if (threadIdx.y == 0 && valid) {
    dw[c] = store_f32<G>(load_f32(dw[c]) + total[0]);
    db[c] = store_f32<G>(load_f32(db[c]) + total[1]);
  }
}

}  // namespace

void layernorm_forward(cudaStream_t stream, DType param_dtype, const float* x, const void* w, const void* b, float* y,
                       float* stat, int rows, int d) {
  if (rows == 0) return;
  dispatch_dtype(param_dtype, [&](auto tag) {
    using P = typename decltype(tag)::type;
    layernorm_forward_kernel<P><<<warp_rows_grid(rows), kThreads, 0, stream>>>(
        x, static_cast<const P*>(w), static_cast<const P*>(b), y, stat, rows, d);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(cudaStream_t stream, DType param_dtype, DType grad_dtype, const float* x, const void* w,
                        const float* stat, const float* dy, float* dx, void* dw, void* db, int rows, int d) {
  if (rows == 0) return;
  dispatch_dtype(param_dtype, [&](auto tag) {
    using P = typename decltype(tag)::type;
    layernorm_dx_kernel<P>
        <<<warp_rows_grid(rows), kThreads, 0, stream>>>(x, static_cast<const P*>(w), stat, dy, dx, rows, d);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
  dispatch_dtype(grad_dtype, [&](auto tag) {
    using G = typename decltype(tag)::type;
    layernorm_param_grad_kernel<G><<<column_tiles(d), dim3(kColumnTile, kRowLanes), 0, stream>>>(
        x, stat, dy, static_cast<G*>(dw), static_cast<G*>(db), rows, d);
  });
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace zero3::models::gpu
