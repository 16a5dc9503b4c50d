// scale on the device: x[i] = x[i] * alpha in fp32, rounded back to x's dtype.
#pragma once

#include <cuda_runtime.h>

#include "zero3/core/buffer_view.hpp"

namespace zero3::kernels::gpu {

// Arguments already checked; a non-empty view.
void launch_scale(cudaStream_t stream, BufferView x, float alpha);

}  // namespace zero3::kernels::gpu
