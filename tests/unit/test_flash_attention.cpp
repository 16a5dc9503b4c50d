// The tiled attention (runtime/models/flash_attention.hpp) against attention written out in full in float64:
// the softmax matrix formed, masked and normalized, and its backward by the textbook formulas, and the
// reference's gradient itself against central finite differences. Lengths below, at and across the tile size,
// float and double, and the same bits on 1 and 2 threads.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "flash_attention.hpp"
#include "host_gemm.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/models/gpt.hpp"

using zero3::models::ops::Index;
using zero3::models::ops::kAttentionKeyTile;
using zero3::models::ops::kAttentionTile;

namespace {

struct Shape {
  Index batch, len, heads, head_dim;
  Index d() const { return heads * head_dim; }
};

struct Reference {
  std::vector<double> att, lse, dqkv;
};

// Full attention in double: P = softmax(mask(Q K^T / sqrt(dh))), att = P V; the backward from datt.
Reference reference(const Shape& s, const std::vector<double>& qkv, const std::vector<double>& datt) {
  const Index d = s.d(), ld = 3 * d, n = s.len;
  Reference r{std::vector<double>(s.batch * n * d), std::vector<double>(s.batch * s.heads * n),
              std::vector<double>(qkv.size(), 0.0)};
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  std::vector<double> p(n * n), dp(n * n);
  for (Index b = 0; b < s.batch; ++b) {
    for (Index h = 0; h < s.heads; ++h) {
      const auto q = [&](Index t, Index j) { return qkv[(b * n + t) * ld + h * s.head_dim + j]; };
      const auto k = [&](Index t, Index j) { return qkv[(b * n + t) * ld + d + h * s.head_dim + j]; };
      const auto v = [&](Index t, Index j) { return qkv[(b * n + t) * ld + 2 * d + h * s.head_dim + j]; };
      for (Index t = 0; t < n; ++t) {
        double mx = -1e300;
        for (Index u = 0; u <= t; ++u) {
          double dot = 0;
          for (Index j = 0; j < s.head_dim; ++j) dot += q(t, j) * k(u, j);
          p[t * n + u] = dot * scale;
          mx = std::max(mx, p[t * n + u]);
        }
        double sum = 0;
        for (Index u = 0; u <= t; ++u) sum += std::exp(p[t * n + u] - mx);
        for (Index u = 0; u < n; ++u) p[t * n + u] = u <= t ? std::exp(p[t * n + u] - mx) / sum : 0.0;
        r.lse[(b * s.heads + h) * n + t] = mx + std::log(sum);
        for (Index j = 0; j < s.head_dim; ++j) {
          double o = 0;
          for (Index u = 0; u <= t; ++u) o += p[t * n + u] * v(u, j);
          r.att[(b * n + t) * d + h * s.head_dim + j] = o;
        }
      }
      const auto da = [&](Index t, Index j) { return datt[(b * n + t) * d + h * s.head_dim + j]; };
      for (Index t = 0; t < n; ++t) {
        double row = 0;
        for (Index u = 0; u <= t; ++u) {
          double g = 0;
          for (Index j = 0; j < s.head_dim; ++j) g += da(t, j) * v(u, j);
          dp[t * n + u] = g;
          row += p[t * n + u] * g;
        }
        for (Index u = 0; u <= t; ++u) {
          const double ds = p[t * n + u] * (dp[t * n + u] - row) * scale;
          for (Index j = 0; j < s.head_dim; ++j) {
            r.dqkv[(b * n + t) * ld + h * s.head_dim + j] += ds * k(u, j);
            r.dqkv[(b * n + u) * ld + d + h * s.head_dim + j] += ds * q(t, j);
            r.dqkv[(b * n + u) * ld + 2 * d + h * s.head_dim + j] += p[t * n + u] * da(t, j);
          }
        }
      }
    }
  }
  return r;
}

std::vector<double> random_values(std::size_t n, std::uint64_t seed, double scale) {
  const zero3::CounterRng rng(seed, /*key=*/0);
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * rng.normal(i);
  return v;
}

template <typename T>
struct Tiled {
  std::vector<T> att, lse, dqkv;
};

template <typename T>
Tiled<T> tiled(const Shape& s, const std::vector<double>& qkv64, const std::vector<double>& datt64,
               bool bf16_products = false) {
  const std::vector<T> qkv(qkv64.begin(), qkv64.end()), datt(datt64.begin(), datt64.end());
  Tiled<T> r{std::vector<T>(datt.size()), std::vector<T>(s.batch * s.heads * s.len), std::vector<T>(qkv.size())};
  // As the models' constructors do: the products single-threaded inside the pool's chunks.
  zero3::models::gemm::configure_backends();
  zero3::models::ops::flash_attention_forward(qkv.data(), r.lse.data(), r.att.data(), s.batch, s.len, s.heads,
                                              s.head_dim, bf16_products);
  zero3::models::ops::flash_attention_backward(qkv.data(), r.att.data(), r.lse.data(), datt.data(), r.dqkv.data(),
                                               s.batch, s.len, s.heads, s.head_dim, bf16_products);
  return r;
}

// Largest |a - b| relative to the largest |b|.
template <typename T>
double relative_error(const std::vector<T>& a, const std::vector<double>& b) {
  double diff = 0, size = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    size = std::max(size, std::abs(b[i]));
  }
  return diff / size;
}

