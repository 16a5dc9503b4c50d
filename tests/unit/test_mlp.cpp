// The host MLP: its backward against central finite differences in float64 (every element of every param of
// a tiny model, with a seed_scale != 1), its forward against a naive scalar reference written here, which
// tokens of a window it reads, accumulation into the gradient buffers, float against double, the calling
// contract, and a short Adam run that learns an order-2 Markov chain to near its entropy rate.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/data/markov.hpp"
#include "zero3/models/mlp.hpp"

namespace {

using zero3::models::MlpConfig;
using zero3::models::MlpModel;
using Pass = zero3::models::Pass;

MlpConfig tiny_config() {
  return MlpConfig{.vocab_size = 7, .context = 3, .layers = 2, .hidden = 5};
}

template <typename T>
using Tensors = std::vector<std::vector<std::vector<T>>>;  // [unit][param][element]

template <typename T>
struct Params {
  std::vector<zero3::UnitSpec> units;
  Tensors<T> values;

  std::vector<const T*> pointers(std::size_t u) const {
    std::vector<const T*> out;
    for (const auto& v : values[u]) out.push_back(v.data());
    return out;
  }
};

// The spec's init from a counter RNG keyed by the param name, or, with `spread` > 0, normal(0, spread) for
// every element (biases included), so that no gradient is trivially zero and GELU runs in its curved region.
// Values are rounded to float so the float and double models see the same params.
Params<double> make_params(const MlpConfig& config, std::uint64_t seed, double spread = 0.0) {
  Params<double> p;
  p.units = zero3::models::mlp_units(config);
  for (const zero3::UnitSpec& unit : p.units) {
    auto& unit_values = p.values.emplace_back();
    for (const zero3::ParamSpec& spec : unit.params) {
      const zero3::CounterRng rng(seed, zero3::hash_name(spec.name));
      std::vector<double> v(spec.numel());
      const bool normal = spec.init.kind == zero3::ParamInit::Kind::normal;
      for (std::size_t i = 0; i < v.size(); ++i) {
        const double z = rng.normal(i);
        const double x = spread > 0 ? spread * z : normal ? spec.init.a + spec.init.b * z : spec.init.a;
        v[i] = static_cast<double>(static_cast<float>(x));
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

Batch make_batch(const MlpConfig& config, int batch, int len, std::uint64_t seed) {
  const zero3::CounterRng rng(seed, zero3::hash_name("test_mlp.batch"));
  Batch b{batch, len, {}, {}};
  const auto v = static_cast<std::uint64_t>(config.vocab_size);
  for (int i = 0; i < batch * len; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>(rng.bits(static_cast<std::uint64_t>(i), 0) % v));
    b.targets.push_back(static_cast<std::int32_t>(rng.bits(static_cast<std::uint64_t>(i), 1) % v));
  }
  return b;
}

template <typename T>
T forward(MlpModel<T>& model, const Params<T>& p, const Batch& b, Pass pass = Pass::train) {
  model.set_batch(b.tokens, b.targets, b.batch, b.len, pass);
  for (std::size_t u = 0; u < model.num_units(); ++u) model.forward_unit(u, p.pointers(u));
  return model.loss();
}

template <typename T>
Tensors<T> filled_like(const Params<T>& p, T value) {
  Tensors<T> g;
  for (const auto& unit : p.values) {
    auto& u = g.emplace_back();
    for (const auto& v : unit) u.emplace_back(v.size(), value);
  }
  return g;
}

template <typename T>
void backward(MlpModel<T>& model, const Params<T>& p, Tensors<T>& grads, T seed_scale) {
  for (std::size_t u = model.num_units(); u-- > 0;) {
    std::vector<T*> g;
    for (auto& v : grads[u]) g.push_back(v.data());
    model.backward_unit(u, p.pointers(u), g, seed_scale);
  }
}

double gelu(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// The MLP written out element by element, independently of the model's buffers and BLAS calls: the logits
// of window b, from the embeddings of tokens[b, len - context .. len), oldest first.
std::vector<double> reference_logits(const MlpConfig& c, const Params<double>& p, const Batch& b, int window) {
  const auto d = static_cast<std::size_t>(c.hidden);
  std::vector<double> x;
  for (int j = 0; j < c.context; ++j) {
    const auto token =
        static_cast<std::size_t>(b.tokens[static_cast<std::size_t>(window * b.len + b.len - c.context + j)]);
    for (std::size_t k = 0; k < d; ++k) x.push_back(p.values[0][0][token * d + k]);
  }
  for (int layer = 0; layer < c.layers; ++layer) {
    const auto& w = p.values[static_cast<std::size_t>(layer) + 1][0];
    const auto& bias = p.values[static_cast<std::size_t>(layer) + 1][1];
    std::vector<double> y(d);
    for (std::size_t o = 0; o < d; ++o) {
      double s = bias[o];
      for (std::size_t i = 0; i < x.size(); ++i) s += w[o * x.size() + i] * x[i];
      y[o] = gelu(s);
    }
    x = y;
  }
  const auto& w = p.values.back()[0];
  const auto& bias = p.values.back()[1];
  std::vector<double> logits(static_cast<std::size_t>(c.vocab_size));
  for (std::size_t o = 0; o < logits.size(); ++o) {
    logits[o] = bias[o];
    for (std::size_t i = 0; i < d; ++i) logits[o] += w[o * d + i] * x[i];
  }
  return logits;
}

}  // namespace

TEST_CASE("mlp: backward matches central finite differences for every element of every param (float64)", "[mlp]") {
  const MlpConfig config = tiny_config();
  Params<double> p = make_params(config, 7, 0.5);
  const Batch b = make_batch(config, 4, 4, 3);
  MlpModel<double> model(config);
  forward(model, p, b);
  constexpr double kSeedScale = 0.5;
  auto grads = filled_like(p, 0.0);
  backward(model, p, grads, kSeedScale);

  // Fourth-order central stencil: truncation ~h^4 f^(5) ~ 1e-16; rounding ~eps |L| / h ~ 1e-11.
  constexpr double kStep = 1e-4;
  // Relative error against max(|analytic|, |numeric|, kGradFloor): below the floor a gradient is at the
  // stencil's rounding noise (the embedding rows of tokens no window reads are exactly zero).
  constexpr double kGradFloor = 1e-4;
  constexpr double kTolerance = 1e-6;
  double worst = 0;
  std::size_t nonzero = 0;
  std::size_t total = 0;
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
        const double numeric = kSeedScale *
                               (-loss_at(2 * kStep) + 8 * loss_at(kStep) - 8 * loss_at(-kStep) + loss_at(-2 * kStep)) /
                               (12 * kStep);
        v[i] = original;
        const double analytic = grads[u][k][i];
        const double rel = std::abs(analytic - numeric) / std::max({std::abs(analytic), std::abs(numeric), kGradFloor});
        INFO(fmt::format("{}[{}]: analytic {:.12e} numeric {:.12e} rel {:.3e}", name, i, analytic, numeric, rel));
        CHECK(rel < kTolerance);
        param_worst = std::max(param_worst, rel);
        grad_max = std::max(grad_max, std::abs(analytic));
        nonzero += std::abs(analytic) > kGradFloor ? 1 : 0;
        ++total;
      }
      fmt::print("fd {:<20} {:>4} elems  max|grad| {:.3e}  max rel err {:.3e}\n", name, v.size(), grad_max,
                 param_worst);
      worst = std::max(worst, param_worst);
    }
  }
  fmt::print("fd worst relative error over all params: {:.3e} ({} of {} gradients above the floor)\n", worst, nonzero,
             total);
  CHECK(total == zero3::models::mlp_num_params(config));
  // Only the embedding rows of tokens outside every window's context may be zero: the check compared real
  // gradients, not zeros.
  CHECK(nonzero > total - 3 * static_cast<std::size_t>(config.hidden));
}

TEST_CASE("mlp: forward matches a scalar reference and reads only each window's last context tokens", "[mlp]") {
  const MlpConfig config = tiny_config();
  const Params<double> p = make_params(config, 17, 0.5);
  const Batch base = make_batch(config, 4, 6, 19);
  MlpModel<double> model(config);
  const double loss = forward(model, p, base);
  const auto vocab = static_cast<std::size_t>(config.vocab_size);
  double expected_loss = 0;
  for (int w = 0; w < base.batch; ++w) {
    const std::vector<double> ref = reference_logits(config, p, base, w);
    double mx = *std::max_element(ref.begin(), ref.end());
    double sum = 0;
    for (double l : ref) sum += std::exp(l - mx);
    const auto target = static_cast<std::size_t>(base.targets[static_cast<std::size_t>(w * base.len + base.len - 1)]);
    expected_loss += mx + std::log(sum) - ref[target];
    for (std::size_t j = 0; j < vocab; ++j) {
      INFO(fmt::format("window {} logit {}", w, j));
      CHECK(model.logits()[static_cast<std::size_t>(w) * vocab + j] == Approx(ref[j]).epsilon(1e-12).margin(1e-14));
    }
  }
  expected_loss /= base.batch;
  CHECK(loss == Approx(expected_loss).epsilon(1e-12));

  // Change one token (or target) of window 0 at a time: only the last `context` tokens and the last target
  // may move the loss, and each of them must.
  for (int pos = 0; pos < base.len; ++pos) {
    for (bool is_target : {false, true}) {
      Batch b = base;
      auto& ids = is_target ? b.targets : b.tokens;
      ids[static_cast<std::size_t>(pos)] = (ids[static_cast<std::size_t>(pos)] + 1) % config.vocab_size;
      const double changed = forward(model, p, b);
      const bool read = is_target ? pos == base.len - 1 : pos >= base.len - config.context;
      INFO(fmt::format("{} {} changed: loss {:.15f} -> {:.15f}", is_target ? "target" : "token", pos, loss, changed));
      if (read) {
        CHECK(std::abs(changed - loss) > 1e-6);
      } else {
        CHECK(changed == loss);
      }
    }
  }
}

TEST_CASE("mlp: gradients accumulate into the buffers and scale with seed_scale", "[mlp]") {
  const MlpConfig config = tiny_config();
  const Params<double> p = make_params(config, 11, 0.5);
  const Batch b = make_batch(config, 4, 4, 5);
  MlpModel<double> model(config);
  forward(model, p, b);
  auto plain = filled_like(p, 0.0);
  backward(model, p, plain, 1.0);
  // Start from random contents: a backward that overwrites instead of adding fails.
  const Params<double> start = make_params(config, 99, 1.0);
  Tensors<double> acc = start.values;
  forward(model, p, b);
  backward(model, p, acc, 2.5);
  for (std::size_t u = 0; u < plain.size(); ++u) {
    for (std::size_t k = 0; k < plain[u].size(); ++k) {
      for (std::size_t i = 0; i < plain[u][k].size(); ++i) {
        INFO(fmt::format("{}[{}]", p.units[u].params[k].name, i));
        CHECK(acc[u][k][i] == Approx(start.values[u][k][i] + 2.5 * plain[u][k][i]).epsilon(1e-12).margin(1e-14));
      }
    }
  }
}

TEST_CASE("mlp: float and double agree; the loss at init is about log(vocab)", "[mlp]") {
  const MlpConfig config{.vocab_size = 50, .context = 4, .layers = 3, .hidden = 32};
  const Params<double> pd = make_params(config, 21);
  const Params<float> pf = to_float(pd);
  const Batch b = make_batch(config, 16, 6, 8);
  MlpModel<double> md(config);
  MlpModel<float> mf(config);
  const double loss_d = forward(md, pd, b);
  const double loss_f = forward(mf, pf, b);
  INFO(fmt::format("loss double {:.10f} float {:.10f} log(vocab) {:.6f}", loss_d, loss_f, std::log(50.0)));
  // float keeps ~7 digits; each logit sums a few hundred products.
  CHECK(std::abs(loss_f - loss_d) / loss_d < 1e-5);
  // The head's 0.02-sized weights make the first prediction nearly uniform.
  CHECK(std::abs(loss_d - std::log(50.0)) < 0.05);
  for (std::size_t i = 0; i < md.logits().size(); ++i) {
    CHECK(std::abs(mf.logits()[i] - md.logits()[i]) < 1e-5);
  }

  auto gd = filled_like(pd, 0.0);
  auto gf = filled_like(pf, 0.0f);
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
      CHECK(norm > 0);
      // Relative L2 error of a float gradient: float rounding through three layers.
      CHECK(std::sqrt(diff) <= 1e-4 * std::sqrt(norm));
    }
  }
}

