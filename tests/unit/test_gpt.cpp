// The host GPT: its backward against central finite differences in float64 (every element of every param
// of a tiny model), the float model against the double one, causality of the attention, the unit-by-unit
// calling contract, and a few Adam steps that memorize a fixed batch.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/models/gpt.hpp"

namespace {

using zero3::models::GptConfig;
using zero3::models::GptModel;

GptConfig tiny_config() {
  GptConfig c;
  c.vocab_size = 11;
  c.seq_len = 5;
  c.layers = 2;
  c.hidden = 8;
  c.heads = 2;
  return c;
}

// Params of every unit, as values and as the pointer lists GptModel takes.
template <typename T>
struct ModelParams {
  std::vector<zero3::UnitSpec> units;
  std::vector<std::vector<std::vector<T>>> values;  // [unit][param][element]

  std::vector<const T*> pointers(std::size_t u) const {
    std::vector<const T*> out;
    for (const auto& v : values[u]) out.push_back(v.data());
    return out;
  }
};

// The spec's init (normal(std) or constant) from a counter RNG keyed by the param name. `spread` > 0
// replaces it with something far from init for gradient checks: weights normal(0, spread), and every
// constant param (biases, LayerNorm) its constant plus normal(0, spread / 3), so that no gradient is
// trivially zero and GELU and softmax run in their curved regions.
ModelParams<double> make_params(const GptConfig& config, std::uint64_t seed, double spread = 0.0) {
  ModelParams<double> p;
  p.units = zero3::models::gpt_units(config);
  for (const zero3::UnitSpec& unit : p.units) {
    auto& unit_values = p.values.emplace_back();
    for (const zero3::ParamSpec& spec : unit.params) {
      const zero3::CounterRng rng(seed, zero3::hash_name(spec.name));
      std::vector<double> v(spec.numel());
      const bool normal = spec.init.kind == zero3::ParamInit::Kind::normal;
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double z = rng.normal(i);
        if (spread > 0) {
          v[i] = normal ? spread * z : spec.init.a + spread / 3 * z;
        } else {
          v[i] = normal ? spec.init.a + spec.init.b * z : spec.init.a;
        }
        v[i] = static_cast<double>(static_cast<float>(v[i]));  // float and double models see the same values
      }
      unit_values.push_back(std::move(v));
    }
  }
  return p;
}

ModelParams<float> to_float(const ModelParams<double>& p) {
  ModelParams<float> out;
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

Batch make_batch(const GptConfig& config, int batch, int len, std::uint64_t seed) {
  const zero3::CounterRng rng(seed, zero3::hash_name("test_gpt.batch"));
  Batch b{batch, len, {}, {}};
  for (int i = 0; i < batch * len; ++i) {
    const auto v = static_cast<std::uint64_t>(config.vocab_size);
    b.tokens.push_back(static_cast<std::int32_t>(rng.bits(static_cast<std::uint64_t>(i), 0) % v));
    b.targets.push_back(static_cast<std::int32_t>(rng.bits(static_cast<std::uint64_t>(i), 1) % v));
  }
  return b;
}

template <typename T>
T forward(GptModel<T>& model, const ModelParams<T>& p, const Batch& b,
          typename GptModel<T>::Pass pass = GptModel<T>::Pass::train) {
  model.set_batch(b.tokens, b.targets, b.batch, b.len, pass);
  for (std::size_t u = 0; u < model.num_units(); ++u) model.forward_unit(u, p.pointers(u));
  return model.loss();
}

// Zero-filled gradients shaped like the params.
template <typename T>
std::vector<std::vector<std::vector<T>>> zero_grads(const ModelParams<T>& p) {
  std::vector<std::vector<std::vector<T>>> g;
  for (const auto& unit : p.values) {
    auto& u = g.emplace_back();
    for (const auto& v : unit) u.emplace_back(v.size(), T(0));
  }
  return g;
}

template <typename T>
void backward(GptModel<T>& model, const ModelParams<T>& p, std::vector<std::vector<std::vector<T>>>& grads,
              T seed_scale) {
  for (std::size_t u = model.num_units(); u-- > 0;) {
    std::vector<T*> g;
    for (auto& v : grads[u]) g.push_back(v.data());
    model.backward_unit(u, p.pointers(u), g, seed_scale);
  }
}

}  // namespace

