// The float64 reference the engine is tested against, tested on its own: the hand-written backward of
// every unit kind against central finite differences (every element of every param, relative error
// < 1e-6), the float model against the double one, the synthetic data's world-size independence, and
// the reference's optimizer, schedule and loss-scale formulas on cases small enough to compute by hand.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model.hpp"
#include "reference.hpp"
#include "zero3/core/rng.hpp"

using namespace zero3;
using model::Arch;
using model::ModelConfig;
using model::Network;

namespace {

// Params with values away from the init's special points (zero biases, unit norms), so every term of
// the backward is exercised.
std::vector<std::vector<std::vector<double>>> random_params(const std::vector<UnitSpec>& units, std::uint64_t seed) {
  std::vector<std::vector<std::vector<double>>> params(units.size());
  for (std::size_t u = 0; u < units.size(); ++u) {
    for (const ParamSpec& p : units[u].params) {
      const CounterRng rng(seed, hash_name(p.name));
      std::vector<double> v(model::numel(p));
      const bool is_norm = p.init.kind == ParamInit::Kind::constant && p.init.a == 1.0;
      const double scale = p.shape.size() == 2 ? 0.6 : 0.3;
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = (is_norm ? 1.0 : 0.0) + scale * rng.normal(i);
      params[u].push_back(std::move(v));
    }
  }
  return params;
}

double loss_of(Network<double>& net, const std::vector<std::vector<std::vector<double>>>& params) {
  for (std::size_t u = 0; u < params.size(); ++u) {
    std::vector<const double*> ptrs;
    for (const auto& v : params[u]) ptrs.push_back(v.data());
    net.forward(u, ptrs);
  }
  return net.loss();
}

// Analytic gradients (backward with `seed`) of every param.
std::vector<std::vector<std::vector<double>>> grads_of(Network<double>& net,
                                                       const std::vector<std::vector<std::vector<double>>>& params,
                                                       double seed) {
  loss_of(net, params);
  std::vector<std::vector<std::vector<double>>> grads(params.size());
  for (std::size_t u = params.size(); u-- > 0;) {
    std::vector<const double*> ptrs;
    std::vector<double*> gptrs;
    for (const auto& v : params[u]) {
      ptrs.push_back(v.data());
      grads[u].emplace_back(v.size(), std::nan(""));  // poisoned: an unwritten gradient fails
    }
    for (auto& g : grads[u]) gptrs.push_back(g.data());
    net.backward(u, ptrs, gptrs, seed);
  }
  return grads;
}

void check_finite_differences(const ModelConfig& mc, int samples) {
  const std::vector<UnitSpec> units = model::model_units(mc);
  auto params = random_params(units, 7);
  Network<double> net(mc);
  net.set_batch(model::make_batch<double>(mc, 11, 3, model::all_ids(samples)));
  const auto grads = grads_of(net, params, 1.0);

  for (std::size_t u = 0; u < units.size(); ++u) {
    for (std::size_t k = 0; k < units[u].params.size(); ++k) {
      const std::string& name = units[u].params[k].name;
      std::vector<double>& w = params[u][k];
      const std::vector<double>& g = grads[u][k];
      double num = 0.0;
      double den = 0.0;
      double worst = 0.0;
      double gmax = 0.0;
      for (double x : g) gmax = std::max(gmax, std::fabs(x));
      for (std::size_t i = 0; i < w.size(); ++i) {
        const double w0 = w[i];
        const double h = 1e-5 * std::max(1.0, std::fabs(w0));
        w[i] = w0 + h;
        const double lp = loss_of(net, params);
        w[i] = w0 - h;
        const double lm = loss_of(net, params);
        w[i] = w0;
        const double fd = (lp - lm) / (2.0 * h);
        num += (fd - g[i]) * (fd - g[i]);
        den += g[i] * g[i];
        // Per element, relative to the element or (for near-zero elements) to the param's largest one.
        worst = std::max(worst, std::fabs(fd - g[i]) / std::max(std::fabs(g[i]), 1e-3 * gmax));
      }
      INFO(fmt::format("param {}: {} elements, |grad|max {:.3e}", name, w.size(), gmax));
      REQUIRE(den > 0.0);
      CHECK(std::sqrt(num / den) < 1e-6);
      CHECK(worst < 1e-5);
    }
  }
}

config::Config base_config(config::OptimizerType type) {
  config::Config c;
  c.batch.train_batch_size = 6;
  c.batch.train_micro_batch_size_per_gpu = 6;
  c.batch.gradient_accumulation_steps = 1;
  c.gradient_clipping = 0.0;
  c.optimizer = config::OptimizerConfig{};
  c.optimizer->type = type;
  c.optimizer->lr = 1e-2;
  c.optimizer->weight_decay = 0.1;
  if (type == config::OptimizerType::adagrad) c.optimizer->eps = 1e-10;
  c.zero.stage = 3;
  return c;
}

ModelConfig tiny_transformer() {
  ModelConfig mc;
  mc.arch = Arch::transformer;
  mc.d_in = 3;
  mc.d_model = 4;
  mc.d_ff = 6;
  mc.layers = 2;
  mc.seq_len = 3;
  mc.d_out = 3;
  return mc;
}

}  // namespace