TEST_CASE("mlp: an eval pass gives the train pass's loss; an empty eval batch gives 0", "[mlp]") {
  MlpConfig config = tiny_config();
  config.layers = 4;
  const Params<float> p = to_float(make_params(config, 41, 0.5));
  const Batch b = make_batch(config, 6, 5, 10);
  MlpModel<float> train(config);
  MlpModel<float> eval(config);
  const float train_loss = forward(train, p, b);
  const float eval_loss = forward(eval, p, b, Pass::eval);
  CHECK(eval_loss == train_loss);
  CHECK(eval_loss > 0);
  CHECK(eval.activation_bytes() < train.activation_bytes());
  CHECK(eval.activation_bytes() > 0);
  std::vector<float> g(p.values.back()[0].size());
  std::vector<float*> grads(2, g.data());
  const std::size_t head = eval.num_units() - 1;
  CHECK_THROWS_WITH(eval.backward_unit(head, p.pointers(head), grads, 1.0f), Catch::Contains("eval pass"));

  // The same model alternates between passes; a train pass after an eval pass still gets its gradients.
  CHECK(forward(eval, p, b) == train_loss);

  const Batch empty{0, 5, {}, {}};
  CHECK(forward(eval, p, empty, Pass::eval) == 0.0f);
  CHECK_THROWS_AS(eval.set_batch(empty.tokens, empty.targets, 0, 5, Pass::train), zero3::UsageError);
}

