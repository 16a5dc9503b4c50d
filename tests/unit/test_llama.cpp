// The host Llama-family decoder: its backward against central finite differences in float64 for every
// element of every param (grouped-query attention with q/k/v and o biases; plain multi-head attention with a
// head_dim that differs from hidden / heads; lm_head tied to the embedding), the float model against the
// double one, causality, the rotary embedding's relative-position property (reads the private
// llama_ops.hpp), and config validation naming the field.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "llama_ops.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/models/llama.hpp"

namespace {

using zero3::models::LlamaConfig;
using zero3::models::LlamaModel;

LlamaConfig gqa_config() {
  LlamaConfig c;
  c.vocab_size = 11;
  c.seq_len = 5;
  c.layers = 2;
  c.hidden = 8;
  c.heads = 4;
  c.kv_heads = 2;
  c.intermediate = 12;
  c.rope_theta = 10.0;  // a small base: every pair of the tiny heads turns noticeably within 5 positions
  c.qkv_bias = true;
  c.o_bias = true;
  return c;
}

LlamaConfig mha_config() {
  LlamaConfig c;
  c.vocab_size = 9;
  c.seq_len = 4;
  c.layers = 1;
  c.hidden = 6;
  c.heads = 2;
  c.head_dim = 4;  // heads * head_dim = 8 != hidden
  c.intermediate = 10;
  c.rope_theta = 100.0;
  return c;
}

template <typename T>
struct Params {
  std::vector<zero3::UnitSpec> units;
  std::vector<std::vector<std::vector<T>>> values;
  // A unit's params as the engine's walk hands them: its own, then those of the units it borrows.
  std::vector<const T*> pointers(std::size_t u) const {
    std::vector<const T*> out;
    for (const std::size_t v : visit(u)) {
      for (const auto& p : values[v]) out.push_back(p.data());
    }
    return out;
  }
  std::vector<std::size_t> visit(std::size_t u) const { return zero3::visit_units(units, u); }
};

// Far from init for gradient checks: matrices normal(0, spread), norms 1 + normal(0, spread / 3), biases
// normal(0, spread / 3), from a counter RNG keyed by the param's name.
Params<double> make_params(const LlamaConfig& config, std::uint64_t seed, double spread) {
  Params<double> p;
  p.units = zero3::models::llama_units(config);
  for (const zero3::UnitSpec& unit : p.units) {
    auto& unit_values = p.values.emplace_back();
    for (const zero3::ParamSpec& spec : unit.params) {
      const zero3::CounterRng rng(seed, zero3::hash_name(spec.name));
      std::vector<double> v(spec.numel());
      const bool normal = spec.init.kind == zero3::ParamInit::Kind::normal;
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double z = rng.normal(i);
        v[i] = static_cast<double>(static_cast<float>(normal ? spread * z : spec.init.a + spread / 3 * z));
      }
      unit_values.push_back(std::move(v));
    }
  }
  return p;
}

Params<float> to_float(const Params<double>& p) {
  Params<float> out;
  out.units = p.units;
  for (const auto& unit : p.values) {
    auto& u = out.values.emplace_back();
    for (const auto& v : unit) u.emplace_back(v.begin(), v.end());
  }
  return out;
}

struct Batch {
  int batch = 0;
  int len = 0;
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
};

Batch make_batch(const LlamaConfig& config, int batch, int len, std::uint64_t seed) {
  const zero3::CounterRng rng(seed, zero3::hash_name("test_llama.batch"));
  Batch b{batch, len, {}, {}};
  const auto v = static_cast<std::uint64_t>(config.vocab_size);
  for (int i = 0; i < batch * len; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>(rng.bits(static_cast<std::uint64_t>(i), 0) % v));
    b.targets.push_back(static_cast<std::int32_t>(rng.bits(static_cast<std::uint64_t>(i), 1) % v));
  }
  return b;
}

template <typename T>
T forward(LlamaModel<T>& model, const Params<T>& p, const Batch& b) {
  model.set_batch(b.tokens, b.targets, b.batch, b.len);
  for (std::size_t u = 0; u < model.num_units(); ++u) model.forward_unit(u, p.pointers(u));
  return model.loss();
}

