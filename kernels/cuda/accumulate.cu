#include "accumulate.cuh"
#include "optim_common.cuh"
#include "optim_math.hpp"

namespace zero3::kernels::gpu {
namespace {

// No __restrict__: dst and src may be the same fp32 view (each element is read before it is written).
template <typename S>
__global__ void accumulate_kernel(float* dst, const S* src, std::size_t n, float alpha) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    dst[i] = detail::accumulate_elem(dst[i], alpha, load_f32(src[i]));
  }
}

}  // namespace

void launch_accumulate(cudaStream_t stream, BufferView dst, ConstBufferView src, float alpha) {
  with_device_type(src.dtype, [&](auto src_tag) {
    using S = typename decltype(src_tag)::type;
    accumulate_kernel<S><<<grid_for(dst.count), kThreads, 0, stream>>>(
        static_cast<float*>(dst.data), static_cast<const S*>(src.data), dst.count, alpha);
    ZERO3_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace zero3::kernels::gpu