TEST_CASE("MLP backward matches central finite differences", "[reference][fd]") {
  for (auto act : {model::Activation::tanh, model::Activation::gelu}) {
    ModelConfig mc;
    mc.arch = Arch::mlp;
    mc.d_in = 3;
    mc.d_model = 5;
    mc.layers = 2;
    mc.d_out = 2;
    mc.activation = act;
    check_finite_differences(mc, 3);
  }
}

TEST_CASE("transformer backward matches central finite differences", "[reference][fd]") {
  check_finite_differences(tiny_transformer(), 2);
  ModelConfig one_position = tiny_transformer();
  one_position.seq_len = 1;
  one_position.layers = 1;
  check_finite_differences(one_position, 3);
}

TEST_CASE("backward scales with the seed and overwrites its gradients", "[reference]") {
  const ModelConfig mc = tiny_transformer();
  const auto units = model::model_units(mc);
  const auto params = random_params(units, 3);
  Network<double> net(mc);
  net.set_batch(model::make_batch<double>(mc, 5, 0, model::all_ids(2)));
  const auto g1 = grads_of(net, params, 1.0);
  const auto g3 = grads_of(net, params, 3.0);
  // (margin: for elements whose gradient is 0 up to rounding)
  for (std::size_t u = 0; u < g1.size(); ++u) {
    for (std::size_t k = 0; k < g1[u].size(); ++k) {
      for (std::size_t i = 0; i < g1[u][k].size(); ++i)
        CHECK(g3[u][k][i] == Approx(3.0 * g1[u][k][i]).epsilon(1e-12).margin(1e-15));
    }
  }
}

TEST_CASE("the float model follows the double one", "[reference]") {
  for (Arch arch : {Arch::mlp, Arch::transformer}) {
    ModelConfig mc = tiny_transformer();
    mc.arch = arch;
    mc.d_model = 16;
    mc.d_ff = 32;
    mc.seq_len = 6;
    const auto units = model::model_units(mc);
    auto pd = random_params(units, 9);
    for (auto& u : pd) {
      for (auto& v : u) {
        for (double& x : v) x = static_cast<double>(static_cast<float>(x));
      }
    }
    Network<double> nd(mc);
    Network<float> nf(mc);
    nd.set_batch(model::make_batch<double>(mc, 1, 2, model::all_ids(4)));
    nf.set_batch(model::make_batch<float>(mc, 1, 2, model::all_ids(4)));
    const auto gd = grads_of(nd, pd, 1.0);
    std::vector<std::vector<std::vector<float>>> pf(pd.size());
    for (std::size_t u = 0; u < pd.size(); ++u) {
      for (const auto& v : pd[u]) pf[u].emplace_back(v.begin(), v.end());
    }
    for (std::size_t u = 0; u < pf.size(); ++u) {
      std::vector<const float*> ptrs;
      for (const auto& v : pf[u]) ptrs.push_back(v.data());
      nf.forward(u, ptrs);
    }
    CHECK(static_cast<double>(nf.loss()) == Approx(nd.loss()).epsilon(1e-6));
    for (std::size_t u = pf.size(); u-- > 0;) {
      std::vector<const float*> ptrs;
      std::vector<std::vector<float>> g(pf[u].size());
      std::vector<float*> gptrs;
      for (std::size_t k = 0; k < pf[u].size(); ++k) {
        ptrs.push_back(pf[u][k].data());
        g[k].assign(pf[u][k].size(), 0.0f);
        gptrs.push_back(g[k].data());
      }
      nf.backward(u, ptrs, gptrs, 1.0f);
      for (std::size_t k = 0; k < g.size(); ++k) {
        INFO(units[u].params[k].name);
        CHECK(test::norm_rel_error(g[k], gd[u][k]) < 1e-5);
      }
    }
  }
}

