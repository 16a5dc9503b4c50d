// The host backend's accumulate and fused optimizer steps (optim_host.cpp), called by HostKernelBackend.
// Same contracts as the KernelBackend methods of the same names: arguments are checked on the calling
// thread, the work runs on the stream's worker.
#pragma once

#include "zero3/core/buffer_view.hpp"
#include "zero3/core/stream.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::kernels::host {

void accumulate(Stream& stream, BufferView dst, ConstBufferView src, float alpha);
void adam_step(Stream& stream, const AdamArgs& args, BufferView master, BufferView exp_avg, BufferView exp_avg_sq,
               ConstBufferView grad, BufferView param);
void lion_step(Stream& stream, const LionArgs& args, BufferView master, BufferView exp_avg, ConstBufferView grad,
               BufferView param);
void adagrad_step(Stream& stream, const AdagradArgs& args, BufferView master, BufferView sum_sq, ConstBufferView grad,
                  BufferView param);

}  // namespace zero3::kernels::host
