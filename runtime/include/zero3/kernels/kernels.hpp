// The element-wise work the engine does on a device: casts, scale, sum of squares, non-finite check,
// fill. Each op has a host implementation (also the test oracle) and a CUDA one; the device dispatches.
// All ops are non-blocking: they are enqueued on `stream` and read/write the views in stream order.
// Views must live in memory the stream's device can access (device memory, or pinned host on cuda).
#pragma once

#include "zero3/core/buffer_view.hpp"
#include "zero3/device/device.hpp"

namespace zero3::kernels {

class KernelBackend {
 public:
  virtual ~KernelBackend() = default;
  // dst[i] = src[i] converted (round to nearest even, NaN/Inf preserved). Counts must match.
  virtual void cast(Stream& stream, BufferView dst, ConstBufferView src) const = 0;
  // x[i] = x[i] * alpha, computed in fp32 and rounded to x's dtype.
  virtual void scale(Stream& stream, BufferView x, float alpha) const = 0;
  // out (one fp32 element) = sum of x[i]^2 (or out + that sum when `accumulate`). Accumulation is in
  // fp32 or wider, in a fixed order: the result is the same on every run.
  virtual void sum_squares(Stream& stream, ConstBufferView x, BufferView out, bool accumulate) const = 0;
  // flag (one fp32 element) is set to 1.0 when any x[i] is Inf or NaN, and left unchanged otherwise,
  // so one flag can collect many tensors (clear it with fill).
  virtual void nonfinite_check(Stream& stream, ConstBufferView x, BufferView flag) const = 0;
  // x[i] = value rounded to x's dtype.
  virtual void fill(Stream& stream, BufferView x, float value) const = 0;
};

// The backends. cuda_backend() throws Error when built without CUDA.
const KernelBackend& host_backend();
const KernelBackend& cuda_backend();

// Dispatch through the stream's device.
inline void cast(Stream& s, BufferView dst, ConstBufferView src) {
  s.device().kernels().cast(s, dst, src);
}
inline void scale(Stream& s, BufferView x, float alpha) {
  s.device().kernels().scale(s, x, alpha);
}
inline void sum_squares(Stream& s, ConstBufferView x, BufferView out, bool accumulate) {
  s.device().kernels().sum_squares(s, x, out, accumulate);
}
inline void nonfinite_check(Stream& s, ConstBufferView x, BufferView flag) {
  s.device().kernels().nonfinite_check(s, x, flag);
}
inline void fill(Stream& s, BufferView x, float value) {
  s.device().kernels().fill(s, x, value);
}

}  // namespace zero3::kernels