TEST_CASE("mlp: out-of-contract calls and configs throw, naming what is wrong", "[mlp]") {
  const MlpConfig config = tiny_config();
  const Params<double> p = make_params(config, 1);
  const Batch b = make_batch(config, 2, 4, 2);
  MlpModel<double> model(config);
  CHECK_THROWS_WITH(model.forward_unit(0, p.pointers(0)), Catch::Contains("set_batch first"));
  model.set_batch(b.tokens, b.targets, 2, 4);
  CHECK_THROWS_WITH(model.forward_unit(1, p.pointers(1)), Catch::Contains("unit 1 called, expected unit 0"));
  CHECK_THROWS_WITH(model.forward_unit(0, p.pointers(1)), Catch::Contains("unit 0 takes 1 params, got 2"));
  model.forward_unit(0, p.pointers(0));
  auto grads = filled_like(p, 0.0);
  std::vector<double*> g0{grads[0][0].data()};
  CHECK_THROWS_WITH(model.backward_unit(0, p.pointers(0), g0, 1.0), Catch::Contains("no backward is due"));
  model.forward_unit(1, p.pointers(1));
  model.forward_unit(2, p.pointers(2));
  model.forward_unit(3, p.pointers(3));
  CHECK_THROWS_WITH(model.forward_unit(4, p.pointers(3)), Catch::Contains("every unit's forward is done"));
  std::vector<double*> g2{grads[2][0].data(), grads[2][1].data()};
  CHECK_THROWS_WITH(model.backward_unit(2, p.pointers(2), g2, 1.0), Catch::Contains("unit 3 is next"));
  std::vector<double*> g3{grads[3][0].data(), nullptr};
  CHECK_THROWS_WITH(model.backward_unit(3, p.pointers(3), g3, 1.0), Catch::Contains("unit 3 gradient 1 is null"));

  // Bad batches: ids outside the vocabulary anywhere in the window (also where the MLP does not read),
  // windows shorter than the context, sizes that do not match.
  std::vector<std::int32_t> bad = b.tokens;
  bad[1] = config.vocab_size;
  CHECK_THROWS_WITH(model.set_batch(bad, b.targets, 2, 4), Catch::Contains("tokens[1]"));
  bad = b.targets;
  bad[6] = -1;
  CHECK_THROWS_WITH(model.set_batch(b.tokens, bad, 2, 4), Catch::Contains("targets[6] (window 1, position 2)"));
  const Batch short_windows = make_batch(config, 4, 2, 3);
  CHECK_THROWS_WITH(model.set_batch(short_windows.tokens, short_windows.targets, 4, 2),
                    Catch::Contains("context") && Catch::Contains("got 2"));
  CHECK_THROWS_AS(model.set_batch(b.tokens, b.targets, 4, 4), zero3::UsageError);
  CHECK_THROWS_AS(model.set_batch(b.tokens, b.targets, -1, 4, Pass::eval), zero3::UsageError);

  MlpConfig c = tiny_config();
  c.layers = 0;
  CHECK_THROWS_WITH(zero3::models::validate(c), Catch::Contains("zero3.model.layers"));
  c = tiny_config();
  c.context = 0;
  CHECK_THROWS_WITH(zero3::models::validate(c), Catch::Contains("zero3.model.seq_len"));
  c = tiny_config();
  c.hidden = -2;
  CHECK_THROWS_AS(MlpModel<float>(c), zero3::ConfigError);
  c = tiny_config();
  c.vocab_size = 0;
  CHECK_THROWS_WITH(zero3::models::mlp_units(c), Catch::Contains("zero3.model.vocab_size"));
}