TEST_CASE("gpt: backward matches central finite differences for every element of every param (float64)", "[gpt]") {
  const GptConfig config = tiny_config();
  ModelParams<double> p = make_params(config, 7, 0.4);
  const Batch b = make_batch(config, 2, config.seq_len, 3);
  GptModel<double> model(config);
  forward(model, p, b);
  auto grads = zero_grads(p);
  backward(model, p, grads, 1.0);

  // Fourth-order central stencil: truncation ~h^4 f^(5) ~ 1e-16; rounding ~eps |L| / h ~ 1e-11.
  constexpr double kStep = 1e-4;
  // Relative error against max(|analytic|, |numeric|, kGradFloor): below the floor a gradient is at the
  // stencil's rounding noise (the key bias's gradient is exactly zero: softmax ignores a shift shared by
  // all keys), where only the absolute error kGradFloor * 1e-6 = 1e-10 is meaningful.
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
      fmt::print("fd {:<28} {:>4} elems  max|grad| {:.3e}  max rel err {:.3e}\n", name, v.size(), grad_max,
                 param_worst);
      worst = std::max(worst, param_worst);
    }
  }
  fmt::print("fd worst relative error over all params: {:.3e}\n", worst);
}

TEST_CASE("gpt: gradients accumulate into the buffers and scale with seed_scale", "[gpt]") {
  const GptConfig config = tiny_config();
  const ModelParams<double> p = make_params(config, 11, 0.4);
  const Batch b = make_batch(config, 2, 4, 5);
  GptModel<double> model(config);
  forward(model, p, b);
  auto once = zero_grads(p);
  backward(model, p, once, 1.0);
  auto twice = once;
  forward(model, p, b);
  backward(model, p, twice, 2.5);
  for (std::size_t u = 0; u < once.size(); ++u) {
    for (std::size_t k = 0; k < once[u].size(); ++k) {
      for (std::size_t i = 0; i < once[u][k].size(); ++i) {
        INFO(fmt::format("{}[{}]", p.units[u].params[k].name, i));
        CHECK(twice[u][k][i] == Approx(3.5 * once[u][k][i]).epsilon(1e-12).margin(1e-15));
      }
    }
  }
}

TEST_CASE("gpt: float and double agree; the loss at init is about log(vocab)", "[gpt]") {
  GptConfig config;
  config.vocab_size = 64;
  config.seq_len = 16;
  config.layers = 2;
  config.hidden = 32;
  config.heads = 4;
  const ModelParams<double> pd = make_params(config, 21);
  const ModelParams<float> pf = to_float(pd);
  const Batch b = make_batch(config, 3, 12, 8);
  GptModel<double> md(config);
  GptModel<float> mf(config);
  const double loss_d = forward(md, pd, b);
  const double loss_f = forward(mf, pf, b);
  INFO(fmt::format("loss double {:.10f} float {:.10f} log(vocab) {:.6f}", loss_d, loss_f, std::log(64.0)));
  // float keeps ~7 digits; the loss is a mean of sums of a few hundred products per logit.
  CHECK(std::abs(loss_f - loss_d) / loss_d < 1e-5);
  // At init the logits are ~0.02-sized, so the prediction is nearly uniform.
  CHECK(std::abs(loss_d - std::log(64.0)) / std::log(64.0) < 0.1);

  auto gd = zero_grads(pd);
  auto gf = zero_grads(pf);
  backward(md, pd, gd, 1.0);
  backward(mf, pf, gf, 1.0f);
  for (std::size_t u = 0; u < gd.size(); ++u) {
    for (std::size_t k = 0; k < gd[u].size(); ++k) {
      double diff = 0;
      double norm = 0;
      for (std::size_t i = 0; i < gd[u][k].size(); ++i) {
        diff += std::pow(static_cast<double>(gf[u][k][i]) - gd[u][k][i], 2);
        norm += gd[u][k][i] * gd[u][k][i];
      }
      INFO(pd.units[u].params[k].name);
      // Relative L2 error of a float gradient: float rounding amplified by the LayerNorm backward.
      CHECK(std::sqrt(diff) <= 1e-4 * std::sqrt(norm) + 1e-9);
    }
  }
}