TEST_CASE("the global batch is the same for every world size and accumulation", "[reference][data]") {
  const ModelConfig mc = tiny_transformer();
  const auto whole = model::make_batch<float>(mc, 4, 9, model::all_ids(12));
  for (int world : {1, 2, 3, 4}) {
    for (int gas : {1, 3}) {
      if (12 % (world * gas) != 0) continue;
      const int mb = 12 / (world * gas);
      std::vector<int> seen(12, 0);
      for (int r = 0; r < world; ++r) {
        for (int m = 0; m < gas; ++m) {
          const auto ids = model::micro_batch_ids(r, world, m, mb);
          const auto part = model::make_batch<float>(mc, 4, 9, ids);
          for (std::size_t j = 0; j < ids.size(); ++j) {
            const auto id = static_cast<std::size_t>(ids[j]);
            ++seen[id];
            const std::size_t row = static_cast<std::size_t>(mc.seq_len) * static_cast<std::size_t>(mc.d_in);
            for (std::size_t e = 0; e < row; ++e) CHECK(part.x[j * row + e] == whole.x[id * row + e]);
          }
        }
      }
      for (int s : seen) CHECK(s == 1);
    }
  }
  // Different steps give different data.
  CHECK(model::make_batch<float>(mc, 4, 10, model::all_ids(1)).x !=
        model::make_batch<float>(mc, 4, 9, model::all_ids(1)).x);
}

TEST_CASE("reference init is the counter RNG stored in fp32", "[reference]") {
  ParamSpec p;
  p.name = "blocks.1.attn.qkv.weight";
  p.shape = {3, 5};
  p.init = ParamInit::normal({.mean = 0.1, .std = 0.02});
  const auto v = test::reference_init(p, 42);
  const CounterRng rng(42, hash_name(p.name));
  for (std::size_t i = 0; i < v.size(); ++i) {
    CHECK(v[i] == static_cast<double>(static_cast<float>(0.1 + 0.02 * rng.normal(i))));
  }
  p.init = ParamInit::uniform({.low = -0.5, .high = 0.25});
  const auto u = test::reference_init(p, 42);
  for (std::size_t i = 0; i < u.size(); ++i) {
    CHECK(u[i] == static_cast<double>(static_cast<float>(-0.5 + 0.75 * rng.uniform(i))));
  }
}

