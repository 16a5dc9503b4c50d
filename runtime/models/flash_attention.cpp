// Tiled causal attention on the host. Forward runs one pool chunk per (sequence, head, query tile); backward one
// per (sequence, head), walking key tiles outside and query tiles inside (FlashAttention-2's order), so dK and
// dV of a key tile are finished in one pass and dQ adds its key tiles in key order: every sum has one fixed
// order, with no atomics and no per-thread partials.
#include "flash_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "host_gemm.hpp"
#include "host_parallel.hpp"
#include "row_math.hpp"

namespace zero3::models::ops {
namespace {

void gemm_tile(bool ta, bool tb, Index m, Index n, Index k, float alpha, const float* a, Index lda, const float* b,
               Index ldb, float beta, float* c, Index ldc) {
  gemm::gemm_f32_serial(gemm::Backend::openblas, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void gemm_tile(bool ta, bool tb, Index m, Index n, Index k, double alpha, const double* a, Index lda, const double* b,
               Index ldb, double beta, double* c, Index ldc) {
  gemm::gemm_f64(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Keys of the tile starting at c0 that query t may see: those <= t.
Index visible_keys(Index t, Index c0, Index cols) {
  return t < c0 ? 0 : std::min(cols, t - c0 + 1);
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

// The forward of one query tile [r0, r0 + rows): the online softmax over the key tiles up to the diagonal.
template <typename T>
void forward_tile(const HeadView<T>& x, T* out, Index ld_out, T* lse, Index r0, Index rows, Index len, Index head_dim,
                  T scale) {
  T* score = thread_scratch<T, 1>(kAttentionTile * kAttentionTile);
  T* acc = thread_scratch<T, 2>(kAttentionTile * head_dim);
  T* row_max = thread_scratch<T, 3>(kAttentionTile);
  double* denom = thread_scratch<double, 4>(kAttentionTile);
  std::fill(acc, acc + rows * head_dim, T(0));
  std::fill(row_max, row_max + rows, -std::numeric_limits<T>::infinity());
  std::fill(denom, denom + rows, 0.0);
  for (Index c0 = 0; c0 < r0 + rows; c0 += kAttentionTile) {
    const Index cols = std::min(kAttentionTile, len - c0);
    gemm_tile(false, true, rows, cols, head_dim, scale, x.q + r0 * x.ld, x.ld, x.k + c0 * x.ld, x.ld, T(0), score,
              cols);
    for (Index i = 0; i < rows; ++i) {
      T* row = score + i * cols;
      const Index seen = visible_keys(r0 + i, c0, cols);
      if (seen == 0) {
        std::fill(row, row + cols, T(0));
        continue;
      }
      const T new_max = std::max(row_max[i], *std::max_element(row, row + seen));
      const double sum = exp_shifted(row, row, seen, new_max);
      std::fill(row + seen, row + cols, T(0));
      if (row_max[i] != new_max && denom[i] != 0.0) {
        // The running max rose: rescale what the earlier key tiles added.
        const T shrink = std::exp(row_max[i] - new_max);
        denom[i] *= static_cast<double>(shrink);
        for (Index j = 0; j < head_dim; ++j) acc[i * head_dim + j] *= shrink;
      }
      row_max[i] = new_max;
      denom[i] += sum;
    }
    gemm_tile(false, false, rows, head_dim, cols, T(1), score, cols, x.v + c0 * x.ld, x.ld, T(1), acc, head_dim);
  }
  for (Index i = 0; i < rows; ++i) {
    const T inv = static_cast<T>(1.0 / denom[i]);
    T* o = out + (r0 + i) * ld_out;
    for (Index j = 0; j < head_dim; ++j) o[j] = acc[i * head_dim + j] * inv;
    lse[r0 + i] = row_max[i] + static_cast<T>(std::log(denom[i]));
  }
}

// The probabilities of a (query tile, key tile) pair from the saved log-sum-exp, zero where masked.
template <typename T>
void recompute_probabilities(const HeadView<T>& x, const T* lse, T* prob, Index r0, Index rows, Index c0, Index cols,
                             Index head_dim, T scale) {
  gemm_tile(false, true, rows, cols, head_dim, scale, x.q + r0 * x.ld, x.ld, x.k + c0 * x.ld, x.ld, T(0), prob, cols);
  for (Index i = 0; i < rows; ++i) {
    T* row = prob + i * cols;
    const Index seen = visible_keys(r0 + i, c0, cols);
    exp_shifted(row, row, seen, lse[r0 + i]);
    std::fill(row + seen, row + cols, T(0));
  }
}

}  // namespace

template <typename T>
void flash_attention_forward(const T* qkv, T* lse, T* att, Index batch, Index len, Index heads, Index head_dim) {
  const Index d = heads * head_dim;
  const T scale = T(1) / std::sqrt(static_cast<T>(head_dim));
  const Index tiles = par::num_chunks(len, kAttentionTile);
  par::for_chunks(batch * heads * tiles, 1, [&](Index task, Index, Index) {
    const Index sh = task / tiles;
    const Index s = sh / heads;
    const Index h = sh % heads;
    const Index r0 = (task % tiles) * kAttentionTile;
    forward_tile(head_view(qkv, s, h, len, d, head_dim), att + s * len * d + h * head_dim, d, lse + sh * len, r0,
                 std::min(kAttentionTile, len - r0), len, head_dim, scale);
  });
}

template <typename T>
void flash_attention_backward(const T* qkv, const T* att, const T* lse, const T* datt, T* dqkv, Index batch, Index len,
                              Index heads, Index head_dim) {
  const Index d = heads * head_dim;
  const T scale = T(1) / std::sqrt(static_cast<T>(head_dim));
  par::for_chunks(batch * heads, 1, [&](Index sh, Index, Index) {
    const Index s = sh / heads;
    const Index h = sh % heads;
    const HeadView<T> x = head_view(qkv, s, h, len, d, head_dim);
    const Index offset = s * len * 3 * d + h * head_dim;
    T* dq = dqkv + offset;
    T* dk = dq + d;
    T* dv = dq + 2 * d;
    const T* o = att + s * len * d + h * head_dim;
    const T* dout = datt + s * len * d + h * head_dim;
    const T* row_lse = lse + sh * len;
    // delta[t] = dO[t] . O[t]: the softmax backward's row term, sum_j P dP.
    T* delta = thread_scratch<T, 3>(len);
    for (Index t = 0; t < len; ++t) {
      double dot = 0;
      for (Index j = 0; j < head_dim; ++j) dot += static_cast<double>(dout[t * d + j]) * o[t * d + j];
      delta[t] = static_cast<T>(dot);
      std::fill(dq + t * x.ld, dq + t * x.ld + head_dim, T(0));
      std::fill(dk + t * x.ld, dk + t * x.ld + head_dim, T(0));
      std::fill(dv + t * x.ld, dv + t * x.ld + head_dim, T(0));
    }
    T* prob = thread_scratch<T, 1>(kAttentionTile * kAttentionTile);
    T* dprob = thread_scratch<T, 2>(kAttentionTile * kAttentionTile);
    for (Index c0 = 0; c0 < len; c0 += kAttentionTile) {
      const Index cols = std::min(kAttentionTile, len - c0);
      for (Index r0 = c0 - c0 % kAttentionTile; r0 < len; r0 += kAttentionTile) {
        const Index rows = std::min(kAttentionTile, len - r0);
        recompute_probabilities(x, row_lse, prob, r0, rows, c0, cols, head_dim, scale);
        // dV += P^T dO; dP = dO V^T; dS = P (dP - delta) in place; dQ += scale dS K; dK += scale dS^T Q.
        gemm_tile(true, false, cols, head_dim, rows, T(1), prob, cols, dout + r0 * d, d, T(1), dv + c0 * x.ld, x.ld);
        gemm_tile(false, true, rows, cols, head_dim, T(1), dout + r0 * d, d, x.v + c0 * x.ld, x.ld, T(0), dprob, cols);
        for (Index i = 0; i < rows; ++i) {
          const T di = delta[r0 + i];
          const Index seen = visible_keys(r0 + i, c0, cols);
          T* ds = dprob + i * cols;
          const T* p = prob + i * cols;
          for (Index j = 0; j < seen; ++j) ds[j] = p[j] * (ds[j] - di);
          std::fill(ds + seen, ds + cols, T(0));
        }
        gemm_tile(false, false, rows, head_dim, cols, scale, dprob, cols, x.k + c0 * x.ld, x.ld, T(1), dq + r0 * x.ld,
                  x.ld);
        gemm_tile(true, false, cols, head_dim, rows, scale, dprob, cols, x.q + r0 * x.ld, x.ld, T(1), dk + c0 * x.ld,
                  x.ld);
      }
    }
  });
}

template void flash_attention_forward<float>(const float*, float*, float*, Index, Index, Index, Index);
template void flash_attention_forward<double>(const double*, double*, double*, Index, Index, Index, Index);
template void flash_attention_backward<float>(const float*, const float*, const float*, const float*, float*, Index,
                                              Index, Index, Index);
template void flash_attention_backward<double>(const double*, const double*, const double*, const double*, double*,
                                               Index, Index, Index, Index);

}  // namespace zero3::models::ops