TEST_CASE("gpt: a future token does not change earlier positions", "[gpt]") {
  const GptConfig config = tiny_config();
  const ModelParams<double> p = make_params(config, 31, 0.4);
  const Batch base = make_batch(config, 2, config.seq_len, 9);
  GptModel<double> model(config);
  forward(model, p, base);
  const std::vector<double> logits0(model.logits().begin(), model.logits().end());
  const std::vector<double> losses0(model.position_losses().begin(), model.position_losses().end());
  const auto vocab = static_cast<std::size_t>(config.vocab_size);
  const auto len = static_cast<std::size_t>(base.len);
  for (std::size_t changed = 0; changed < len; ++changed) {
    Batch b = base;
    b.tokens[changed] = (b.tokens[changed] + 1) % config.vocab_size;  // sequence 0 only
    forward(model, p, b);
    const auto logits = model.logits();
    const auto losses = model.position_losses();
    for (std::size_t row = 0; row < 2 * len; ++row) {
      const bool unaffected = row >= len || row < changed;  // sequence 1, or before the change
      double diff = 0;
      for (std::size_t j = 0; j < vocab; ++j)
        diff = std::max(diff, std::abs(logits[row * vocab + j] - logits0[row * vocab + j]));
      INFO(fmt::format("token {} changed; row {} (sequence {}, position {}): max logit change {:.3e}", changed, row,
                       row / len, row % len, diff));
      if (unaffected) {
        CHECK(diff == 0.0);
        CHECK(losses[row] == losses0[row]);
      } else if (row == changed) {
        CHECK(diff > 1e-6);  // the check can see a change where one must happen
      }
    }
  }
}

TEST_CASE("gpt: an eval pass gives the train pass's loss with less memory", "[gpt]") {
  GptConfig config = tiny_config();
  config.layers = 3;
  const ModelParams<float> p = to_float(make_params(config, 41));
  const Batch b = make_batch(config, 2, config.seq_len, 10);
  GptModel<float> train(config);
  GptModel<float> eval(config);
  const float train_loss = forward(train, p, b);
  const float eval_loss = forward(eval, p, b, GptModel<float>::Pass::eval);
  CHECK(eval_loss == train_loss);
  CHECK(eval.activation_bytes() < train.activation_bytes());
  CHECK(eval.activation_bytes() > 0);
  std::vector<float> g(p.values.back()[0].size());
  std::vector<float*> grads(3, g.data());
  CHECK_THROWS_AS(eval.backward_unit(eval.num_units() - 1, p.pointers(eval.num_units() - 1), grads, 1.0f),
                  zero3::UsageError);
}