template <typename T>
std::vector<std::vector<std::vector<T>>> gradients(LlamaModel<T>& model, const Params<T>& p, const Batch& b) {
  forward(model, p, b);
  std::vector<std::vector<std::vector<T>>> g;
  for (const auto& unit : p.values) {
    auto& u = g.emplace_back();
    for (const auto& v : unit) u.emplace_back(v.size(), T(0));
  }
  for (std::size_t u = model.num_units(); u-- > 0;) {
    // A borrowed unit's gradients of this use in buffers of their own, added to its total afterwards, as
    // the engine reduces each use's buffer into the same accumulators.
    std::vector<std::vector<T>> scratch;
    std::vector<T*> ptrs;
    for (auto& v : g[u]) ptrs.push_back(v.data());
    const std::vector<std::size_t> visit = p.visit(u);
    for (std::size_t i = 1; i < visit.size(); ++i) {
      for (const auto& v : g[visit[i]]) ptrs.push_back(scratch.emplace_back(v.size(), T(0)).data());
    }
    model.backward_unit(u, p.pointers(u), ptrs, T(1));
    std::size_t next = 0;
    for (std::size_t i = 1; i < visit.size(); ++i) {
      for (auto& v : g[visit[i]]) {
        const std::vector<T>& add = scratch[next++];
        for (std::size_t e = 0; e < v.size(); ++e) v[e] += add[e];
      }
    }
  }
  return g;
}

void check_finite_differences(const LlamaConfig& config) {
  Params<double> p = make_params(config, 7, 0.5);
  const Batch b = make_batch(config, 2, config.seq_len, 3);
  LlamaModel<double> model(config);
  const auto grads = gradients(model, p, b);
  // Fourth-order central stencil (truncation ~h^4, rounding ~eps |L| / h ~ 1e-11); errors relative to
  // max(|analytic|, |numeric|, kGradFloor), below which a gradient is at the stencil's noise.
  constexpr double kStep = 1e-4;
  constexpr double kGradFloor = 1e-4;
  constexpr double kTolerance = 1e-6;
  double worst = 0;
  for (std::size_t u = 0; u < p.units.size(); ++u) {
    for (std::size_t k = 0; k < p.units[u].params.size(); ++k) {
      std::vector<double>& v = p.values[u][k];
      const std::string& name = p.units[u].params[k].name;
      double param_worst = 0;
      double grad_max = 0;
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double original = v[i];
        auto loss_at = [&](double delta) {
          v[i] = original + delta;
          return forward(model, p, b);
        };
        const double numeric =
            (-loss_at(2 * kStep) + 8 * loss_at(kStep) - 8 * loss_at(-kStep) + loss_at(-2 * kStep)) / (12 * kStep);
        v[i] = original;
        const double analytic = grads[u][k][i];
        const double rel = std::abs(analytic - numeric) / std::max({std::abs(analytic), std::abs(numeric), kGradFloor});
        INFO(fmt::format("{}[{}]: analytic {:.12e} numeric {:.12e} rel {:.3e}", name, i, analytic, numeric, rel));
        CHECK(rel < kTolerance);
        param_worst = std::max(param_worst, rel);
        grad_max = std::max(grad_max, std::abs(analytic));
      }
      // A param whose gradient is zero everywhere would pass trivially: each must move the loss.
      INFO(name);
      CHECK(grad_max > 10 * kGradFloor);
      fmt::print("fd {:<44} {:>4} elems  max|grad| {:.3e}  max rel err {:.3e}\n", name, v.size(), grad_max,
                 param_worst);
      worst = std::max(worst, param_worst);
    }
  }
  fmt::print("fd worst relative error over all params: {:.3e}\n", worst);
}

}  // namespace

TEST_CASE("llama: backward matches finite differences, grouped-query attention with biases (float64)", "[llama]") {
  check_finite_differences(gqa_config());
}

TEST_CASE("llama: backward matches finite differences, head_dim apart from hidden / heads (float64)", "[llama]") {
  check_finite_differences(mha_config());
}

TEST_CASE("llama: backward matches finite differences, lm_head tied to the embedding (float64)", "[llama]") {
  // Each element of the embedding moves the loss through the lookup and the output layer: the finite
  // difference sees both, and the gradient is their sum only if the head's share reaches the embedding.
  LlamaConfig c = mha_config();
  c.tie_word_embeddings = true;
  check_finite_differences(c);
}

TEST_CASE("llama: float and double agree; a future token does not change earlier positions", "[llama]") {
  const LlamaConfig config = gqa_config();
  const Params<double> pd = make_params(config, 5, 0.3);
  const Params<float> pf = to_float(pd);
  const Batch b = make_batch(config, 3, config.seq_len, 9);
  LlamaModel<double> md(config);
  LlamaModel<float> mf(config);
  const double ld = forward(md, pd, b);
  const float lf = forward(mf, pf, b);
  CHECK(lf == Approx(ld).epsilon(1e-5));
  const std::vector<double> logits(md.logits().begin(), md.logits().end());
  Batch changed = b;
  changed.tokens[static_cast<std::size_t>(config.seq_len - 1)] =
      (changed.tokens[static_cast<std::size_t>(config.seq_len - 1)] + 1) % config.vocab_size;
  forward(md, pd, changed);
  const auto vocab = static_cast<std::size_t>(config.vocab_size);
  const auto last = static_cast<std::size_t>(config.seq_len - 1);
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const std::size_t row = i / vocab;
    if (row == last) continue;  // the changed position of sequence 0
    INFO(fmt::format("logit {} (row {})", i, row));
    CHECK(md.logits()[i] == logits[i]);
  }
}