TEST_CASE("mlp: units, names, shapes, init and param count", "[mlp]") {
  const MlpConfig c = tiny_config();
  const auto units = zero3::models::mlp_units(c);
  REQUIRE(units.size() == 4);
  CHECK(units[0].name == "embed");
  CHECK(units[1].name == "layers.0");
  CHECK(units[2].name == "layers.1");
  CHECK(units[3].name == "head");
  CHECK(units[0].params[0].name == "wte.weight");
  CHECK(units[0].params[0].shape == std::vector<std::int64_t>{7, 5});
  CHECK(units[1].params[0].name == "layers.0.fc.weight");
  CHECK(units[1].params[0].shape == std::vector<std::int64_t>{5, 15});
  CHECK(units[1].params[0].init.b == Approx(1.0 / std::sqrt(15.0)));
  CHECK(units[2].params[0].shape == std::vector<std::int64_t>{5, 5});
  CHECK(units[2].params[1].name == "layers.1.fc.bias");
  CHECK_FALSE(units[2].params[1].weight_decay);
  CHECK(units[2].params[0].weight_decay);
  CHECK(units[3].params[0].name == "head.weight");
  CHECK(units[3].params[0].shape == std::vector<std::int64_t>{7, 5});
  CHECK(units[3].params[1].shape == std::vector<std::int64_t>{7});
  CHECK_FALSE(units[3].params[1].weight_decay);
  const std::size_t v = 7, ctx = 3, d = 5;
  CHECK(zero3::models::mlp_num_params(c) == v * d + (ctx * d * d + d) + (d * d + d) + (v * d + v));
  CHECK(MlpModel<double>(c).num_units() == 4);
}

