#include "cast.cuh"
#include "common.cuh"

namespace zero3::kernels::gpu {
namespace {

template <typename D, typename S>
__global__ void cast_kernel(D* __restrict__ dst, const S* __restrict__ src, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) dst[i] = store_f32<D>(load_f32(src[i]));
}

template <typename D, typename S>
void launch_typed(cudaStream_t stream, BufferView dst, ConstBufferView src) {
  cast_kernel<D, S><<<grid_for(dst.count), kThreads, 0, stream>>>(static_cast<D*>(dst.data),
                                                                  static_cast<const S*>(src.data), dst.count);
  ZERO3_CUDA_CHECK_LAUNCH();
}

template <typename D>
void launch_to(cudaStream_t stream, BufferView dst, ConstBufferView src) {
  switch (src.dtype) {
    case DType::f32:
      launch_typed<D, float>(stream, dst, src);
      return;
    case DType::f16:
      launch_typed<D, __half>(stream, dst, src);
      return;
    case DType::bf16:
      launch_typed<D, __nv_bfloat16>(stream, dst, src);
      return;
  }
}

}  // namespace

void launch_cast(cudaStream_t stream, BufferView dst, ConstBufferView src) {
  if (dst.dtype == src.dtype) {
    // A bit copy, as on the host: NaN payloads survive. cudaMemcpyDefault covers device and pinned memory.
    if (dst.data != src.data) {
      ZERO3_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, dst.size_bytes(), cudaMemcpyDefault, stream));
    }
    return;
  }
  // bf16 <-> fp16 goes through fp32, which holds either exactly: one rounding, to the target.
  switch (dst.dtype) {
    case DType::f32:
      launch_to<float>(stream, dst, src);
      return;
    case DType::f16:
      launch_to<__half>(stream, dst, src);
      return;
    case DType::bf16:
      launch_to<__nv_bfloat16>(stream, dst, src);
      return;
  }
}

}  // namespace zero3::kernels::gpu
