// adam_step on the device: one grid-stride pass of detail::adam_elem (optim_math.hpp) per element.
#pragma once

#include <cuda_runtime.h>

#include "optim_math.hpp"
#include "zero3/core/buffer_view.hpp"

namespace zero3::kernels::gpu {

// Arguments already checked; non-empty master, state and grad views; param empty or of the same count.
void launch_adam(cudaStream_t stream, const detail::AdamCoeffs& c, BufferView master, BufferView exp_avg,
                 BufferView exp_avg_sq, ConstBufferView grad, BufferView param);

}  // namespace zero3::kernels::gpu