TEST_CASE("mlp: Adam learns an order-2 Markov chain to near its entropy rate", "[mlp]") {
  using zero3::data::MarkovOptions;
  using zero3::data::MarkovSource;
  using zero3::data::Split;
  // Three sparse successors per state (plus the 2% uniform mix): an entropy rate well below log(vocab), so
  // reaching it takes learning which pair of tokens predicts what.
  const MarkovSource chain(MarkovOptions{.vocab_size = 8, .markov_order = 2, .seed = 5, .successors_per_state = 3});
  const double entropy = chain.entropy_rate();
  const MlpConfig config{.vocab_size = 8, .context = 2, .layers = 2, .hidden = 32};
  const int len = 3;  // windows one token longer than the context: the first token must be ignored
  auto windows = [&](Split split, std::int64_t first, int count) {
    Batch b{count, len, {}, {}};
    std::vector<std::int32_t> w(len + 1);
    for (int i = 0; i < count; ++i) {
      chain.tokens(split, first + i, len, w);
      b.tokens.insert(b.tokens.end(), w.begin(), w.end() - 1);
      b.targets.insert(b.targets.end(), w.begin() + 1, w.end());
    }
    return b;
  };
  // The exact expected loss under the chain, H + E_pi[KL(P(.|s) || model(.|s))], from one window per
  // (state, next token) weighted by pi(s) P(next | s): no sampling noise.
  Batch all{64 * 8, 2, {}, {}};
  std::vector<double> weight;
  for (std::int32_t s = 0; s < 64; ++s) {
    for (std::int32_t next = 0; next < 8; ++next) {
      const std::vector<std::int32_t> state{s / 8, s % 8};
      all.tokens.insert(all.tokens.end(), state.begin(), state.end());
      all.targets.insert(all.targets.end(), {0, next});
      weight.push_back(chain.stationary()[static_cast<std::size_t>(s)] * chain.transition_probability(state, next));
    }
  }
  const Batch heldout = windows(Split::heldout, 0, 8192);

  Params<double> p = make_params(config, 3);
  MlpModel<double> model(config);
  auto expected_loss = [&] {
    forward(model, p, all, Pass::eval);
    double sum = 0;
    for (std::size_t i = 0; i < weight.size(); ++i) sum += weight[i] * model.position_losses()[i];
    return sum;
  };
  const double initial_exact = expected_loss();
  const double initial_heldout = forward(model, p, heldout, Pass::eval);

  // Plain Adam (no weight decay), lr decayed linearly to 0: betas (0.9, 0.999), eps 1e-8.
  constexpr int kSteps = 500;
  constexpr int kBatch = 256;
  constexpr double kLr = 2e-2, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;
  auto m = filled_like(p, 0.0);
  auto v = filled_like(p, 0.0);
  for (int step = 1; step <= kSteps; ++step) {
    forward(model, p, windows(Split::train, static_cast<std::int64_t>(step - 1) * kBatch, kBatch));
    auto g = filled_like(p, 0.0);
    backward(model, p, g, 1.0);
    const double lr = kLr * (1.0 - static_cast<double>(step - 1) / kSteps);
    const double c1 = 1 - std::pow(kBeta1, step);
    const double c2 = 1 - std::pow(kBeta2, step);
    for (std::size_t u = 0; u < g.size(); ++u) {
      for (std::size_t k = 0; k < g[u].size(); ++k) {
        for (std::size_t i = 0; i < g[u][k].size(); ++i) {
          const double gi = g[u][k][i];
          m[u][k][i] = kBeta1 * m[u][k][i] + (1 - kBeta1) * gi;
          v[u][k][i] = kBeta2 * v[u][k][i] + (1 - kBeta2) * gi * gi;
          p.values[u][k][i] -= lr * (m[u][k][i] / c1) / (std::sqrt(v[u][k][i] / c2) + kEps);
        }
      }
    }
  }
  const double exact = expected_loss();
  const double held = forward(model, p, heldout, Pass::eval);
  const std::string summary =
      fmt::format("entropy rate {:.4f}; expected loss {:.4f} -> {:.4f}; held-out loss (8192 windows) {:.4f} -> {:.4f}",
                  entropy, initial_exact, exact, initial_heldout, held);
  INFO(summary);
  fmt::print("markov: {} in {} steps of {}\n", summary, kSteps, kBatch);
  CHECK(initial_exact > entropy + 0.5);  // there was something to learn
  CHECK(exact >= entropy - 1e-9);        // no model beats the entropy rate: the evaluation itself is right
  CHECK(exact < entropy + 0.05);
  CHECK(std::abs(held - entropy) < 0.05);
}
