// Host kernels of the GPT: matrix products (host_gemm), LayerNorm, GELU and cross-entropy, on row-major
// arrays, for float and double, plus bf16-product variants of the linear layer for float (attention:
// flash_attention.hpp). They know nothing of units or configs: callers pass pointers and sizes. Gradients of
// params accumulate (+=); each function says what it writes and what it accumulates. Callable from any
// thread; every op runs on the host pool (host_parallel.hpp) over chunks fixed by the sizes alone, so
// its result does not depend on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zero3/core/dtype.hpp"

namespace zero3::models::ops {

using Index = std::size_t;

// Row-major C[m, n] = alpha * op(A) op(B) + beta * C, op(X) = X^T when trans_x; lda/ldb/ldc are the row
// strides of A, B and C as stored.
template <typename T>
void gemm(bool trans_a, bool trans_b, Index m, Index n, Index k, T alpha, const T* a, Index lda, const T* b, Index ldb,
          T beta, T* c, Index ldc);

// y[rows, out] = x[rows, in] w[out, in]^T + bias[out] (bias may be null).
template <typename T>
void linear_forward(const T* x, const T* w, const T* bias, T* y, Index rows, Index in, Index out);
// dx[rows, in] = dy w (skipped when dx is null; += when accumulate_dx); dw[out, in] += dy^T x;
// dbias[out] += column sums of dy (skipped when null).
template <typename T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, bool accumulate_dx, T* dw, T* dbias, Index rows,
                     Index in, Index out);

// The same with bf16 products, as autocast computes them: the weight is bf16, x and dy are rounded to
// bf16 (into the scratch vectors) before each product, products accumulate in fp32 into fp32 y, dx, dw; the bias
// and its gradient stay fp32. Requires gemm::bf16_native().
void linear_forward_bf16(const float* x, const bf16_t* w, const float* bias, float* y, Index rows, Index in, Index out,
                         std::vector<bf16_t>& x_scratch);
void linear_backward_bf16(const float* x, const bf16_t* w, const float* dy, float* dx, bool accumulate_dx, float* dw,
                          float* dbias, Index rows, Index in, Index out, std::vector<bf16_t>& x_scratch,
                          std::vector<bf16_t>& dy_scratch);
// dst[i] = src[i] rounded to the nearest bf16 (ties to even).
void round_to_bf16(const float* src, bf16_t* dst, Index n);

// y[i] += x[i].
template <typename T>
void add_inplace(T* y, const T* x, Index n);

// y = (x - mean) / sqrt(var + eps) * w + b per row of width d; stat[2 i] = mean, stat[2 i + 1] = 1/std.
template <typename T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* stat, Index rows, Index d);
// dx += dL/dx; dw += sum over rows of dy * xhat; db += sum over rows of dy.
template <typename T>
void layernorm_backward(const T* x, const T* w, const T* stat, const T* dy, T* dx, T* dw, T* db, Index rows, Index d);

// GELU, tanh approximation: y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename T>
void gelu_forward(const T* x, T* y, Index n);
// dx = dy * gelu'(x); dx may be dy.
template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, Index n);

// losses[i] = logsumexp(logits row i) - logits[i, targets[i]]; returns their sum.
template <typename T>
T cross_entropy_forward(const T* logits, const std::int32_t* targets, T* losses, Index rows, Index vocab);
// dlogits = scale * (softmax(logits) - onehot(targets)).
template <typename T>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, T* dlogits, Index rows, Index vocab, T scale);

}  // namespace zero3::models::ops
