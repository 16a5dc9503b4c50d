// nonfinite_check on the device: sets *flag = 1.0f when any element has an all-ones exponent (Inf/NaN).
#pragma once

#include <cuda_runtime.h>

#include "zero3/core/buffer_view.hpp"

namespace zero3::kernels::gpu {

// Arguments already checked; a non-empty x; `flag` is one fp32 element.
void launch_nonfinite_check(cudaStream_t stream, ConstBufferView x, BufferView flag);

}  // namespace zero3::kernels::gpu
