// The host GPT's compute modes: the threaded loops give the same bits on 1 and 2 threads (fp32 and
// bf16 products), the bf16 linear layer stays within the rounding bound of bf16 operands against a
// float64 product, and the bf16-compute GPT's loss and gradients stay near the float64 model's.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gpt_ops.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/models/gpt.hpp"

namespace {

using zero3::bf16_t;
using zero3::models::GptConfig;
using zero3::models::GptModel;
using Index = std::size_t;

constexpr double kBf16Roundoff = 1.0 / 256;        // u = 2^-8: bf16 keeps 8 significant bits
constexpr double kF32Roundoff = 1.0 / 16777216.0;  // 2^-24

// Large enough that every loop of the model splits into several chunks (rows 4 x 32 = 128, widths 64 and
// up), small enough for a unit test.
GptConfig config() {
  GptConfig c;
  c.vocab_size = 96;
  c.seq_len = 32;
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  return c;
}

double bf16_value(double v) {
  return zero3::bf16_to_float(zero3::float_to_bf16(static_cast<float>(v)));
}

// Every param at bf16-representable values (as an engine in bf16 holds them), as double, float and bf16.
struct Params {
  std::vector<zero3::UnitSpec> units;
  std::vector<std::vector<std::vector<double>>> d;
  std::vector<std::vector<std::vector<float>>> f;
  std::vector<std::vector<std::vector<bf16_t>>> b;
};

Params make_params(const GptConfig& c, std::uint64_t seed) {
  Params p;
  p.units = zero3::models::gpt_units(c);
  for (const zero3::UnitSpec& unit : p.units) {
    auto& ud = p.d.emplace_back();
    auto& uf = p.f.emplace_back();
    auto& ub = p.b.emplace_back();
    for (const zero3::ParamSpec& spec : unit.params) {
      const zero3::CounterRng rng(seed, zero3::hash_name(spec.name));
      std::vector<double> v(spec.numel());
      const bool normal = spec.init.kind == zero3::ParamInit::Kind::normal;
      // Larger than init (0.02) so that the blocks are far from the identity and the logits far from 0.
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = bf16_value(normal ? 0.15 * rng.normal(i) : spec.init.a + 0.1 * rng.normal(i));
      uf.emplace_back(v.begin(), v.end());
      std::vector<bf16_t> v16;
      for (double x : v) v16.push_back(zero3::float_to_bf16(static_cast<float>(x)));
      ub.push_back(std::move(v16));
      ud.push_back(std::move(v));
    }
  }
  return p;
}

struct Batch {
  int batch = 4;
  int len = 32;
  std::vector<std::int32_t> tokens, targets;
};

Batch make_batch(const GptConfig& c, std::uint64_t seed) {
  const zero3::CounterRng rng(seed, zero3::hash_name("test_gpt_host_compute.batch"));
  Batch b;
  for (int i = 0; i < b.batch * b.len; ++i) {
    const auto v = static_cast<std::uint64_t>(c.vocab_size);
    b.tokens.push_back(static_cast<std::int32_t>(rng.bits(static_cast<std::uint64_t>(i), 0) % v));
    b.targets.push_back(static_cast<std::int32_t>(rng.bits(static_cast<std::uint64_t>(i), 1) % v));
  }
  return b;
}

template <typename T>
struct Result {
  T loss = 0;
  std::vector<T> logits;
  std::vector<std::vector<std::vector<T>>> grads;
};

// One forward and backward; bf16 products for the matrix weights when `bf16`.
template <typename T>
Result<T> run(const GptConfig& c, const std::vector<std::vector<std::vector<T>>>& values, const Params& p,
              const Batch& b, bool bf16) {
  GptModel<T> model(c);
  model.set_batch(b.tokens, b.targets, b.batch, b.len);
  auto pointers = [&](std::size_t u) {
    std::vector<const T*> out;
    for (const auto& v : values[u]) out.push_back(v.data());
    return out;
  };
  auto pointers16 = [&](std::size_t u) {
    std::vector<const bf16_t*> out;
    for (std::size_t k = 0; k < values[u].size(); ++k) {
      out.push_back(bf16 && model.bf16_operand(u, k) ? p.b[u][k].data() : nullptr);
    }
    return out;
  };
  for (std::size_t u = 0; u < model.num_units(); ++u) model.forward_unit(u, pointers(u), pointers16(u));
  Result<T> r;
  r.loss = model.loss();
  r.logits.assign(model.logits().begin(), model.logits().end());
  r.grads.resize(values.size());
  for (std::size_t u = model.num_units(); u-- > 0;) {
    std::vector<T*> g;
    for (const auto& v : values[u]) g.push_back(r.grads[u].emplace_back(v.size(), T(0)).data());
    model.backward_unit(u, pointers(u), g, T(1), pointers16(u));
  }
  return r;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("gpt host compute: 1 and 2 threads give identical bits, fp32 and bf16 products", "[gpt]") {
  const GptConfig c = config();
  const Params p = make_params(c, 41);
  const Batch b = make_batch(c, 42);
  std::vector<bool> modes = {false};
  if (zero3::models::host_bf16_products()) modes.push_back(true);
  const int restore = zero3::models::blas_threads();
  for (bool bf16 : modes) {
    zero3::models::set_blas_threads(1);
    const Result<float> one = run<float>(c, p.f, p, b, bf16);
    for (int threads : {2}) {
      zero3::models::set_blas_threads(threads);
      const Result<float> many = run<float>(c, p.f, p, b, bf16);
      INFO(fmt::format("{} products, {} threads", bf16 ? "bf16" : "fp32", threads));
      CHECK(std::memcmp(&one.loss, &many.loss, sizeof(float)) == 0);
      CHECK(same_bits(one.logits, many.logits));
      for (std::size_t u = 0; u < one.grads.size(); ++u) {
        for (std::size_t k = 0; k < one.grads[u].size(); ++k) {
          INFO(p.units[u].params[k].name);
          CHECK(same_bits(one.grads[u][k], many.grads[u][k]));
        }
      }
    }
  }
  zero3::models::set_blas_threads(restore);
}

TEST_CASE("gpt host compute: the bf16 linear layer is within the bf16 rounding bound of a float64 product", "[gpt]") {
  if (!zero3::models::host_bf16_products()) {
    WARN("no bf16 products on this host (oneDNN or AVX512-BF16 missing): nothing to check");
    return;
  }
  namespace ops = zero3::models::ops;
  const Index rows = 96;
  const Index in = 200;
  const Index out = 72;
  const zero3::CounterRng rng(5, zero3::hash_name("bf16 linear"));
  std::vector<float> x(rows * in), dy(rows * out), bias(out);
  std::vector<bf16_t> w(out * in);
  std::vector<double> wd(out * in);
  for (Index i = 0; i < x.size(); ++i) x[i] = static_cast<float>(rng.normal(i));
  for (Index i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(rng.normal(100000 + i));
  for (Index i = 0; i < bias.size(); ++i) bias[i] = static_cast<float>(rng.normal(200000 + i));
  for (Index i = 0; i < w.size(); ++i) {
    w[i] = zero3::float_to_bf16(static_cast<float>(0.1 * rng.normal(300000 + i)));
    wd[i] = zero3::bf16_to_float(w[i]);
  }
  std::vector<bf16_t> xs, dys;
  std::vector<float> y(rows * out, -7.0f), dx(rows * in, -7.0f), dw(out * in, 0.5f), db(out, 0.25f);
  ops::linear_forward_bf16(x.data(), w.data(), bias.data(), y.data(), rows, in, out, xs);
  ops::linear_backward_bf16(x.data(), w.data(), dy.data(), dx.data(), false, dw.data(), db.data(), rows, in, out, xs,
                            dys);
  // Bound per output: rounding each operand that is not already bf16 to bf16 moves each product term by
  // at most u |term| (2u + u^2 with both operands rounded), and accumulating k terms in fp32 adds at most
  // k 2^-24 sum |terms| (first order): |err| <= (r u + k 2^-24) sum |a_i b_i|, r the rounded operands.
  // The exact float64 product is the reference; 1% slack covers the second-order terms.
  double worst = 0;  // largest error relative to the fp32-only part of the bound
  auto check = [&](const char* what, double got, double exact, double abs_sum, double rounded, Index k) {
    const double bound = 1.01 *
                         (rounded * kBf16Roundoff + rounded * rounded * kBf16Roundoff * kBf16Roundoff +
                          static_cast<double>(k + 1) * kF32Roundoff) *
                         abs_sum;
    INFO(fmt::format("{}: got {:.9g} exact {:.9g} bound {:.3g}", what, got, exact, bound));
    REQUIRE(std::abs(got - exact) <= bound);
    worst = std::max(worst, std::abs(got - exact) / (static_cast<double>(k + 1) * kF32Roundoff * abs_sum));
  };
  for (Index i = 0; i < rows; ++i) {
    for (Index o = 0; o < out; ++o) {
      double exact = bias[o];
      double abs_sum = std::abs(bias[o]);
      for (Index j = 0; j < in; ++j) {
        exact += static_cast<double>(x[i * in + j]) * wd[o * in + j];
        abs_sum += std::abs(static_cast<double>(x[i * in + j]) * wd[o * in + j]);
      }
      check("y", y[i * out + o], exact, abs_sum, 1, in);
    }
    for (Index j = 0; j < in; ++j) {
      double exact = 0;
      double abs_sum = 0;
      for (Index o = 0; o < out; ++o) {
        exact += static_cast<double>(dy[i * out + o]) * wd[o * in + j];
        abs_sum += std::abs(static_cast<double>(dy[i * out + o]) * wd[o * in + j]);
      }
      check("dx", dx[i * in + j], exact, abs_sum, 1, out);
    }
  }
  for (Index o = 0; o < out; ++o) {
    double bias_sum = 0.25;
    double bias_abs = 0.25;
    for (Index i = 0; i < rows; ++i) {
      bias_sum += dy[i * out + o];
      bias_abs += std::abs(dy[i * out + o]);
    }
    CHECK(std::abs(db[o] - bias_sum) <= static_cast<double>(rows + 1) * kF32Roundoff * bias_abs);  // fp32 sums
    for (Index j = 0; j < in; ++j) {
      double exact = 0.5;
      double abs_sum = 0.5;
      for (Index i = 0; i < rows; ++i) {
        exact += static_cast<double>(dy[i * out + o]) * x[i * in + j];
        abs_sum += std::abs(static_cast<double>(dy[i * out + o]) * x[i * in + j]);
      }
      check("dw", dw[o * in + j], exact, abs_sum, 2, rows);
    }
  }
  // The inputs were rounded: the error exceeds what fp32 products alone could make of them somewhere.
  CHECK(worst > 1.0);
}

TEST_CASE("gpt host compute: bf16 products keep the loss and gradients near the float64 model's", "[gpt]") {
  if (!zero3::models::host_bf16_products()) {
    WARN("no bf16 products on this host (oneDNN or AVX512-BF16 missing): nothing to check");
    return;
  }
  const GptConfig c = config();
  const Params p = make_params(c, 43);
  const Batch b = make_batch(c, 44);
  const Result<double> ref = run<double>(c, p.d, p, b, false);
  const Result<float> f32 = run<float>(c, p.f, p, b, false);
  const Result<float> bf = run<float>(c, p.f, p, b, true);
  // Each product's inputs carry a relative rounding error of at most u = 2^-8 (RMS u / sqrt(3)), which
  // the next LayerNorm largely removes; the loss is a smooth function of the logits with slope below 1
  // per logit, so its relative error stays at a few u: allowed 2u. Gradients pass the rounded output
  // gradients back through 2 blocks (2 bf16 products each way per layer, LayerNorm backward amplifying
  // by its 1/std): relative L2 error allowed 8u = 2^-5. fp32 products must be far tighter (1e-4).
  const double loss_err = std::abs(bf.loss - ref.loss) / ref.loss;
  INFO(fmt::format("loss float64 {:.8f} fp32 {:.8f} bf16 {:.8f}", ref.loss, f32.loss, bf.loss));
  CHECK(loss_err <= 2 * kBf16Roundoff);
  CHECK(std::abs(f32.loss - ref.loss) / ref.loss < 1e-5);
  CHECK(bf.loss != f32.loss);  // the bf16 mode did round something
  for (std::size_t u = 0; u < ref.grads.size(); ++u) {
    for (std::size_t k = 0; k < ref.grads[u].size(); ++k) {
      double diff = 0;
      double diff32 = 0;
      double norm = 0;
      for (std::size_t i = 0; i < ref.grads[u][k].size(); ++i) {
        const double r = ref.grads[u][k][i];
        diff += std::pow(bf.grads[u][k][i] - r, 2);
        diff32 += std::pow(f32.grads[u][k][i] - r, 2);
        norm += r * r;
      }
      INFO(fmt::format("{}: relative L2 error bf16 {:.3e} fp32 {:.3e}", p.units[u].params[k].name,
                       std::sqrt(diff / norm), std::sqrt(diff32 / norm)));
      CHECK(std::sqrt(diff) <= 8 * kBf16Roundoff * std::sqrt(norm));
      CHECK(std::sqrt(diff32) <= 1e-4 * std::sqrt(norm) + 1e-9);
    }
  }
}
