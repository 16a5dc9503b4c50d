#include "common.cuh"
#include "scale.cuh"

namespace zero3::kernels::gpu {
namespace {

template <typename T>
__global__ void scale_kernel(T* __restrict__ x, std::size_t n, float alpha) {
  // __fmul_rn: one IEEE multiply that the compiler may not fuse, the same operation as the host's.
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] = store_f32<T>(__fmul_rn(load_f32(x[i]), alpha));
}

template <typename T>
void launch_typed(cudaStream_t stream, BufferView x, float alpha) {
  scale_kernel<T><<<grid_for(x.count), kThreads, 0, stream>>>(static_cast<T*>(x.data), x.count, alpha);
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_scale(cudaStream_t stream, BufferView x, float alpha) {
  switch (x.dtype) {
    case DType::f32:
      launch_typed<float>(stream, x, alpha);
      return;
    case DType::f16:
      launch_typed<__half>(stream, x, alpha);
      return;
    case DType::bf16:
      launch_typed<__nv_bfloat16>(stream, x, alpha);
      return;
  }
}

}  // namespace zero3::kernels::gpu
