// Element-wise transcendental functions of the host models, vectorized: glibc's tanhf is a scalar call
// per element (through expm1f), which made GELU about a quarter of a small GPT's step. Single-threaded
// over the span given; callable from any thread. Results depend on the CPU's path (AVX-512 or scalar)
// but never on how a caller splits its work, as long as the split is fixed.
#pragma once

#include <cstddef>

namespace zero3::models::vmath {

// y[i] = tanh(x[i]) (x and y may be the same array). On the AVX-512 path: an odd polynomial (Taylor terms
// to x^13) for |x| < 0.5, 1 - 2 / (exp(2|x|) + 1) above, exp from a degree-7 polynomial on the reduced
// argument; within 4e-7 relative of the exact tanh (tested against double). Elsewhere std::tanh.
void tanh_f32(const float* x, float* y, std::size_t n);

}  // namespace zero3::models::vmath