TEST_CASE("gpt: out-of-contract calls and configs throw, naming what is wrong", "[gpt]") {
  const GptConfig config = tiny_config();
  const ModelParams<double> p = make_params(config, 1);
  const Batch b = make_batch(config, 1, 3, 2);
  GptModel<double> model(config);
  // forward before set_batch, out of order, wrong param count
  CHECK_THROWS_AS(model.forward_unit(0, p.pointers(0)), zero3::UsageError);
  model.set_batch(b.tokens, b.targets, 1, 3);
  CHECK_THROWS_WITH(model.forward_unit(1, p.pointers(1)), Catch::Contains("expected unit 0"));
  CHECK_THROWS_WITH(model.forward_unit(0, p.pointers(1)), Catch::Contains("takes 2 params"));
  // backward before forward is done
  model.forward_unit(0, p.pointers(0));
  std::vector<double*> none;
  CHECK_THROWS_WITH(model.backward_unit(0, p.pointers(0), none, 1.0), Catch::Contains("no backward is due"));
  // bad batches
  std::vector<std::int32_t> bad = b.tokens;
  bad[2] = config.vocab_size;
  CHECK_THROWS_WITH(model.set_batch(bad, b.targets, 1, 3), Catch::Contains("tokens[2]"));
  CHECK_THROWS_WITH(model.set_batch(b.tokens, b.targets, 1, 6), Catch::Contains("seq_len"));
  CHECK_THROWS_AS(model.set_batch(b.tokens, b.targets, 2, 3), zero3::UsageError);

  GptConfig c = tiny_config();
  c.heads = 3;
  CHECK_THROWS_WITH(zero3::models::validate(c), Catch::Contains("zero3.model.hidden") && Catch::Contains("heads"));
  c = tiny_config();
  c.vocab_size = 0;
  CHECK_THROWS_AS(zero3::models::validate(c), zero3::ConfigError);
  CHECK_THROWS_WITH(zero3::models::gpt_units(c), Catch::Contains("zero3.model.vocab_size"));
  CHECK_THROWS_AS(zero3::models::set_blas_threads(0), zero3::UsageError);
}

TEST_CASE("gpt: units, names and param count", "[gpt]") {
  const GptConfig c = tiny_config();
  const auto units = zero3::models::gpt_units(c);
  REQUIRE(units.size() == 4);
  CHECK(units[0].name == "embed");
  CHECK(units[1].name == "blocks.0");
  CHECK(units[3].name == "head");
  CHECK(units[1].params[2].name == "blocks.0.attn.qkv.weight");
  CHECK(units[1].params[2].shape == std::vector<std::int64_t>{3 * c.hidden, c.hidden});
  CHECK(units[2].params[10].shape == std::vector<std::int64_t>{c.hidden, 4 * c.hidden});
  CHECK_FALSE(units[1].params[3].weight_decay);
  const std::size_t v = 11, s = 5, d = 8, layers = 2;
  CHECK(zero3::models::gpt_num_params(c) == 2 * v * d + s * d + layers * (12 * d * d + 13 * d) + 2 * d);
}

TEST_CASE("gpt: a few Adam steps memorize a fixed batch", "[gpt]") {
  GptConfig config = tiny_config();
  config.hidden = 16;
  ModelParams<double> p = make_params(config, 51);
  const Batch b = make_batch(config, 2, config.seq_len, 12);
  GptModel<double> model(config);
  // Plain Adam (no weight decay): lr 1e-2, betas (0.9, 0.999), eps 1e-8.
  constexpr double kLr = 1e-2, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  auto m = zero_grads(p);
  auto v = zero_grads(p);
  const double initial = forward(model, p, b);
  double last = initial;
  for (int step = 1; step <= 150; ++step) {
    last = forward(model, p, b);
    auto g = zero_grads(p);
    backward(model, p, g, 1.0);
    const double c1 = 1 - std::pow(kBeta1, step);
    const double c2 = 1 - std::pow(kBeta2, step);
    for (std::size_t u = 0; u < g.size(); ++u) {
      for (std::size_t k = 0; k < g[u].size(); ++k) {
        for (std::size_t i = 0; i < g[u][k].size(); ++i) {
          const double gi = g[u][k][i];
          m[u][k][i] = kBeta1 * m[u][k][i] + (1 - kBeta1) * gi;
          v[u][k][i] = kBeta2 * v[u][k][i] + (1 - kBeta2) * gi * gi;
          p.values[u][k][i] -= kLr * (m[u][k][i] / c1) / (std::sqrt(v[u][k][i] / c2) + kEps);
        }
      }
    }
  }
  INFO(fmt::format("loss {:.4f} -> {:.4f}", initial, last));
  fmt::print("adam memorization: loss {:.4f} -> {:.4f} in 150 steps\n", initial, last);
  CHECK(last < 0.1 * initial);
}
