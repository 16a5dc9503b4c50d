// fill on the device: x[i] = value rounded to x's dtype (rounded once, on the host, with dtype.hpp).
#pragma once

#include <cuda_runtime.h>

#include "zero3/core/buffer_view.hpp"

namespace zero3::kernels::gpu {

// Arguments already checked; a non-empty view.
void launch_fill(cudaStream_t stream, BufferView x, float value);

}  // namespace zero3::kernels::gpu
