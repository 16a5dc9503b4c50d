// accumulate on the device: dst[i] = dst[i] + alpha * src[i], dst fp32, src any dtype (read as fp32).
#pragma once

#include <cuda_runtime.h>

#include "zero3/core/buffer_view.hpp"

namespace zero3::kernels::gpu {

// Arguments already checked; non-empty views.
void launch_accumulate(cudaStream_t stream, BufferView dst, ConstBufferView src, float alpha);

}  // namespace zero3::kernels::gpu