TEST_CASE("reference LR schedules on hand-computed points", "[reference][lr]") {
  config::Config c = base_config(config::OptimizerType::adamw);
  c.optimizer->lr = 5e-3;
  CHECK(test::reference_lr(c, 7).lr == 5e-3);  // no scheduler: the optimizer's lr

  config::SchedulerConfig s;
  s.type = config::SchedulerType::warmup_lr;
  s.warmup_min_lr = 1e-4;
  s.warmup_max_lr = 1e-3;
  s.warmup_num_steps = 10;
  c.scheduler = s;
  CHECK(test::reference_lr(c, -1).lr == 1e-4);
  CHECK(test::reference_lr(c, 0).lr == Approx(1e-4));
  CHECK(test::reference_lr(c, 4).lr == Approx(1e-4 + 9e-4 * std::log(5.0) / std::log(10.0)));
  CHECK(test::reference_lr(c, 10).lr == Approx(1e-3));
  c.scheduler->warmup_type = config::WarmupType::linear;
  CHECK(test::reference_lr(c, 5).lr == Approx(1e-4 + 9e-4 * 0.5));
  c.scheduler->warmup_num_steps = 1;  // N = max(2, 1)
  CHECK(test::reference_lr(c, 1).lr == Approx(1e-4 + 9e-4 * 0.5));

  c.scheduler->type = config::SchedulerType::warmup_decay_lr;
  c.scheduler->warmup_num_steps = 4;
  c.scheduler->total_num_steps = 12;
  CHECK(test::reference_lr(c, 4).lr == Approx(1e-4 + 9e-4 * 1.0));  // (12 - 4) / 8
  CHECK(test::reference_lr(c, 8).lr == Approx(1e-4 + 9e-4 * 0.5));  // (12 - 8) / 8
  CHECK(test::reference_lr(c, 20).lr == Approx(1e-4));              // clamped at 0

  c.scheduler->type = config::SchedulerType::warmup_cosine_lr;
  c.scheduler->warmup_min_ratio = 0.1;
  c.scheduler->cos_min_ratio = 0.01;
  CHECK(test::reference_lr(c, -1).lr == 0.0);                                    // step 1 runs with lr = 0
  CHECK(test::reference_lr(c, 2).lr == Approx(5e-3 * (0.1 + 0.5 * 0.9)));        // linear warmup, 2 / 4
  CHECK(test::reference_lr(c, 3 + 4).lr == Approx(5e-3 * (0.01 + 0.99 * 0.5)));  // p = 4 / 8: cos = 0
  CHECK(test::reference_lr(c, 100).lr == Approx(5e-3 * 0.01));

  c.scheduler->type = config::SchedulerType::one_cycle;
  c.scheduler->cycle_min_lr = 1e-4;
  c.scheduler->cycle_max_lr = 1e-3;
  c.scheduler->cycle_first_step_size = 4;
  c.scheduler->cycle_second_step_size = 4;
  c.scheduler->cycle_min_mom = 0.8;
  c.scheduler->cycle_max_mom = 0.9;
  c.scheduler->decay_step_size = 2;
  c.scheduler->decay_lr_rate = 0.5;
  c.scheduler->decay_mom_rate = 0.1;
  auto r = test::reference_lr(c, -1);
  CHECK(r.lr == 1e-4);
  REQUIRE(r.betas);
  CHECK((*r.betas)[0] == 0.8);
  CHECK((*r.betas)[1] == 0.99);
  r = test::reference_lr(c, 1);  // b = 2: halfway up
  CHECK(r.lr == Approx(5.5e-4));
  CHECK((*r.betas)[0] == Approx(0.85));
  r = test::reference_lr(c, 3);  // b = 4: the top
  CHECK(r.lr == Approx(1e-3));
  CHECK((*r.betas)[0] == Approx(0.8));
  r = test::reference_lr(c, 5);  // b = 6: halfway down
  CHECK(r.lr == Approx(5.5e-4));
  r = test::reference_lr(c, 9);  // decay: d = 2, d / size = 1
  CHECK(r.lr == Approx(1e-4 / 1.5));
  CHECK((*r.betas)[0] == Approx(0.9 * 1.1));
  c.scheduler->cycle_first_stair_count = 2;
  c.scheduler->cycle_second_stair_count = 2;
  CHECK(test::reference_lr(c, 0).lr == Approx(1e-4));               // pos = 1 * 2 / 4 = 0.5: floor 0
  CHECK(test::reference_lr(c, 1).lr == Approx(1e-4 + 9e-4 * 0.5));  // pos = 1

  c.scheduler->type = config::SchedulerType::lr_range_test;
  c.scheduler->lr_range_test_min_lr = 1e-3;
  c.scheduler->lr_range_test_step_size = 2;
  c.scheduler->lr_range_test_step_rate = 1.0;
  CHECK(test::reference_lr(c, -1).lr == 1e-3);
  CHECK(test::reference_lr(c, 0).lr == Approx(1.5e-3));
  c.scheduler->lr_range_test_staircase = true;
  CHECK(test::reference_lr(c, 0).lr == Approx(1e-3));
  CHECK(test::reference_lr(c, 3).lr == Approx(3e-3));
}

TEST_CASE("reference loss scaler follows DeepSpeed's update_scale", "[reference][scaler]") {
  config::Config c = base_config(config::OptimizerType::adamw);
  {
    test::RefLossScaler none(c);
    none.update(true);
    CHECK(none.scale() == 1.0);
  }
  c.fp16.enabled = true;
  c.fp16.initial_scale_power = 4;
  c.fp16.loss_scale_window = 3;
  c.fp16.hysteresis = 2;
  c.fp16.min_loss_scale = 4;
  test::RefLossScaler s(c);
  CHECK(s.scale() == 16.0);
  for (int i = 0; i < 3; ++i) s.update(false);
  CHECK(s.scale() == 16.0);
  s.update(false);  // iter 3: stable = 3, a multiple of the window
  CHECK(s.scale() == 32.0);
  s.update(true);  // hysteresis 2 -> 1: scale kept
  CHECK(s.scale() == 32.0);
  s.update(true);  // now halved
  CHECK(s.scale() == 16.0);
  s.update(true);
  CHECK(s.scale() == 8.0);
  s.update(true);
  CHECK(s.scale() == 4.0);
  CHECK_THROWS(s.update(true));  // overflow at the minimum: DeepSpeed aborts

  c.fp16.loss_scale = 128.0;  // static
  test::RefLossScaler fixed(c);
  fixed.update(true);
  CHECK(fixed.scale() == 128.0);
}

