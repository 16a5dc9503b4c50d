// The GPT's host kernels. Matrix products go to host_gemm; the element-wise and per-row work runs on the host
// pool in chunks fixed by the sizes: rows for per-row work and column blocks for the column sums of parameter
// gradients, each of which adds its rows in row order, as one thread would. Per-row reductions accumulate in
// double: for float they then stay accurate at widths of thousands.
#include "gpt_ops.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "exact_resize.hpp"
#include "host_gemm.hpp"
#include "host_parallel.hpp"
#include "row_math.hpp"
#include "vector_math.hpp"
#include "zero3/core/error.hpp"

namespace zero3::models::ops {
namespace {

constexpr double kLayerNormEps = 1e-5;
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;

// Chunk sizes of the pool's loops: large enough that a chunk's work (microseconds) dwarfs handing it to
// a thread, small enough that a small GPT's 1024 rows make dozens of chunks.
constexpr Index kRowChunk = 16;
constexpr Index kElemChunk = Index{1} << 14;
// A column block's sum reads a 1 KiB run of every row (fp32): long enough for the prefetchers. A column's
// sum is the same whatever the block width (its rows are added in order either way).
constexpr Index kColChunk = 256;

// fn(r) for each row r of [0, rows), in row chunks on the pool.
template <typename Fn>
void for_rows(Index rows, const Fn& fn) {
  par::for_chunks(rows, kRowChunk, [&](Index, Index b, Index e) {
    for (Index r = b; r < e; ++r) fn(r);
  });
}

// fn(begin, end) over element ranges of [0, n) on the pool.
template <typename Fn>
void for_elems(Index n, const Fn& fn) {
  par::for_chunks(n, kElemChunk, [&](Index, Index b, Index e) { fn(b, e); });
}

// fn(begin, end) over column blocks of [0, d): each block sums over all rows itself, in row order.
template <typename Fn>
void for_cols(Index d, const Fn& fn) {
  par::for_chunks(d, kColChunk, [&](Index, Index b, Index e) { fn(b, e); });
}

// out[k] += sum over rows i of v[i * d + k], rows in order.
template <typename T>
void add_column_sums(const T* v, T* out, Index rows, Index d) {
  for_cols(d, [&](Index k0, Index k1) {
    for (Index i = 0; i < rows; ++i) {
      const T* vi = v + i * d;
      for (Index k = k0; k < k1; ++k) out[k] += vi[k];
    }
  });
}

void fill_bias_rows(const float* bias, float* y, Index rows, Index out) {
  for_rows(rows, [&](Index i) { std::copy(bias, bias + out, y + i * out); });
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, Index m, Index n, Index k, T alpha, const T* a, Index lda, const T* b, Index ldb,
          T beta, T* c, Index ldc) {
  if constexpr (std::is_same_v<T, float>) {
    gemm::gemm_f32(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    gemm::gemm_f64(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

template <typename T>
void linear_forward(const T* x, const T* w, const T* bias, T* y, Index rows, Index in, Index out) {
  if (bias != nullptr) {
    for_rows(rows, [&](Index i) { std::copy(bias, bias + out, y + i * out); });
  }
  gemm<T>(false, true, rows, out, in, T(1), x, in, w, in, bias != nullptr ? T(1) : T(0), y, out);
}

template <typename T>
void linear_backward(const T* x, const T* w, const T* dy, T* dx, bool accumulate_dx, T* dw, T* dbias, Index rows,
                     Index in, Index out) {
  if (dx != nullptr) gemm<T>(false, false, rows, in, out, T(1), dy, out, w, in, accumulate_dx ? T(1) : T(0), dx, in);
  gemm<T>(true, false, out, in, rows, T(1), dy, out, x, in, T(1), dw, in);
  if (dbias != nullptr) add_column_sums(dy, dbias, rows, out);
}

void round_to_bf16(const float* src, bf16_t* dst, Index n) {
  for_elems(n, [&](Index b, Index e) { vmath::round_to_bf16(src + b, dst + b, e - b); });
}

// At least n elements: grown (to exactly the largest size asked for), never shrunk, so a step's
// alternating sizes do not refill it each time.
void reserve_scratch(std::vector<bf16_t>& scratch, Index n) {
  if (scratch.size() < n) detail::resize_exact(scratch, n);
}

void linear_forward_bf16(const float* x, const bf16_t* w, const float* bias, float* y, Index rows, Index in, Index out,
                         std::vector<bf16_t>& x_scratch) {
  reserve_scratch(x_scratch, rows * in);
  round_to_bf16(x, x_scratch.data(), rows * in);
  if (bias != nullptr) fill_bias_rows(bias, y, rows, out);
  gemm::gemm_bf16(false, true, rows, out, in, 1.0f, x_scratch.data(), in, w, in, bias != nullptr ? 1.0f : 0.0f, y, out);
}

void linear_backward_bf16(const float* x, const bf16_t* w, const float* dy, float* dx, bool accumulate_dx, float* dw,
                          float* dbias, Index rows, Index in, Index out, std::vector<bf16_t>& x_scratch,
                          std::vector<bf16_t>& dy_scratch) {
  reserve_scratch(dy_scratch, rows * out);
  round_to_bf16(dy, dy_scratch.data(), rows * out);
  if (dx != nullptr) {
    gemm::gemm_bf16(false, false, rows, in, out, 1.0f, dy_scratch.data(), out, w, in, accumulate_dx ? 1.0f : 0.0f, dx,
                    in);
  }
  reserve_scratch(x_scratch, rows * in);
  round_to_bf16(x, x_scratch.data(), rows * in);  // the forward's rounding again: the same bits
  gemm::gemm_bf16(true, false, out, in, rows, 1.0f, dy_scratch.data(), out, x_scratch.data(), in, 1.0f, dw, in);
  if (dbias != nullptr) add_column_sums(dy, dbias, rows, out);
}

template <typename T>
void add_inplace(T* y, const T* x, Index n) {
  for_elems(n, [&](Index b, Index e) {
    for (Index i = b; i < e; ++i) y[i] += x[i];
  });
}

template <typename T>
void layernorm_forward(const T* x, const T* w, const T* b, T* y, T* stat, Index rows, Index d) {
  for_rows(rows, [&](Index i) {
    const T* xi = x + i * d;
    double sum = 0;
    for (Index k = 0; k < d; ++k) sum += xi[k];
    const double mean = sum / static_cast<double>(d);
    double sq = 0;
    for (Index k = 0; k < d; ++k) sq += (xi[k] - mean) * (xi[k] - mean);
    const double rstd = 1.0 / std::sqrt(sq / static_cast<double>(d) + kLayerNormEps);
    const T mean_t = static_cast<T>(mean);
    const T rstd_t = static_cast<T>(rstd);
    T* yi = y + i * d;
    for (Index k = 0; k < d; ++k) yi[k] = (xi[k] - mean_t) * rstd_t * w[k] + b[k];
    stat[2 * i] = mean_t;
    stat[2 * i + 1] = rstd_t;
  });
}

template <typename T>
void layernorm_backward(const T* x, const T* w, const T* stat, const T* dy, T* dx, T* dw, T* db, Index rows, Index d) {
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * w: the two means are the projections
  // out of the directions the normalization removed (shift and scale). Rows in parallel for dx, column
  // blocks for dw and db.
  for_rows(rows, [&](Index i) {
    const T mean = stat[2 * i];
    const T rstd = stat[2 * i + 1];
    const T* xi = x + i * d;
    const T* dyi = dy + i * d;
    double g_sum = 0;
    double gx_sum = 0;
    for (Index k = 0; k < d; ++k) {
      const T xhat = (xi[k] - mean) * rstd;
      const T g = dyi[k] * w[k];
      g_sum += g;
      gx_sum += g * xhat;
    }
    const T g_mean = static_cast<T>(g_sum / static_cast<double>(d));
    const T gx_mean = static_cast<T>(gx_sum / static_cast<double>(d));
    T* dxi = dx + i * d;
    for (Index k = 0; k < d; ++k) {
      const T xhat = (xi[k] - mean) * rstd;
      dxi[k] += rstd * (dyi[k] * w[k] - g_mean - xhat * gx_mean);
    }
  });
  for_cols(d, [&](Index k0, Index k1) {
    for (Index i = 0; i < rows; ++i) {
      const T mean = stat[2 * i];
      const T rstd = stat[2 * i + 1];
      const T* xi = x + i * d;
      const T* dyi = dy + i * d;
      for (Index k = k0; k < k1; ++k) {
        const T xhat = (xi[k] - mean) * rstd;
        dw[k] += dyi[k] * xhat;
        db[k] += dyi[k];
      }
    }
  });
}

// tanh(sqrt(2/pi) (x + 0.044715 x^3)) of x[b, e) into t[0, e - b); float through vmath::tanh_f32.
template <typename T>
void gelu_tanh(const T* x, T* t, Index b, Index e) {
  const T scale = static_cast<T>(kGeluScale);
  const T cubic = static_cast<T>(kGeluCubic);
  for (Index i = b; i < e; ++i) {
    const T v = x[i];
    t[i - b] = scale * (v + cubic * v * v * v);
  }
  if constexpr (std::is_same_v<T, float>) {
    vmath::tanh_f32(t, t, e - b);
  } else {
    for (Index i = 0; i < e - b; ++i) t[i] = std::tanh(t[i]);
  }
}

template <typename T>
void gelu_forward(const T* x, T* y, Index n) {
  for_elems(n, [&](Index b, Index e) {
    T* t = thread_scratch<T>(e - b);
    gelu_tanh(x, t, b, e);
    for (Index i = b; i < e; ++i) y[i] = T(0.5) * x[i] * (T(1) + t[i - b]);
  });
}

template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, Index n) {
  const T scale = static_cast<T>(kGeluScale);
  const T cubic = static_cast<T>(kGeluCubic);
  for_elems(n, [&](Index b, Index e) {
    T* tv = thread_scratch<T>(e - b);
    gelu_tanh(x, tv, b, e);
    for (Index i = b; i < e; ++i) {
      const T v = x[i];
      const T t = tv[i - b];
      const T dt = (T(1) - t * t) * scale * (T(1) + T(3) * cubic * v * v);
      dx[i] = dy[i] * (T(0.5) * (T(1) + t) + T(0.5) * v * dt);
    }
  });
}

template <typename T>
T cross_entropy_forward(const T* logits, const std::int32_t* targets, T* losses, Index rows, Index vocab) {
  std::vector<double> row_loss(rows);
  for_rows(rows, [&](Index i) {
    const T* li = logits + i * vocab;
    const T mx = *std::max_element(li, li + vocab);
    const double sum = exp_shifted(li, thread_scratch<T>(vocab), vocab, mx);
    row_loss[i] = static_cast<double>(mx) + std::log(sum) - static_cast<double>(li[targets[i]]);
    losses[i] = static_cast<T>(row_loss[i]);
  });
  double total = 0;
  for (double l : row_loss) total += l;  // in row order, whatever ran the rows
  return static_cast<T>(total);
}

template <typename T>
void cross_entropy_backward(const T* logits, const std::int32_t* targets, T* dlogits, Index rows, Index vocab,
                            T scale) {
  for_rows(rows, [&](Index i) {
    const T* li = logits + i * vocab;
    T* di = dlogits + i * vocab;
    const T mx = *std::max_element(li, li + vocab);
    const double sum = exp_shifted(li, di, vocab, mx);
    const T k = static_cast<T>(static_cast<double>(scale) / sum);
    for (Index j = 0; j < vocab; ++j) di[j] *= k;
    di[targets[i]] -= scale;
  });
}

template void gemm<float>(bool, bool, Index, Index, Index, float, const float*, Index, const float*, Index, float,
                          float*, Index);
template void gemm<double>(bool, bool, Index, Index, Index, double, const double*, Index, const double*, Index, double,
                           double*, Index);
template void add_inplace<float>(float*, const float*, Index);
template void add_inplace<double>(double*, const double*, Index);
template void linear_forward<float>(const float*, const float*, const float*, float*, Index, Index, Index);
template void linear_backward<float>(const float*, const float*, const float*, float*, bool, float*, float*, Index,
                                     Index, Index);
template void layernorm_forward<float>(const float*, const float*, const float*, float*, float*, Index, Index);
template void layernorm_backward<float>(const float*, const float*, const float*, const float*, float*, float*, float*,
                                        Index, Index);
template void gelu_forward<float>(const float*, float*, Index);
template void gelu_backward<float>(const float*, const float*, float*, Index);
template float cross_entropy_forward<float>(const float*, const std::int32_t*, float*, Index, Index);
template void cross_entropy_backward<float>(const float*, const std::int32_t*, float*, Index, Index, float);
template void linear_forward<double>(const double*, const double*, const double*, double*, Index, Index, Index);
template void linear_backward<double>(const double*, const double*, const double*, double*, bool, double*, double*,
                                      Index, Index, Index);
template void layernorm_forward<double>(const double*, const double*, const double*, double*, double*, Index, Index);
template void layernorm_backward<double>(const double*, const double*, const double*, const double*, double*, double*,
                                         double*, Index, Index);
template void gelu_forward<double>(const double*, double*, Index);
template void gelu_backward<double>(const double*, const double*, double*, Index);
template double cross_entropy_forward<double>(const double*, const std::int32_t*, double*, Index, Index);
template void cross_entropy_backward<double>(const double*, const std::int32_t*, double*, Index, Index, double);

}  // namespace zero3::models::ops