const Shape kShapes[] = {{2, 1, 2, 8},
                         {1, 37, 3, 16},
                         {2, kAttentionTile, 2, 8},
                         {1, kAttentionTile + 1, 2, 16},
                         {1, 2 * kAttentionTile + 22, 2, 32},
                         {1, kAttentionKeyTile + 3, 2, 16},
                         {1, 2 * kAttentionKeyTile + 70, 1, 64}};

}  // namespace

TEST_CASE("flash attention matches full attention in float64", "[models][attention]") {
  for (const Shape& s : kShapes) {
    INFO(fmt::format("batch {} len {} heads {} head_dim {}", s.batch, s.len, s.heads, s.head_dim));
    // Scores of a few units, so that the softmax is far from uniform and the running max moves across tiles.
    const std::vector<double> qkv = random_values(s.batch * s.len * 3 * s.d(), 7 + s.len, 1.5);
    const std::vector<double> datt = random_values(s.batch * s.len * s.d(), 11 + s.len, 1.0);
    const Reference want = reference(s, qkv, datt);
    const Tiled<double> f64 = tiled<double>(s, qkv, datt);
    CHECK(relative_error(f64.att, want.att) < 1e-13);
    CHECK(relative_error(f64.lse, want.lse) < 1e-13);
    CHECK(relative_error(f64.dqkv, want.dqkv) < 1e-12);
    const Tiled<float> f32 = tiled<float>(s, qkv, datt);
    CHECK(relative_error(f32.att, want.att) < 2e-6);
    CHECK(relative_error(f32.lse, want.lse) < 2e-6);
    CHECK(relative_error(f32.dqkv, want.dqkv) < 2e-5);
    if (zero3::models::host_bf16_products()) {
      // bf16 operands carry 8 significant bits: errors near 2^-8 of the largest value, far below a wrong
      // mask, tile or rescale (which move whole rows).
      const Tiled<float> b16 = tiled<float>(s, qkv, datt, true);
      const double att = relative_error(b16.att, want.att);
      const double lse = relative_error(b16.lse, want.lse);
      const double dqkv = relative_error(b16.dqkv, want.dqkv);
      INFO(fmt::format("bf16 products: att {:.2e} lse {:.2e} dqkv {:.2e}", att, lse, dqkv));
      CHECK(att < 2e-2);
      CHECK(lse < 6e-3);
      CHECK(dqkv < 3e-2);
      // And the bf16 products are in use: not the fp32 results.
      CHECK(att > 10 * relative_error(f32.att, want.att));
    }
  }
}

TEST_CASE("the float64 reference's attention gradient matches central finite differences", "[models][attention]") {
  // The reference is what the tiled kernel is held to, so it is itself held to the definition of a gradient:
  // L = sum(att * datt), dL/dqkv by central differences at every element.
  const Shape s{1, 9, 2, 4};
  const std::vector<double> qkv = random_values(s.len * 3 * s.d(), 3, 1.0);
  const std::vector<double> datt = random_values(s.len * s.d(), 5, 1.0);
  const Reference r = reference(s, qkv, datt);
  const auto loss = [&](const std::vector<double>& x) {
    const Reference y = reference(s, x, datt);
    double l = 0;
    for (std::size_t i = 0; i < y.att.size(); ++i) l += y.att[i] * datt[i];
    return l;
  };
  const double h = 1e-6;
  for (std::size_t i = 0; i < qkv.size(); ++i) {
    std::vector<double> up = qkv, down = qkv;
    up[i] += h;
    down[i] -= h;
    const double numeric = (loss(up) - loss(down)) / (2 * h);
    INFO("element " << i);
    CHECK(r.dqkv[i] == Approx(numeric).margin(1e-8).epsilon(1e-6));
  }
}

TEST_CASE("flash attention gives the same bits on 1 and 2 threads", "[models][attention]") {
  const Shape s{2, 3 * kAttentionTile - 5, 3, 16};
  const std::vector<double> qkv = random_values(s.batch * s.len * 3 * s.d(), 19, 1.5);
  const std::vector<double> datt = random_values(s.batch * s.len * s.d(), 23, 1.0);
  const int restore = zero3::models::blas_threads();
  zero3::models::set_blas_threads(1);
  const Tiled<float> one = tiled<float>(s, qkv, datt);
  zero3::models::set_blas_threads(2);
  const Tiled<float> two = tiled<float>(s, qkv, datt);
  const bool bf16 = zero3::models::host_bf16_products();
  zero3::models::set_blas_threads(1);
  const Tiled<float> one16 = tiled<float>(s, qkv, datt, bf16);
  zero3::models::set_blas_threads(2);
  const Tiled<float> two16 = tiled<float>(s, qkv, datt, bf16);
  zero3::models::set_blas_threads(restore);
  const auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  CHECK(same(one.att, two.att));
  CHECK(same(one.lse, two.lse));
  CHECK(same(one.dqkv, two.dqkv));
  CHECK(same(one16.att, two16.att));
  CHECK(same(one16.lse, two16.lse));
  CHECK(same(one16.dqkv, two16.dqkv));
}