TEST_CASE("reference optimizers: one step by hand", "[reference][optim]") {
  ModelConfig mc;
  mc.arch = Arch::mlp;
  mc.d_in = 3;
  mc.d_model = 4;
  mc.layers = 1;
  mc.d_out = 2;
  auto units = model::model_units(mc);
  units[0].params[0].lr_scale = 0.5;     // layers.0.weight
  units[1].params[0].trainable = false;  // head.weight
  for (auto type : {config::OptimizerType::adam, config::OptimizerType::adamw, config::OptimizerType::lion,
                    config::OptimizerType::adagrad}) {
    config::Config c = base_config(type);
    c.optimizer->decoupled_weight_decay = type != config::OptimizerType::adam;
    c.optimizer->betas = {0.9, 0.99};
    test::ReferenceTrainer ref(c, mc, units, 5);
    std::vector<std::vector<double>> before;
    for (const auto& name : ref.param_names()) before.push_back(ref.master(name));
    const test::RefStep r = ref.step();
    CHECK(r.applied);
    CHECK(r.lr == 1e-2);
    double sq = 0.0;
    for (const auto& name : ref.param_names()) {
      if (!ref.spec(name).trainable) continue;
      for (double g : ref.grad(name)) sq += g * g;
    }
    CHECK(r.grad_norm == Approx(std::sqrt(sq)).epsilon(1e-14));
    for (std::size_t k = 0; k < ref.param_names().size(); ++k) {
      const std::string& name = ref.param_names()[k];
      const ParamSpec& spec = ref.spec(name);
      const std::vector<double>& g = ref.grad(name);
      const std::vector<double>& p1 = ref.master(name);
      INFO(fmt::format("{} {}", config::to_string(type), name));
      const double lr = 1e-2 * spec.lr_scale;
      const double wd = spec.weight_decay ? 0.1 : 0.0;
      for (std::size_t i = 0; i < g.size(); ++i) {
        const double p0 = before[k][i];
        double expect = p0;
        if (spec.trainable) {
          switch (type) {
            case config::OptimizerType::adam: {  // L2: g' = g + wd p; first step moves by lr g'/(|g'| + eps)
              const double gg = g[i] + wd * p0;
              expect = p0 - lr * gg / (std::fabs(gg) + 1e-8);
              break;
            }
            case config::OptimizerType::adamw:
              expect = p0 - lr * wd * p0 - lr * g[i] / (std::fabs(g[i]) + 1e-8);
              break;
            case config::OptimizerType::lion:
              expect = p0 * (1.0 - lr * wd) - lr * (g[i] > 0 ? 1.0 : -1.0);
              break;
            case config::OptimizerType::adagrad: {
              const double gg = g[i] + wd * p0;
              expect = p0 - lr * gg / (std::fabs(gg) + 1e-10);
              break;
            }
          }
        }
        CHECK(p1[i] == Approx(expect).epsilon(1e-12).margin(1e-15));
      }
    }
  }
}

TEST_CASE("reference clipping and skipped steps", "[reference][clip]") {
  const ModelConfig mc = tiny_transformer();
  const auto units = model::model_units(mc);
  config::Config c = base_config(config::OptimizerType::adamw);
  c.optimizer->weight_decay = 0.0;
  c.gradient_clipping = 1e-3;
  c.fp16.enabled = true;
  c.fp16.initial_scale_power = 8;
  c.fp16.hysteresis = 1;
  test::ReferenceTrainer ref(c, mc, units, 5);
  const std::string name = ref.param_names().front();
  const std::vector<double> p0 = ref.master(name);
  const test::RefStep skipped = ref.step(/*overflow=*/true);
  CHECK_FALSE(skipped.applied);
  CHECK(skipped.loss_scale == 256.0);
  CHECK(skipped.next_loss_scale == 128.0);
  CHECK(ref.master(name) == p0);
  CHECK(ref.skipped_steps() == 1);
  const test::RefStep r = ref.step();
  REQUIRE(r.applied);
  CHECK(r.grad_norm > 1e-3);
  CHECK(r.clip_coef == Approx((r.grad_norm + 1e-6) / 1e-3));
  // The first Adam step is sign-like whatever the clip; the moment shows the clipped gradient.
  const std::vector<double>& m = ref.state1(name);
  const std::vector<double>& g = ref.grad(name);
  for (std::size_t i = 0; i < m.size(); ++i) CHECK(m[i] == Approx(0.1 * g[i] / r.clip_coef).epsilon(1e-12));
}
