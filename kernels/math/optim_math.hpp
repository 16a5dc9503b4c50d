// The per-element arithmetic of accumulate and the fused optimizer steps, written once and compiled by
// both backends: the host loops and the CUDA kernels call these same functions, so they perform the same
// IEEE fp32 operations in the same order. Private to kernels/; safe in .cu files (no fmt, no zero3
// headers). The coefficient structs are filled on the host, once per call (optim_coeffs.hpp).
#pragma once

#include <cmath>

#if defined(__CUDACC__)
#define ZERO3_KERNEL_FN __host__ __device__ __forceinline__
#else
#define ZERO3_KERNEL_FN inline
#endif

namespace zero3::kernels::detail {

// One correctly rounded fp32 operation each. On the device the _rn intrinsics are never fused into an
// FMA, whatever --fmad says; on the host the kernels are compiled with -ffp-contract=off for the same
// reason. sqrt is correctly rounded on both (x86 sqrtss, __fsqrt_rn).
ZERO3_KERNEL_FN float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
ZERO3_KERNEL_FN float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
ZERO3_KERNEL_FN float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
ZERO3_KERNEL_FN float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
ZERO3_KERNEL_FN float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// dst + alpha * src.
ZERO3_KERNEL_FN float accumulate_elem(float dst, float alpha, float src) {
  return add_rn(dst, mul_rn(alpha, src));
}

// Derived scalars are computed on the host, once per call, and every element (on every backend) uses
// the same fp32 values. Flags select the optional terms, as DeepSpeed's `weight_decay > 0` tests do.
struct AdamCoeffs {
  float grad_scale;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float eps;
  float weight_decay;  // added to the gradient as L2 (classic Adam) when l2 is set
  float decay;         // lr * weight_decay, decoupled (AdamW) when decoupled is set
  float step_size;     // lr / (1 - beta1^t), or lr without bias correction
  float bc2_rsqrt;     // 1 / sqrt(1 - beta2^t), or 1 without bias correction
  bool l2;
  bool decoupled;
};

struct LionCoeffs {
  float grad_scale;
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float lr;
  float after_decay;  // 1 - lr * weight_decay, applied when decay is set
  bool decay;
};

struct AdagradCoeffs {
  float grad_scale;
  float lr;
  float eps;
  float weight_decay;  // added to the gradient as L2 when l2 is set
  bool l2;
};

// DeepSpeed CPU Adam (Step_1), in its operation order. p: master weight, m/v: moments, grad: raw gradient.
ZERO3_KERNEL_FN void adam_elem(const AdamCoeffs& c, float grad, float& p, float& m, float& v) {
  float g = mul_rn(grad, c.grad_scale);
  if (c.l2) g = add_rn(g, mul_rn(c.weight_decay, p));
  m = add_rn(mul_rn(c.beta1, m), mul_rn(c.one_minus_beta1, g));
  v = add_rn(mul_rn(c.beta2, v), mul_rn(c.one_minus_beta2, mul_rn(g, g)));
  const float denom = add_rn(mul_rn(sqrt_rn(v), c.bc2_rsqrt), c.eps);
  if (c.decoupled) p = sub_rn(p, mul_rn(c.decay, p));  // decays the weight from before this step's update
  p = sub_rn(p, mul_rn(c.step_size, div_rn(m, denom)));
}

// sign(x) with sign(+-0) = +0, so a zero update leaves p's bits alone, and sign(NaN) = NaN, so a NaN in
// the gradient reaches the weight instead of vanishing.
ZERO3_KERNEL_FN float sign_of(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == 0.0f ? 0.0f : x));
}

// Lion (DeepSpeed CPU Lion / FusedLion): the update direction interpolates with beta1, the momentum
// with beta2, from the same old momentum.
ZERO3_KERNEL_FN void lion_elem(const LionCoeffs& c, float grad, float& p, float& m) {
  const float g = mul_rn(grad, c.grad_scale);
  const float direction = add_rn(mul_rn(c.beta1, m), mul_rn(c.one_minus_beta1, g));
  if (c.decay) p = mul_rn(p, c.after_decay);
  p = sub_rn(p, mul_rn(c.lr, sign_of(direction)));
  m = add_rn(mul_rn(c.beta2, m), mul_rn(c.one_minus_beta2, g));
}

// DeepSpeed CPU Adagrad: L2 decay enters the gradient, which then feeds both the sum and the update.
ZERO3_KERNEL_FN void adagrad_elem(const AdagradCoeffs& c, float grad, float& p, float& sum_sq) {
  float g = mul_rn(grad, c.grad_scale);
  if (c.l2) g = add_rn(g, mul_rn(c.weight_decay, p));
  sum_sq = add_rn(sum_sq, mul_rn(g, g));
  p = sub_rn(p, mul_rn(c.lr, div_rn(g, add_rn(sqrt_rn(sum_sq), c.eps))));
}

}  // namespace zero3::kernels::detail
