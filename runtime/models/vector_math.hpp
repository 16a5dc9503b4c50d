// Element-wise functions of the host models, vectorized: glibc's tanhf and expf are scalar calls per
// element (tanh through expm1f), which made GELU about a quarter of a small GPT's step and softmax and the
// cross-entropy most of the rest of its element-wise time; the bf16 rounding of a product's inputs did
// not vectorize as written. Single-threaded over the span given; callable from any thread. Results depend
// on the CPU's path (AVX-512 or scalar) but never on how a caller splits its work, as long as the split is
// fixed.
#pragma once

#include <cstddef>

#include "zero3/core/dtype.hpp"

namespace zero3::models::vmath {

// y[i] = tanh(x[i]) (x and y may be the same array). On the AVX-512 path: an odd polynomial (Taylor terms
// to x^13) for |x| < 0.5, 1 - 2 / (exp(2|x|) + 1) above, exp as exp_f32's; within 4e-7 relative of the
// exact tanh (tested against double). Elsewhere std::tanh.
void tanh_f32(const float* x, float* y, std::size_t n);

// y[i] = exp(x[i]) (x and y may be the same array). On the AVX-512 path: exp(x) = 2^k exp(r) with
// k = round(x / ln 2), r = x - k ln 2 in two parts and exp(r) from its Taylor polynomial to r^7, scaled by
// 2^k with scalef (so results below FLT_MIN come out subnormal or 0, and above FLT_MAX +Inf); within 4e-7
// relative of the exact exp where it is a normal float (tested against double); -Inf gives 0, NaN stays
// NaN. Elsewhere std::exp.
void exp_f32(const float* x, float* y, std::size_t n);

// The largest x[i] (n >= 1); -Inf for an all -Inf span. A NaN in x may or may not propagate.
float max_f32(const float* x, std::size_t n);

// y[i] = exp(x[i] - shift) as exp_f32 (x and y may be the same array), returning their sum in double,
// taken in 16 lanes (lane i % 16), lane l + 8 added onto lane l, then pairwise: a fixed order, whatever the path. For
// the softmax rows of the host attention, where a separate subtract, exp and sum pass each re-read the row.
double exp_shifted_sum_f32(const float* x, float* y, std::size_t n, float shift);

// y[i] = x[i] rounded to bf16: nearest, ties to even, overflow to Inf, NaNs kept quiet NaNs with their
// sign and top payload bits: the same bits as float_to_bf16 (zero3/core/dtype.hpp) on every path.
void round_to_bf16(const float* x, bf16_t* y, std::size_t n);

}  // namespace zero3::models::vmath
