// Shared pieces of the CUDA kernels: element load/store through fp32 with round-to-nearest-even, launch
// geometry. Shared by the element-wise kernels (kernels/cuda) and the models' kernels (runtime/models/cuda);
// private to zero3's CUDA targets (zero3_cuda_common); included by .cu files only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "zero3_cuda_check.hpp"

namespace zero3::kernels::gpu {

constexpr int kThreads = 256;
// Element-wise kernels use grid-stride loops over at most this many blocks: enough to fill any current
// GPU several times over, few enough that a block always has work.
constexpr std::size_t kMaxBlocks = 4096;

inline unsigned int grid_for(std::size_t num_elems) {
  const std::size_t blocks = (num_elems + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(std::clamp<std::size_t>(blocks, 1, kMaxBlocks));
}

__device__ __forceinline__ std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

__device__ __forceinline__ float load_f32(float v) {
  return v;
}
__device__ __forceinline__ float load_f32(__half v) {
  return __half2float(v);
}
__device__ __forceinline__ float load_f32(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

// fp32 -> storage type, round to nearest even; the _rn intrinsics keep Inf an Inf and NaN a NaN and
// round like zero3/core/dtype.hpp, so a finite result is bit-identical to the host backend's.
template <typename T>
__device__ __forceinline__ T store_f32(float v);
template <>
__device__ __forceinline__ float store_f32<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half store_f32<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 store_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace zero3::kernels::gpu
