// The element-wise work the engine does on a device: casts, scale, sum of squares, non-finite check,
// fill. Each op has a host implementation (also the test oracle) and a CUDA one; the device dispatches.
// All ops are non-blocking: they are enqueued on `stream` and read/write the views in stream order.
// Views must live in memory the stream's device can access (device memory, or pinned host on cuda).
#pragma once

#include <cstdint>

#include "zero3/core/buffer_view.hpp"
#include "zero3/core/stream.hpp"

namespace zero3::kernels {

// Arguments of the fused optimizer kernels. lr already includes the param group's lr multiplier, and
// weight_decay is 0 for params that take no decay. grad_scale multiplies the raw accumulated gradient
// before use: 1 / (loss_scale * clip_coefficient).
struct AdamArgs {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw = true;  // decoupled decay (AdamW) vs L2 added to the gradient (classic Adam)
  bool bias_correction = true;
  std::int64_t step = 1;  // 1-based count of applied steps of this param, for bias correction
  float grad_scale = 1.0f;
};
struct LionArgs {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
};
struct AdagradArgs {
  float lr = 1e-2f;
  float eps = 1e-10f;
  float weight_decay = 0.0f;  // L2 added to the gradient, as DeepSpeed's CPU Adagrad
  float grad_scale = 1.0f;
};

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
  // dst[i] = dst[i] + alpha * src[i]; dst is fp32, src any dtype (read as fp32). The gradient
  // accumulator's update after each reduce-scatter.
  virtual void accumulate(Stream& stream, BufferView dst, ConstBufferView src, float alpha) const = 0;

  // ---- fused optimizer steps: one pass per element reads the fp32 gradient, scales it by
  // args.grad_scale (unscale and clip folded in), updates the fp32 master weights and the optimizer state
  // in place, and writes the new low-precision copy of the weights into `param` (skipped when param is
  // empty, or converted to param's dtype otherwise). All views have the same count; master and state are
  // fp32. Formulas are DeepSpeed's CPU optimizers' (csrc/adam/cpu_adam_impl.cpp, csrc/lion/cpu_lion_impl.cpp,
  // csrc/adagrad/cpu_adagrad.cpp in the DeepSpeed repository) and are spelled out in docs/kernels.md.
  virtual void adam_step(Stream& stream, const AdamArgs& args, BufferView master, BufferView exp_avg,
                         BufferView exp_avg_sq, ConstBufferView grad, BufferView param) const = 0;
  virtual void lion_step(Stream& stream, const LionArgs& args, BufferView master, BufferView exp_avg,
                         ConstBufferView grad, BufferView param) const = 0;
  virtual void adagrad_step(Stream& stream, const AdagradArgs& args, BufferView master, BufferView sum_sq,
                            ConstBufferView grad, BufferView param) const = 0;
};

// The backends. cuda_backend() throws Error when built without CUDA.
const KernelBackend& host_backend();
const KernelBackend& cuda_backend();

// Dispatch to the kernels of the stream's device.
inline void cast(Stream& s, BufferView dst, ConstBufferView src) {
  s.kernels().cast(s, dst, src);
}
inline void scale(Stream& s, BufferView x, float alpha) {
  s.kernels().scale(s, x, alpha);
}
inline void sum_squares(Stream& s, ConstBufferView x, BufferView out, bool accumulate) {
  s.kernels().sum_squares(s, x, out, accumulate);
}
inline void nonfinite_check(Stream& s, ConstBufferView x, BufferView flag) {
  s.kernels().nonfinite_check(s, x, flag);
}
inline void fill(Stream& s, BufferView x, float value) {
  s.kernels().fill(s, x, value);
}

}  // namespace zero3::kernels
