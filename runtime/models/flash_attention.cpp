// Tiled causal attention on the host. Each task first copies the (sequence, head)'s rows it reads out of the
// packed qkv layout into contiguous per-thread arrays (head_dim apart): read in place, every tile row sits 3 d
// apart and the small products spent most of their time in TLB misses and in the BLAS's own packing. Forward
// runs one pool chunk per (sequence, head, block of query tiles); backward one per (sequence, head), walking
// key tiles outside and query tiles inside (FlashAttention-2's order), so dK and dV of a key tile are finished
// in one pass and dQ adds its key tiles in key order: every sum has one fixed order, with no atomics and no
// per-thread partials.
#include "flash_attention.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "host_gemm.hpp"
#include "host_parallel.hpp"
#include "row_math.hpp"
#include "vector_math.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"

namespace zero3::models::ops {
namespace {

// Query tiles per forward task: enough work to repay copying the keys and values the block sees.
constexpr Index kForwardTilesPerTask = 8;

void gemm_tile(bool ta, bool tb, Index m, Index n, Index k, float alpha, const float* a, Index lda, const float* b,
               Index ldb, float beta, float* c, Index ldc) {
  gemm::gemm_f32_serial(gemm::Backend::openblas, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm_tile(bool ta, bool tb, Index m, Index n, Index k, double alpha, const double* a, Index lda, const double* b,
               Index ldb, double beta, double* c, Index ldc) {
  gemm::gemm_f64(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_tile(bool ta, bool tb, Index m, Index n, Index k, float alpha, const bf16_t* a, Index lda, const bf16_t* b,
               Index ldb, float beta, float* c, Index ldc) {
  gemm::gemm_bf16_serial(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// x as a product's operand O: x itself when O is T, else rounded to bf16 into `rounded`.
template <typename O, typename T>
const O* operand(const T* x, Index n, O* rounded) {
  if constexpr (std::is_same_v<O, T>) {
    return x;
  } else {
    vmath::round_to_bf16(x, rounded, n);
    return rounded;
  }
}

template <typename T>
T row_max(const T* row, Index n) {
  if constexpr (std::is_same_v<T, float>) {
    return vmath::max_f32(row, n);
  } else {
    return *std::max_element(row, row + n);
  }
}

// Keys of the tile starting at c0 that query t may see: those <= t.
Index visible_keys(Index t, Index c0, Index cols) {
  return t < c0 ? 0 : std::min(cols, t - c0 + 1);
}

// Rows [first, first + rows) of one head's slice (head_dim wide, row stride ld) into dst, contiguous, as O.
template <typename T, typename O>
void copy_rows(const T* src, Index ld, Index first, Index rows, Index head_dim, O* dst) {
  for (Index t = 0; t < rows; ++t) {
    const T* row = src + (first + t) * ld;
    if constexpr (std::is_same_v<O, T>) {
      std::copy_n(row, head_dim, dst + t * head_dim);
    } else {
      vmath::round_to_bf16(row, dst + t * head_dim, head_dim);
    }
  }
}

// One (sequence, head)'s pointers into the packed layout.
template <typename T>
struct HeadView {
  const T* q;
  const T* k;
  const T* v;
  Index ld;  // row stride of q, k, v: 3 d
};

template <typename T>
HeadView<T> head_view(const T* qkv, Index s, Index h, Index len, Index d, Index head_dim) {
  const T* q = qkv + s * len * 3 * d + h * head_dim;
  return {q, q + d, q + 2 * d, 3 * d};
}

// The forward of one query tile [r0, r0 + rows) over contiguous q (its own rows), k and v (rows from 0): the
// online softmax over the key tiles up to the diagonal.
template <typename T, typename O>
void forward_tile(const O* q, const O* k, const O* v, T* out, Index ld_out, T* lse, Index r0, Index rows,
                  Index head_dim, T scale) {
  T* score = thread_scratch<T, 1>(kAttentionTile * kAttentionKeyTile);
  O* score_operand = thread_scratch<O, 12>(kAttentionTile * kAttentionKeyTile);
  T* acc = thread_scratch<T, 2>(kAttentionTile * head_dim);
  T* running_max = thread_scratch<T, 3>(kAttentionTile);
  double* denom = thread_scratch<double, 4>(kAttentionTile);
  std::fill(acc, acc + rows * head_dim, T(0));
  std::fill(running_max, running_max + rows, -std::numeric_limits<T>::infinity());
  std::fill(denom, denom + rows, 0.0);
  const Index end = r0 + rows;
  for (Index c0 = 0; c0 < end; c0 += kAttentionKeyTile) {
    const Index cols = std::min(kAttentionKeyTile, end - c0);
    gemm_tile(false, true, rows, cols, head_dim, scale, q, head_dim, k + c0 * head_dim, head_dim, T(0), score, cols);
    for (Index i = 0; i < rows; ++i) {
      T* row = score + i * cols;
      const Index seen = visible_keys(r0 + i, c0, cols);
      if (seen == 0) {
        std::fill(row, row + cols, T(0));
        continue;
      }
      const T new_max = std::max(running_max[i], row_max(row, seen));
      const double sum = exp_shifted(row, row, seen, new_max);
      std::fill(row + seen, row + cols, T(0));
      if (running_max[i] != new_max && denom[i] != 0.0) {
        // The running max rose: rescale what the earlier key tiles added.
        const T shrink = std::exp(running_max[i] - new_max);
        denom[i] *= static_cast<double>(shrink);
        for (Index j = 0; j < head_dim; ++j) acc[i * head_dim + j] *= shrink;
      }
      running_max[i] = new_max;
      denom[i] += sum;
    }
    gemm_tile(false, false, rows, head_dim, cols, T(1), operand(score, rows * cols, score_operand), cols,
              v + c0 * head_dim, head_dim, T(1), acc, head_dim);
  }
  for (Index i = 0; i < rows; ++i) {
    const T inv = static_cast<T>(1.0 / denom[i]);
    T* o = out + (r0 + i) * ld_out;
    for (Index j = 0; j < head_dim; ++j) o[j] = acc[i * head_dim + j] * inv;
    lse[r0 + i] = running_max[i] + static_cast<T>(std::log(denom[i]));
  }
}

// The probabilities of a (query tile, key tile) pair from the saved log-sum-exp, zero where masked; q and k
// contiguous from row 0.
template <typename T, typename O>
void recompute_probabilities(const O* q, const O* k, const T* lse, T* prob, Index r0, Index rows, Index c0, Index cols,
                             Index head_dim, T scale) {
  gemm_tile(false, true, rows, cols, head_dim, scale, q + r0 * head_dim, head_dim, k + c0 * head_dim, head_dim, T(0),
            prob, cols);
  for (Index i = 0; i < rows; ++i) {
    T* row = prob + i * cols;
    const Index seen = visible_keys(r0 + i, c0, cols);
    exp_shifted(row, row, seen, lse[r0 + i]);
    std::fill(row + seen, row + cols, T(0));
  }
}

// One (sequence, head)'s backward over contiguous copies: q, k, v, dout [len, head_dim]; delta [len]; dq, dk,
// dv [len, head_dim], written (not accumulated).
template <typename T, typename O>
void backward_head(const O* q, const O* k, const O* v, const O* dout, const T* delta, const T* lse, T* dq, T* dk, T* dv,
                   Index len, Index head_dim, T scale) {
  std::fill(dq, dq + len * head_dim, T(0));
  std::fill(dk, dk + len * head_dim, T(0));
  std::fill(dv, dv + len * head_dim, T(0));
  T* prob = thread_scratch<T, 1>(kAttentionTile * kAttentionKeyTile);
  T* dprob = thread_scratch<T, 2>(kAttentionTile * kAttentionKeyTile);
  O* prob_operand = thread_scratch<O, 12>(kAttentionTile * kAttentionKeyTile);
  O* dprob_operand = thread_scratch<O, 13>(kAttentionTile * kAttentionKeyTile);
  for (Index c0 = 0; c0 < len; c0 += kAttentionKeyTile) {
    const Index cols = std::min(kAttentionKeyTile, len - c0);
    // The first query tile with a row that sees key c0.
    for (Index r0 = c0 - c0 % kAttentionTile; r0 < len; r0 += kAttentionTile) {
      const Index rows = std::min(kAttentionTile, len - r0);
      recompute_probabilities(q, k, lse, prob, r0, rows, c0, cols, head_dim, scale);
      // dV += P^T dO; dP = dO V^T; dS = P (dP - delta) in place; dQ += scale dS K; dK += scale dS^T Q.
      const O* dout_tile = dout + r0 * head_dim;
      gemm_tile(true, false, cols, head_dim, rows, T(1), operand(prob, rows * cols, prob_operand), cols, dout_tile,
                head_dim, T(1), dv + c0 * head_dim, head_dim);
      gemm_tile(false, true, rows, cols, head_dim, T(1), dout_tile, head_dim, v + c0 * head_dim, head_dim, T(0), dprob,
                cols);
      for (Index i = 0; i < rows; ++i) {
        const T di = delta[r0 + i];
        const Index seen = visible_keys(r0 + i, c0, cols);
        T* ds = dprob + i * cols;
        const T* p = prob + i * cols;
        for (Index j = 0; j < seen; ++j) ds[j] = p[j] * (ds[j] - di);
        std::fill(ds + seen, ds + cols, T(0));
      }
      const O* ds = operand(dprob, rows * cols, dprob_operand);
      gemm_tile(false, false, rows, head_dim, cols, scale, ds, cols, k + c0 * head_dim, head_dim, T(1),
                dq + r0 * head_dim, head_dim);
      gemm_tile(true, false, cols, head_dim, rows, scale, ds, cols, q + r0 * head_dim, head_dim, T(1),
                dk + c0 * head_dim, head_dim);
    }
  }
}

template <typename T, typename O>
void forward(const T* qkv, T* lse, T* att, Index batch, Index len, Index heads, Index head_dim) {
  const Index d = heads * head_dim;
  const T scale = T(1) / std::sqrt(static_cast<T>(head_dim));
  const Index block_rows = kForwardTilesPerTask * kAttentionTile;
  const Index blocks = par::num_chunks(len, block_rows);
  par::for_chunks(batch * heads * blocks, 1, [&](Index task, Index, Index) {
    const Index sh = task / blocks;
    const Index s = sh / heads;
    const Index h = sh % heads;
    const Index first = (task % blocks) * block_rows;
    const Index end = std::min(len, first + block_rows);
    const HeadView<T> x = head_view(qkv, s, h, len, d, head_dim);
    O* q = thread_scratch<O, 5>((end - first) * head_dim);
    O* k = thread_scratch<O, 6>(end * head_dim);
    O* v = thread_scratch<O, 7>(end * head_dim);
    copy_rows(x.q, x.ld, first, end - first, head_dim, q);
    copy_rows(x.k, x.ld, 0, end, head_dim, k);
    copy_rows(x.v, x.ld, 0, end, head_dim, v);
    for (Index r0 = first; r0 < end; r0 += kAttentionTile) {
      forward_tile(q + (r0 - first) * head_dim, k, v, att + s * len * d + h * head_dim, d, lse + sh * len, r0,
                   std::min(kAttentionTile, end - r0), head_dim, scale);
    }
  });
}

template <typename T, typename O>
void backward(const T* qkv, const T* att, const T* lse, const T* datt, T* dqkv, Index batch, Index len, Index heads,
              Index head_dim) {
  const Index d = heads * head_dim;
  const T scale = T(1) / std::sqrt(static_cast<T>(head_dim));
  par::for_chunks(batch * heads, 1, [&](Index sh, Index, Index) {
    const Index s = sh / heads;
    const Index h = sh % heads;
    const HeadView<T> x = head_view(qkv, s, h, len, d, head_dim);
    const Index n = len * head_dim;
    O* q = thread_scratch<O, 5>(n);
    O* k = thread_scratch<O, 6>(n);
    O* v = thread_scratch<O, 7>(n);
    O* dout = thread_scratch<O, 8>(n);
    T* dq = thread_scratch<T, 9>(n);
    T* dk = thread_scratch<T, 10>(n);
    T* dv = thread_scratch<T, 11>(n);
    T* delta = thread_scratch<T, 3>(len);
    copy_rows(x.q, x.ld, 0, len, head_dim, q);
    copy_rows(x.k, x.ld, 0, len, head_dim, k);
    copy_rows(x.v, x.ld, 0, len, head_dim, v);
    const T* o = att + s * len * d + h * head_dim;
    const T* datt_head = datt + s * len * d + h * head_dim;
    copy_rows(datt_head, d, 0, len, head_dim, dout);
    // delta[t] = dO[t] . O[t]: the softmax backward's row term, sum_j P dP.
    for (Index t = 0; t < len; ++t) {
      double dot = 0;
      for (Index j = 0; j < head_dim; ++j) dot += static_cast<double>(datt_head[t * d + j]) * o[t * d + j];
      delta[t] = static_cast<T>(dot);
    }
    backward_head(q, k, v, dout, delta, lse + sh * len, dq, dk, dv, len, head_dim, scale);
    T* out = dqkv + s * len * 3 * d + h * head_dim;
    for (Index t = 0; t < len; ++t) {
      std::copy_n(dq + t * head_dim, head_dim, out + t * x.ld);
      std::copy_n(dk + t * head_dim, head_dim, out + t * x.ld + d);
      std::copy_n(dv + t * head_dim, head_dim, out + t * x.ld + 2 * d);
    }
  });
}

void require_bf16_dot_products(bool bf16_products, const char* what) {
  if (bf16_products && !gemm::bf16_native()) {
    throw UsageError(fmt::format("{}: bf16 products need a CPU with bf16 dot products (gemm::bf16_native())", what));
  }
}

}  // namespace

template <>
void flash_attention_forward(const float* qkv, float* lse, float* att, Index batch, Index len, Index heads,
                             Index head_dim, bool bf16_products) {
  require_bf16_dot_products(bf16_products, "flash_attention_forward");
  if (bf16_products) {
    forward<float, bf16_t>(qkv, lse, att, batch, len, heads, head_dim);
  } else {
    forward<float, float>(qkv, lse, att, batch, len, heads, head_dim);
  }
}

template <>
void flash_attention_forward(const double* qkv, double* lse, double* att, Index batch, Index len, Index heads,
                             Index head_dim, bool bf16_products) {
  if (bf16_products) throw UsageError("flash_attention_forward: bf16 products are for float models only");
  forward<double, double>(qkv, lse, att, batch, len, heads, head_dim);
}

template <>
void flash_attention_backward(const float* qkv, const float* att, const float* lse, const float* datt, float* dqkv,
                              Index batch, Index len, Index heads, Index head_dim, bool bf16_products) {
  require_bf16_dot_products(bf16_products, "flash_attention_backward");
  if (bf16_products) {
    backward<float, bf16_t>(qkv, att, lse, datt, dqkv, batch, len, heads, head_dim);
  } else {
    backward<float, float>(qkv, att, lse, datt, dqkv, batch, len, heads, head_dim);
  }
}

template <>
void flash_attention_backward(const double* qkv, const double* att, const double* lse, const double* datt, double* dqkv,
                              Index batch, Index len, Index heads, Index head_dim, bool bf16_products) {
  if (bf16_products) throw UsageError("flash_attention_backward: bf16 products are for float models only");
  backward<double, double>(qkv, att, lse, datt, dqkv, batch, len, heads, head_dim);
}

}  // namespace zero3::models::ops
