// The element-wise work the engine does on a device: casts, scale, sum of squares, non-finite check,
// fill. Each op has a host implementation (also the test oracle) and a CUDA one; the device dispatches.
// All ops are non-blocking: they are enqueued on `stream` and read/write the views in stream order.
// Views must live in memory the stream's device can access (device memory, or pinned host on cuda).
#pragma once

#include <cstdint>

#include "zero3/core/buffer_view.hpp"
#include "zero3/core/dtype.hpp"
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

// The storage of a fused optimizer step: the master weights in `master`, every optimizer state (Adam's
// exp_avg and exp_avg_sq, Lion's exp_avg, Adagrad's sum of squares) in `state`. Four combinations:
//   master fp32, state fp32: mixed precision as usual;
//   master bf16, state fp32: DeepSpeed's bf16.bf16_master_weights_and_grads alone;
//   master bf16, state bf16: with bf16.bf16_optimizer_states as well;
//   master fp16, state fp32: DeepSpeed's fp16.fp16_master_weights_and_grads (its CPU Adam keeps the
//                            moments in fp32 for fp16 params).
// bf16 state requires a bf16 master, as DeepSpeed's bf16_optimizer_states requires bf16_master_weights_and_grads:
// a state narrower than the weights it updates saves little next to them and costs the moments their
// precision. fp16 state is never allowed: exp_avg_sq holds squared gradients, which leave fp16's range.
//
// The rounding rule of every combination, on every backend: each stored element is loaded and widened to
// fp32 (exactly), the update is computed in fp32 exactly as with fp32 storage (optim_math.hpp: the same
// operations in the same order, no FMA contraction), and each result is rounded once to its storage dtype,
// to nearest with ties to even (zero3/core/dtype.hpp's float_to_bf16 / float_to_fp16: Inf stays Inf,
// overflow goes to Inf, NaN stays NaN). With fp32 storage nothing is rounded: the results are those of
// the fp32-only kernels bit for bit. The low-precision param copy is the new master as stored (already
// rounded to the master's dtype) converted to the param's dtype, so param == cast(master) after every step.
constexpr bool optimizer_storage_supported(DType master, DType state) {
  if (state == DType::f32) return master == DType::f32 || master == DType::bf16 || master == DType::f16;
  return state == DType::bf16 && master == DType::bf16;
}

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

  // ---- fused optimizer steps: one pass per element reads the gradient (any dtype, read as fp32), scales
  // it by args.grad_scale (unscale and clip folded in), updates the master weights and the optimizer state
  // in place, and writes the new low-precision copy of the weights into `param` (skipped when param is
  // empty, or converted to param's dtype otherwise). All views have the same count. Master and state may
  // be 16-bit: each view's dtype says how it is stored; every state view has one dtype, and the pair
  // (master.dtype, state dtype) must satisfy optimizer_storage_supported (above, with the rounding rule).
  // Formulas are DeepSpeed's CPU optimizers' (csrc/adam/cpu_adam_impl.cpp, csrc/lion/cpu_lion_impl.cpp,
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