TEST_CASE("llama: rotary embeddings keep norms and make q.k depend on relative position only", "[llama]") {
  // The same q and k at every position of one sequence: after rotation, q_m . k_n must depend on m - n
  // alone, and rotation must keep each head's norm.
  const std::size_t len = 6;
  const std::size_t heads = 2;
  const std::size_t kv_heads = 1;
  const std::size_t dim = 8;
  std::vector<double> cos;
  std::vector<double> sin;
  zero3::models::ops::rope_table(len, dim, 50.0, cos, sin);
  const zero3::CounterRng rng(1, zero3::hash_name("test_llama.rope"));
  std::vector<double> q(len * heads * dim);
  std::vector<double> k(len * kv_heads * dim);
  std::vector<double> v(len * kv_heads * dim, 0.0);
  for (std::size_t r = 0; r < len; ++r) {
    for (std::size_t i = 0; i < heads * dim; ++i) q[r * heads * dim + i] = rng.normal(i);
    for (std::size_t i = 0; i < kv_heads * dim; ++i) k[r * kv_heads * dim + i] = rng.normal(100 + i);
  }
  std::vector<double> qkv(len * 3 * heads * dim);
  zero3::models::ops::gqa_pack(q.data(), k.data(), v.data(), qkv.data(), cos.data(), sin.data(), len, len, heads,
                               kv_heads, dim);
  const auto dot = [&](std::size_t m, std::size_t n, std::size_t head) {
    double s = 0;
    for (std::size_t j = 0; j < dim; ++j) {
      s += qkv[m * 3 * heads * dim + head * dim + j] * qkv[n * 3 * heads * dim + heads * dim + head * dim + j];
    }
    return s;
  };
  // The angles are position x frequency rounded to float (as transformers computes them), so equal
  // distances agree to float precision, not double.
  for (std::size_t head = 0; head < heads; ++head) {
    CHECK(dot(3, 1, head) == Approx(dot(5, 3, head)).epsilon(1e-6));
    CHECK(dot(2, 2, head) == Approx(dot(0, 0, head)).epsilon(1e-6));
    CHECK(std::abs(dot(3, 1, head) - dot(3, 2, head)) > 1e-3);  // a different distance, a different score
    double norm_in = 0;
    double norm_out = 0;
    for (std::size_t j = 0; j < dim; ++j) {
      norm_in += q[4 * heads * dim + head * dim + j] * q[4 * heads * dim + head * dim + j];
      norm_out += qkv[4 * 3 * heads * dim + head * dim + j] * qkv[4 * 3 * heads * dim + head * dim + j];
    }
    CHECK(norm_out == Approx(norm_in).epsilon(1e-12));
  }
}

TEST_CASE("llama: configs no model can be built from name the field", "[llama]") {
  const auto message = [](LlamaConfig c) {
    try {
      zero3::models::validate(c);
    } catch (const zero3::ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  LlamaConfig c = gqa_config();
  c.kv_heads = 3;
  CHECK_THAT(message(c), Catch::Contains("zero3.model.heads (4) must be a multiple of zero3.model.kv_heads (3)"));
  c = gqa_config();
  c.head_dim = 3;
  CHECK_THAT(message(c), Catch::Contains("head_dim (3) must be even"));
  c = gqa_config();
  c.intermediate = 0;
  CHECK_THAT(message(c), Catch::Contains("zero3.model.intermediate_size"));
  c = mha_config();
  c.head_dim = 0;
  c.hidden = 7;
  CHECK_THAT(message(c), Catch::Contains("hidden_size (7) must be a multiple of zero3.model.heads (2)"));
  const auto units = zero3::models::llama_units(gqa_config());
  REQUIRE(units.size() == 4);
  CHECK(units[1].name == "layers.0");
  CHECK(units[1].params[1].name == "model.layers.0.self_attn.q_proj.weight");
  CHECK(units[1].params.size() == 13);
  CHECK(units[3].params[1].name == "lm_head.weight");
  CHECK(units[3].borrows.empty());
  LlamaConfig tied = gqa_config();
  tied.tie_word_embeddings = true;
  const auto tied_units = zero3::models::llama_units(tied);
  REQUIRE(tied_units.size() == 4);
  CHECK(tied_units[3].params.size() == 1);  // model.norm.weight; the output layer is the borrowed embedding
  CHECK(tied_units[3].borrows == std::vector<std::string>{"embed"});
  CHECK(zero3::models::llama_num_params(tied) ==
        zero3::models::llama_num_params(gqa_config()) - static_cast<std::size_t>(tied.vocab_size * tied.hidden));
}
