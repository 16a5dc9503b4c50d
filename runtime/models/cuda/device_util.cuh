// Device-side helpers of the GPT's CUDA kernels: dispatch from a DType to the element type, fp32 loads and
// stores of the param types (kernels/cuda_common/common.cuh), and warp, block and column reductions in a fixed
// order, so that every kernel gives the same bits on every run. Included by runtime/models/cuda/*.cu only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math_constants.h>

#include <cstddef>

#include "common.cuh"  // zero3::kernels::gpu: load_f32, store_f32, grid_for, first_index, grid_stride
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3_cuda_check.hpp"

namespace zero3::models::gpu {

using kernels::gpu::first_index;
using kernels::gpu::grid_for;
using kernels::gpu::grid_stride;
using kernels::gpu::kThreads;
using kernels::gpu::load_f32;
using kernels::gpu::store_f32;

constexpr int kWarp = 32;

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the element type of `dtype` (float, __half, __nv_bfloat16).
template <typename F>
void dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32:
      f(TypeTag<float>{});
      return;
    case DType::f16:
      f(TypeTag<__half>{});
      return;
    case DType::bf16:
      f(TypeTag<__nv_bfloat16>{});
      return;
  }
  throw UsageError("gpt cuda kernels: unknown dtype");
}

// Blocks of kThreads threads, one warp per row: the grid that covers `rows` rows.
inline unsigned int warp_rows_grid(std::size_t rows) {
  constexpr std::size_t kWarpsPerBlock = kThreads / kWarp;
  return static_cast<unsigned int>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// The row a warp of a warp_rows_grid launch owns, and the thread's lane in it.
__device__ __forceinline__ std::size_t warp_row() {
  return (static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
}
__device__ __forceinline__ int lane_id() {
  return static_cast<int>(threadIdx.x % kWarp);
}

// Butterfly reductions: every lane ends with the same value, combined in the same order on every run.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Reductions over a whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 floats of shared memory, free again when the function returns.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = lane_id();
  const int warp = static_cast<int>(threadIdx.x / kWarp);
  const int warps = static_cast<int>(blockDim.x / kWarp);
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = lane_id();
  const int warp = static_cast<int>(threadIdx.x / kWarp);
  const int warps = static_cast<int>(blockDim.x / kWarp);
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -CUDART_INF_F;
  v = warp_max(v);
  __syncthreads();
  return v;
}

// Column sums over the rows of a [rows, cols] matrix: a block of kColumnTile x kRowLanes threads owns
// kColumnTile adjacent columns (one warp reads a 128-byte run of a row); its threads stride down the rows,
// then the partial sums are added in row-lane order. Deterministic; N sums per column at once.
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 32;

inline unsigned int column_tiles(int cols) {
  return static_cast<unsigned int>((cols + kColumnTile - 1) / kColumnTile);
}

// `add(r, acc)` adds row r's terms of the thread's column into acc[0 .. N). The totals are valid in the
// threads with threadIdx.y == 0 (and valid columns); launch with dim3(kColumnTile, kRowLanes).
template <int N, typename AddRow>
__device__ void block_column_sums(int rows, bool valid_column, AddRow add, float (&total)[N]) {
  __shared__ float partial[N][kRowLanes][kColumnTile + 1];  // +1: no bank conflicts on the transposed read
  float acc[N];
  for (int n = 0; n < N; ++n) acc[n] = 0.0f;
  if (valid_column) {
    for (int r = static_cast<int>(threadIdx.y); r < rows; r += kRowLanes) add(r, acc);
  }
  for (int n = 0; n < N; ++n) partial[n][threadIdx.y][threadIdx.x] = acc[n];
  __syncthreads();
  for (int n = 0; n < N; ++n) {
    float s = 0.0f;
    if (threadIdx.y == 0) {
      for (int y = 0; y < kRowLanes; ++y) s += partial[n][y][threadIdx.x];
    }
    total[n] = s;
  }
}

}  // namespace zero3::models::gpu
