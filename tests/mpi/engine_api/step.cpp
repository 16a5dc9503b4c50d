// The optimizer step: an fp16 overflow skips it and leaves every state untouched, and the first step of
// AdamW (with lr_scale) and of every other optimizer type moves each param against its gradient.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "api_fixtures.hpp"
#include "zero3/core/dtype.hpp"

using namespace zero3;
using namespace zero3::test::engine_api;
using Catch::Matchers::Contains;

TEST_CASE("fp16 overflow skips the step and leaves every state untouched", "[engine][step]") {
  ConfigText text;
  text.top = R"("fp16": {"enabled": true, "initial_scale_power": 16, "hysteresis": 2})";
  text.zero = R"("stage3_param_persistence_threshold": 50)";
  text.clipping = 1.0;
  auto e = make_engine(text);
  const std::vector<UnitSpec> units = {flat_unit("s", 1536), flat_unit("p", 40)};
  declare(*e, units);
  const std::vector<std::string> order = names(units);
  const auto snapshot = [&] {
    std::vector<std::vector<float>> all;
    for (const char* p : {"s.w", "p.w"}) {
      for (TensorKind k : {TensorKind::param, TensorKind::master, TensorKind::exp_avg, TensorKind::exp_avg_sq}) {
        all.push_back(e->gather_tensor(p, k));
      }
    }
    return all;
  };
  // Backward with an Inf written by the last rank only.
  const auto overflow_window = [&](int micro) {
    for (const std::string& u : order) {
      auto g = e->gather(u);
    }
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      auto g = e->gather(*it);
      auto gr = e->grads(*it);
      const ParamSpec p = e->unit_params(*it)[0];
      std::vector<float> v = grad_values(p, rank(), micro);
      if (*it == "s" && rank() == world_size() - 1) v[5] = std::numeric_limits<float>::infinity();
      write(*e, gr.grad(p.name), v);
    }
  };

  forward_backward(*e, order, 0);
  StepResult r = e->step();
  CHECK(r.applied);
  CHECK(r.loss_scale == 65536.0);
  CHECK(e->loss_multiplier() == 65536.0);
  const auto before = snapshot();

  overflow_window(1);
  r = e->step();
  CHECK(r.boundary);
  CHECK_FALSE(r.applied);
  CHECK_FALSE(std::isfinite(r.grad_norm));
  CHECK(r.loss_scale == 65536.0);
  CHECK(r.next_loss_scale == 65536.0);  // hysteresis 2: the first overflow only uses up the delay
  CHECK(r.global_step == 2);
  CHECK(r.skipped_steps == 1);
  const auto after = snapshot();
  REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < before.size(); ++i) CHECK(bitwise_equal(before[i], after[i]));
  CHECK(bitwise_equal(e->gather_tensor("s.w", TensorKind::grad), std::vector<float>(1536, 0.0f)));

  overflow_window(2);
  r = e->step();
  CHECK_FALSE(r.applied);
  CHECK(r.next_loss_scale == 32768.0);
  CHECK(e->skipped_steps() == 2);

  forward_backward(*e, order, 3);
  r = e->step();
  CHECK(r.applied);
  CHECK(r.loss_scale == 32768.0);
  CHECK(e->global_step() == 4);
  CHECK_FALSE(bitwise_equal(e->gather_tensor("s.w", TensorKind::master), before[1]));
}

