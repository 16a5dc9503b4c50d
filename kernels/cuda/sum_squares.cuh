// sum_squares on the device: a fixed-shape two-pass reduction in double (per-block partials, then one
// block that adds them in a fixed order), so a given input gives the same fp32 result on every run.
#pragma once

#include <cuda_runtime.h>

#include "zero3/core/buffer_view.hpp"

namespace zero3::kernels::gpu {

// Arguments already checked; `out` is one fp32 element; x may be empty.
void launch_sum_squares(cudaStream_t stream, ConstBufferView x, BufferView out, bool accumulate);

}  // namespace zero3::kernels::gpu
