// cast on the device: dst[i] = src[i] converted through fp32, round to nearest even.
#pragma once

#include <cuda_runtime.h>

#include "zero3/core/buffer_view.hpp"

namespace zero3::kernels::gpu {

// Arguments already checked (kernel_checks.hpp); non-empty views. Same dtypes: a stream-ordered copy.
void launch_cast(cudaStream_t stream, BufferView dst, ConstBufferView src);

}  // namespace zero3::kernels::gpu
