#include "common.cuh"
#include "nonfinite.cuh"

namespace zero3::kernels::gpu {
namespace {

// Inf and NaN are the patterns whose exponent bits are all ones; testing bits needs no conversion and
// cannot be changed by any floating-point mode.
template <typename U, U kExponentMask>
__global__ void nonfinite_kernel(const U* __restrict__ x, std::size_t n, float* flag) {
  int found = 0;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) found |= (x[i] & kExponentMask) == kExponentMask;
  // Every writer stores the same 1.0f, so the race between blocks cannot change the result.
  if (__syncthreads_or(found) && threadIdx.x == 0) *flag = 1.0f;
}

template <typename U, U kExponentMask>
void launch_typed(cudaStream_t stream, ConstBufferView x, BufferView flag) {
  nonfinite_kernel<U, kExponentMask>
      <<<grid_for(x.count), kThreads, 0, stream>>>(static_cast<const U*>(x.data), x.count, flag.as<float>());
  ZERO3_CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_nonfinite_check(cudaStream_t stream, ConstBufferView x, BufferView flag) {
  switch (x.dtype) {
    case DType::f32:
      launch_typed<std::uint32_t, 0x7f800000u>(stream, x, flag);
      return;
    case DType::f16:
      launch_typed<std::uint16_t, 0x7c00u>(stream, x, flag);
      return;
    case DType::bf16:
      launch_typed<std::uint16_t, 0x7f80u>(stream, x, flag);
      return;
  }
}

}  // namespace zero3::kernels::gpu