TEST_CASE("the first AdamW step moves each param by lr (times lr_scale) against its gradient", "[engine][step]") {
  ConfigText text;
  text.optimizer = R"({"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}})";
  text.zero = R"("stage3_param_persistence_threshold": 50)";
  auto e = make_engine(text);
  ParamSpec scaled = param("u.scaled", {300}, ParamInit::normal({.std = 1.0}));
  scaled.lr_scale = 0.5;
  ParamSpec no_decay = param("u.bias", {77}, ParamInit::normal({.std = 1.0}));
  no_decay.weight_decay = false;
  const std::vector<UnitSpec> units = {
      unit("u", {param("u.w", {500}, ParamInit::normal({.std = 1.0})), scaled, no_decay}),
      unit("p", {param("p.w", {30}, ParamInit::normal({.std = 1.0}))})};
  declare(*e, units);
  std::vector<std::vector<float>> before;
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) before.push_back(e->gather_tensor(p.name, TensorKind::master));
  }
  forward_backward(*e, names(units), 0);
  const StepResult r = e->step();
  CHECK(r.applied);
  CHECK(r.lr == Approx(0.01));
  double norm_sq = 0.0;
  std::size_t k = 0;
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) {
      INFO("param " << p.name);
      const std::vector<float> after = e->gather_tensor(p.name, TensorKind::master);
      const std::vector<float>& old = before[k++];
      const double lr = 0.01 * p.lr_scale;
      const double wd = p.weight_decay ? 0.1 : 0.0;
      int bad = 0;
      for (std::size_t i = 0; i < after.size(); ++i) {
        double g = 0.0;
        for (int q = 0; q < world_size(); ++q) g += grad_value(p.name, q, 0, i);
        g /= world_size();
        norm_sq += g * g;
        // Step 1 of Adam: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps); decay uses the old p.
        const double expected = old[i] - lr * wd * old[i] - lr * g / (std::fabs(g) + 1e-8);
        if (std::fabs(after[i] - expected) > 1e-5 * std::max(1.0, std::fabs(expected))) ++bad;
      }
      CHECK(bad == 0);
      CHECK(bitwise_equal(e->gather_tensor(p.name, TensorKind::param), after));  // fp32: the param is the master
    }
  }
  CHECK(r.grad_norm == Approx(std::sqrt(norm_sq)).epsilon(1e-5));
}

TEST_CASE("every optimizer type takes its first step against the gradient", "[engine][step]") {
  // Step 1 of each is lr * sign(g) up to eps (0 for g = 0): Adam's m_hat / sqrt(v_hat), Lion's sign of the
  // interpolation, Adagrad's g / sqrt(g^2). Clipping is off and weight decay 0, so nothing else moves the params.
  const char* optimizers[] = {
      R"({"type": "Adam", "params": {"lr": 0.01, "adam_w_mode": false}})",
      R"({"type": "Lion", "params": {"lr": 0.01}})",
      R"({"type": "Adagrad", "params": {"lr": 0.01}})",
  };
  for (const char* optimizer : optimizers) {
    DYNAMIC_SECTION(optimizer) {
      ConfigText text;
      text.optimizer = optimizer;
      text.zero = R"("stage3_param_persistence_threshold": 50, "reduce_bucket_size": 512)";
      auto e = make_engine(text);
      const std::vector<UnitSpec> units = {flat_unit("a", 1000), flat_unit("p", 33), flat_unit("b", 450)};
      declare(*e, units);
      std::vector<std::vector<float>> before;
      before.reserve(units.size());
      for (const UnitSpec& u : units) before.push_back(e->gather_tensor(u.params[0].name, TensorKind::master));
      forward_backward(*e, names(units), 0);
      CHECK(e->step().applied);
      for (std::size_t k = 0; k < units.size(); ++k) {
        const ParamSpec& p = units[k].params[0];
        INFO("param " << p.name);
        const std::vector<float> after = e->gather_tensor(p.name, TensorKind::master);
        int bad = 0;
        for (std::size_t i = 0; i < after.size(); ++i) {
          double g = 0.0;
          for (int q = 0; q < world_size(); ++q) g += grad_value(p.name, q, 0, i);
          const double sign = g > 0 ? 1.0 : g < 0 ? -1.0 : 0.0;  // the ranks' values may cancel out
          const double expected = before[k][i] - 0.01 * sign;
          if (std::fabs(after[i] - expected) > 1e-5 * std::max(1.0, std::fabs(expected))) ++bad;
        }
        CHECK(bad == 0);
      }
      if (std::string_view(optimizer).find("Lion") != std::string_view::npos) {
        check_throws<UsageError>([&] { e->gather_tensor("a.w", TensorKind::exp_avg_sq); }, {"'a.w'", "exp_avg_sq"});
      }
    }
  }
}
