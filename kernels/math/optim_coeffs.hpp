// Turns the optimizer argument structs into the fp32 coefficients of optim_math.hpp, on the host, once
// per call. Both backends call these, so the host loop and the CUDA kernel multiply by the same floats.
// Private to kernels/; host compilers only (it includes the public kernels.hpp).
#pragma once

#include <cmath>

#include "optim_math.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::kernels::detail {

inline AdamCoeffs adam_coeffs(const AdamArgs& a) {
  AdamCoeffs c{};
  c.grad_scale = a.grad_scale;
  c.beta1 = a.beta1;
  c.one_minus_beta1 = 1.0f - a.beta1;  // in fp32, as DeepSpeed's betta1_minus1
  c.beta2 = a.beta2;
  c.one_minus_beta2 = 1.0f - a.beta2;
  c.eps = a.eps;
  c.weight_decay = a.weight_decay;
  c.l2 = a.weight_decay > 0.0f && !a.adamw;
  c.decoupled = a.weight_decay > 0.0f && a.adamw;
  c.decay = static_cast<float>(static_cast<double>(a.lr) * a.weight_decay);
  // beta^t in double: pow in fp32 would lose most of 1 - beta2^t's digits at small t (1 - 0.999^1 keeps
  // only ~14 of 24 bits). Each term is rounded to fp32 once, here.
  double step_size = a.lr;
  double bc2_rsqrt = 1.0;
  if (a.bias_correction) {
    const double t = static_cast<double>(a.step);
    step_size = a.lr / (1.0 - std::pow(static_cast<double>(a.beta1), t));
    bc2_rsqrt = 1.0 / std::sqrt(1.0 - std::pow(static_cast<double>(a.beta2), t));
  }
  c.step_size = static_cast<float>(step_size);
  c.bc2_rsqrt = static_cast<float>(bc2_rsqrt);
  return c;
}

inline LionCoeffs lion_coeffs(const LionArgs& a) {
  LionCoeffs c{};
  c.grad_scale = a.grad_scale;
  c.beta1 = a.beta1;
  c.one_minus_beta1 = 1.0f - a.beta1;
  c.beta2 = a.beta2;
  c.one_minus_beta2 = 1.0f - a.beta2;
  c.lr = a.lr;
  c.decay = a.weight_decay > 0.0f;
  c.after_decay = static_cast<float>(1.0 - static_cast<double>(a.lr) * a.weight_decay);
  return c;
}

inline AdagradCoeffs adagrad_coeffs(const AdagradArgs& a) {
  AdagradCoeffs c{};
  c.grad_scale = a.grad_scale;
  c.lr = a.lr;
  c.eps = a.eps;
  c.weight_decay = a.weight_decay;
  c.l2 = a.weight_decay > 0.0f;
  return c;
}

}  // namespace zero3::kernels::detail
