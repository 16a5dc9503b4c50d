#include "common.cuh"
#include "fill.cuh"
#include "zero3/core/dtype.hpp"

namespace zero3::kernels::gpu {
namespace {

// Writes a bit pattern: the value is rounded once on the host with the same code as the host backend.
template <typename U>
__global__ void fill_kernel(U* __restrict__ x, std::size_t n, U bits) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) x[i] = bits;
}

template <typename U>
void launch_typed(cudaStream_t stream, BufferView x, U bits) {
  fill_kernel<U><<<grid_for(x.count), kThreads, 0, stream>>>(static_cast<U*>(x.data), x.count, bits);
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_fill(cudaStream_t stream, BufferView x, float value) {
  switch (x.dtype) {
    case DType::f32:
      launch_typed<std::uint32_t>(stream, x, float_bits(value));
      return;
    case DType::f16:
      launch_typed<std::uint16_t>(stream, x, float_to_fp16(value).bits);
      return;
    case DType::bf16:
      launch_typed<std::uint16_t>(stream, x, float_to_bf16(value).bits);
      return;
  }
}

}  // namespace zero3::kernels::gpu
