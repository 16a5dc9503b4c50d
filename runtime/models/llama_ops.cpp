#include "llama_ops.hpp"

#include <cmath>

#include "host_parallel.hpp"

namespace zero3::models::ops {
namespace {

// Rows per chunk of the per-row loops, columns per block of the param-gradient sums, elements per chunk
// of the elementwise loops: fixed, so results do not depend on the thread count.
constexpr Index kRowChunk = 16;
constexpr Index kColChunk = 256;
constexpr Index kElemChunk = Index{1} << 14;

template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// Rotates the head_dim/2 pairs (x[j], x[j + half]) of one head by the position's angles: sign +1 applies
// the rotation, -1 its inverse (the transpose, which is what the gradient needs).
template <typename T>
void rotate(const T* x, T* y, const T* cos, const T* sin, Index half, T sign) {
  for (Index j = 0; j < half; ++j) {
    const T a = x[j];
    const T b = x[j + half];
    const T s = sign * sin[j];
    y[j] = a * cos[j] - b * s;
    y[j + half] = b * cos[j] + a * s;
  }
}

}  // namespace

template <typename T>
void rmsnorm_forward(const T* x, const T* w, T* y, T* inv_rms, Index rows, Index d, double eps) {
  par::for_chunks(rows, kRowChunk, [&](Index, Index b, Index e) {
    for (Index i = b; i < e; ++i) {
      const T* xi = x + i * d;
      double sq = 0;
      for (Index k = 0; k < d; ++k) sq += static_cast<double>(xi[k]) * static_cast<double>(xi[k]);
      const T r = static_cast<T>(1.0 / std::sqrt(sq / static_cast<double>(d) + eps));
      inv_rms[i] = r;
      T* yi = y + i * d;
      for (Index k = 0; k < d; ++k) yi[k] = w[k] * (xi[k] * r);
    }
  });
}

template <typename T>
void rmsnorm_backward(const T* x, const T* w, const T* inv_rms, const T* dy, T* dx, T* dw, Index rows, Index d) {
  // y_k = w_k x_k r with r = (mean(x^2) + eps)^-1/2, dr/dx_k = -r^3 x_k / d, so
  // dx_k = r (w_k dy_k - x_k r^2 mean_j(dy_j w_j x_j)).
  par::for_chunks(rows, kRowChunk, [&](Index, Index b, Index e) {
    for (Index i = b; i < e; ++i) {
      const T* xi = x + i * d;
      const T* dyi = dy + i * d;
      const T r = inv_rms[i];
      double dot = 0;
      for (Index k = 0; k < d; ++k) dot += static_cast<double>(dyi[k] * w[k]) * static_cast<double>(xi[k]);
      const T c = static_cast<T>(dot / static_cast<double>(d)) * r * r;
      T* dxi = dx + i * d;
      for (Index k = 0; k < d; ++k) dxi[k] += r * (w[k] * dyi[k] - xi[k] * c);
    }
  });
  par::for_chunks(d, kColChunk, [&](Index, Index k0, Index k1) {
    for (Index i = 0; i < rows; ++i) {
      const T* xi = x + i * d;
      const T* dyi = dy + i * d;
      for (Index k = k0; k < k1; ++k) dw[k] += dyi[k] * xi[k] * inv_rms[i];
    }
  });
}

template <typename T>
void rope_table(Index len, Index head_dim, double theta, std::vector<T>& cos, std::vector<T>& sin) {
  const Index half = head_dim / 2;
  cos.resize(len * half);
  sin.resize(len * half);
  for (Index j = 0; j < half; ++j) {
    // inv_freq = 1 / theta^(2j / head_dim), in float as torch computes it.
    const float exponent = static_cast<float>(2 * j) / static_cast<float>(head_dim);
    const float inv_freq = 1.0f / std::pow(static_cast<float>(theta), exponent);
    for (Index p = 0; p < len; ++p) {
      const float angle = static_cast<float>(p) * inv_freq;
      cos[p * half + j] = static_cast<T>(std::cos(static_cast<double>(angle)));
      sin[p * half + j] = static_cast<T>(std::sin(static_cast<double>(angle)));
    }
  }
}

template <typename T>
void swiglu_forward(const T* gate, const T* up, T* h, Index n) {
  par::for_chunks(n, kElemChunk, [&](Index, Index b, Index e) {
    for (Index i = b; i < e; ++i) h[i] = gate[i] * sigmoid(gate[i]) * up[i];
  });
}

template <typename T>
void swiglu_backward(const T* gate, const T* up, const T* dh, T* dgate, T* dup, Index n) {
  par::for_chunks(n, kElemChunk, [&](Index, Index b, Index e) {
    for (Index i = b; i < e; ++i) {
      const T g = gate[i];
      const T s = sigmoid(g);
      const T grad = dh[i];
      dup[i] = grad * g * s;
      dgate[i] = grad * up[i] * s * (T(1) + g * (T(1) - s));  // silu'(g) = s (1 + g (1 - s))
    }
  });
}

template <typename T>
void gqa_pack(const T* q, const T* k, const T* v, T* qkv, const T* cos, const T* sin, Index rows, Index len,
              Index heads, Index kv_heads, Index head_dim) {
  const Index half = head_dim / 2;
  const Index group = heads / kv_heads;
  const Index dq = heads * head_dim;
  const Index dkv = kv_heads * head_dim;
  par::for_chunks(rows, kRowChunk, [&](Index, Index b, Index e) {
    for (Index r = b; r < e; ++r) {
      const T* c = cos + (r % len) * half;
      const T* s = sin + (r % len) * half;
      T* out = qkv + r * 3 * dq;
      for (Index h = 0; h < heads; ++h) {
        const Index kv = h / group;
        rotate(q + r * dq + h * head_dim, out + h * head_dim, c, s, half, T(1));
        rotate(k + r * dkv + kv * head_dim, out + dq + h * head_dim, c, s, half, T(1));
        const T* vh = v + r * dkv + kv * head_dim;
        std::copy(vh, vh + head_dim, out + 2 * dq + h * head_dim);
      }
    }
  });
}

template <typename T>
void gqa_unpack(const T* dqkv, T* dq, T* dk, T* dv, const T* cos, const T* sin, Index rows, Index len, Index heads,
                Index kv_heads, Index head_dim) {
  const Index half = head_dim / 2;
  const Index group = heads / kv_heads;
  const Index q_width = heads * head_dim;
  const Index kv_width = kv_heads * head_dim;
  par::for_chunks(rows, kRowChunk, [&](Index, Index b, Index e) {
    std::vector<T> sum(head_dim);
    for (Index r = b; r < e; ++r) {
      const T* c = cos + (r % len) * half;
      const T* s = sin + (r % len) * half;
      const T* in = dqkv + r * 3 * q_width;
      for (Index h = 0; h < heads; ++h) rotate(in + h * head_dim, dq + r * q_width + h * head_dim, c, s, half, T(-1));
      for (Index kv = 0; kv < kv_heads; ++kv) {
        for (int part = 1; part <= 2; ++part) {  // 1: k (rotated back after the sum), 2: v
          std::fill(sum.begin(), sum.end(), T(0));
          for (Index h = kv * group; h < (kv + 1) * group; ++h) {
            const T* g = in + part * q_width + h * head_dim;
            for (Index j = 0; j < head_dim; ++j) sum[j] += g[j];
          }
          if (part == 1) {
            rotate(sum.data(), dk + r * kv_width + kv * head_dim, c, s, half, T(-1));
          } else {
            std::copy(sum.begin(), sum.end(), dv + r * kv_width + kv * head_dim);
          }
        }
      }
    }
  });
}

#define ZERO3_LLAMA_OPS(T)                                                                                            \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, Index, Index, double);                                 \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, Index, Index);                    \
  template void rope_table<T>(Index, Index, double, std::vector<T>&, std::vector<T>&);                                \
  template void swiglu_forward<T>(const T*, const T*, T*, Index);                                                     \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, Index);                                      \
  template void gqa_pack<T>(const T*, const T*, const T*, T*, const T*, const T*, Index, Index, Index, Index, Index); \
  template void gqa_unpack<T>(const T*, T*, T*, T*, const T*, const T*, Index, Index, Index, Index, Index);
ZERO3_LLAMA_OPS(float)
ZERO3_LLAMA_OPS(double)
#undef ZERO3_LLAMA_OPS

}  // namespace zero3::models::ops
