// The engine's refusals and accessors: config checks that name the key, API misuse as a UsageError naming
// the unit or param, ParamInit's named arguments, step() without a closed GradScope; the bootstrap and state
// accessors, and host compute through launch_host.
#include <catch2/catch.hpp>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "api_fixtures.hpp"
#include "device_staging.hpp"

using namespace zero3;
using namespace zero3::test::engine_api;
using Catch::Matchers::Contains;

TEST_CASE("config checks name the key", "[engine][errors]") {
  ConfigText stage2;  // not implemented: the parser lets it through, the engine must refuse it
  stage2.stage = 2;
  stage2.allow_not_implemented = true;
  check_throws<ConfigError>([&] { make_engine(stage2); }, {"zero_optimization.stage", "2"});
  ConfigText no_optimizer;
  no_optimizer.allow_not_implemented = true;
  no_optimizer.optimizer.clear();
  check_throws<ConfigError>([&] { make_engine(no_optimizer); }, {"optimizer"});
  ConfigText offload;
  offload.allow_not_implemented = true;
  offload.zero = R"("offload_optimizer": {"device": "nvme", "nvme_path": "/tmp", "ratio": 0.5})";
  check_throws<ConfigError>([&] { make_engine(offload); }, {"offload_optimizer.ratio", "nvme"});
  offload.zero = R"("offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"})";
  offload.top = R"("aio": {"block_size": 1000})";
  check_throws<ConfigError>([&] { make_engine(offload); }, {"aio.block_size", "4096"});
  offload.top.clear();
  offload.zero = R"("offload_param": {"device": "nvme", "nvme_path": "/tmp"})";
  check_throws<ConfigError>([&] { make_engine(offload); }, {"offload_param", "nvme"});
  // And with nothing handed in, the engine makes its own device, bootstrap and communicator.
  Engine own(session_config(ConfigText{}), env().world);
  declare(own, {flat_unit("solo", 100)});
  CHECK(own.communicator().size() == world_size());
  CHECK(own.device().kind() == test::test_device_kind());
  CHECK(own.gather_tensor("solo.w", TensorKind::param).size() == 100);
}

TEST_CASE("API misuse is a UsageError naming the unit or param", "[engine][errors]") {
  ConfigText text;
  text.zero = R"("stage3_param_persistence_threshold": 10)";
  auto e = make_engine(text);
  e->add_unit(flat_unit("a", 100));
  e->add_unit(unit("b", {param("b.w", {100}, ParamInit::normal({.std = 0.1})),
                         param("b.frozen", {20}, ParamInit::ones(), /*trainable=*/false)}));
  e->add_unit(flat_unit("p", 4));  // persistent
  check_throws<UsageError>([&] { e->add_unit(flat_unit("a", 5)); }, {"'a'", "already declared"});
  check_throws<UsageError>([&] { e->add_unit(unit("c", {param("b.w", {3}, ParamInit::ones())})); }, {"'c'", "'b.w'"});
  check_throws<UsageError>(
      [&] {
        e->add_unit(unit("d", {param("d.w", {3, -1}, ParamInit::ones())}));
      },
      {"'d.w'", "negative"});
  check_throws<UsageError>([&] { e->gather("a"); }, {"gather('a')", "finalize"});
  check_throws<UsageError>([&] { e->gather_tensor("a.w", TensorKind::param); }, {"'a.w'", "finalize"});
  e->finalize();
  check_throws<UsageError>([&] { e->finalize(); }, {"finalize"});
  check_throws<UsageError>([&] { e->add_unit(flat_unit("late", 5)); }, {"'late'", "after finalize"});
  check_throws<UsageError>([&] { e->gather("nope"); }, {"'nope'"});
  check_throws<UsageError>([&] { e->grads("a"); }, {"grads('a')", "GatherScope"});
  check_throws<UsageError>([&] { e->gather_tensor("nope.w", TensorKind::master); }, {"'nope.w'"});
  check_throws<UsageError>([&] { e->gather_tensor("b.frozen", TensorKind::grad); }, {"'b.frozen'", "frozen"});
  check_throws<UsageError>([&] { e->gather_tensor("b.frozen", TensorKind::exp_avg); }, {"'b.frozen'", "frozen"});
  {
    auto gb = e->gather("b");
    check_throws<UsageError>([&] { (void)gb.param("nope"); }, {"'b'", "'nope'"});
    check_throws<UsageError>([&] { (void)gb.param("a.w"); }, {"'b'", "'a.w'", "belongs to unit 'a'"});
    auto gr = e->grads("b");
    check_throws<UsageError>([&] { (void)gr.grad("b.frozen"); }, {"'b.frozen'", "'b'", "frozen"});
    check_throws<UsageError>([&] { e->grads("b"); }, {"'b'", "already open"});
    check_throws<UsageError>([&] { e->step(); }, {"step()", "'b'"});
    CHECK(gr.grad("b.w").count == 100);
    gr.close();
    check_throws<UsageError>([&] { (void)gr.grad("b.w"); }, {"'b'", "closed"});
    gb.close();
    check_throws<UsageError>([&] { (void)gb.param("b.w"); }, {"'b'", "closed"});
  }
  // Closed out of order, explicitly: the close throws, naming both units.
  {
    auto ga = e->gather("a");
    auto gb = e->gather("b");
    check_throws<UsageError>([&] { ga.close(); }, {"'a'", "'b'", "reverse order"});
    gb.close();
  }
  // ... and through destructors, which cannot throw: the engine's next call does, once.
  {
    std::optional<Engine::GatherScope> ga(e->gather("a"));
    std::optional<Engine::GatherScope> gp(e->gather("p"));
    ga.reset();
    gp.reset();
  }
  check_throws<UsageError>([&] { e->gather("a"); }, {"'a'", "'p'", "reverse order"});
  {
    auto ga = e->gather("a");  // the engine is usable again
    CHECK(ga.param("a.w").count == 100);
  }
  CHECK(e->step().boundary);

  ConfigText adagrad;
  adagrad.optimizer = R"({"type": "Adagrad", "params": {"lr": 0.01}})";
  auto ea = make_engine(adagrad);
  declare(*ea, {flat_unit("u", 300)});
  check_throws<UsageError>([&] { ea->gather_tensor("u.w", TensorKind::exp_avg); }, {"'u.w'", "exp_avg", "Adagrad"});
  CHECK(ea->gather_tensor("u.w", TensorKind::exp_avg_sq).size() == 300);  // the sum of squared gradients
}

// ParamInit's arguments are named: PyTorch's positional (mean, std) order, a missing std, or a bare number
// do not compile.
namespace {
template <typename... A>
concept normal_takes = requires(A... a) {
  ParamInit::normal(a...);
};
template <typename... A>
concept uniform_takes = requires(A... a) {
  ParamInit::uniform(a...);
};
template <typename T>
concept normal_without_std = requires {
  T{.mean = 0.0};
};
static_assert(!normal_takes<double, double>, "ParamInit::normal(0.0, 0.02) must not compile");
static_assert(!normal_takes<double>, "ParamInit::normal(0.02) must not compile");
static_assert(normal_takes<ParamInit::Normal>);
static_assert(!normal_without_std<ParamInit::Normal>, "ParamInit::normal({.mean = 0.0}) must not compile");
static_assert(!std::is_default_constructible_v<ParamInit::Normal>);
static_assert(!std::is_default_constructible_v<ParamInit::Uniform>);
static_assert(!uniform_takes<double, double>, "ParamInit::uniform(-1.0, 1.0) must not compile");
static_assert(uniform_takes<ParamInit::Uniform>);
}  // namespace

TEST_CASE("ParamInit takes named arguments, and add_unit refuses inits that cannot be made", "[engine][errors]") {
  const ParamInit pytorch_order = ParamInit::normal({.mean = 0.0, .std = 0.02});
  CHECK(pytorch_order.kind == ParamInit::Kind::normal);
  CHECK(pytorch_order.a == 0.0);   // mean
  CHECK(pytorch_order.b == 0.02);  // std
  const ParamInit std_only = ParamInit::normal({.std = 0.5});
  CHECK(std_only.a == 0.0);
  CHECK(std_only.b == 0.5);
  const ParamInit u = ParamInit::uniform({.low = -0.25, .high = 0.75});
  CHECK(u.a == -0.25);
  CHECK(u.b == 0.75);

  auto e = make_engine(ConfigText{});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const auto refused = [&](const std::string& name, ParamInit init, std::initializer_list<std::string_view> parts) {
    INFO("param " << name);
    check_throws<UsageError>([&] { e->add_unit(unit(name, {param(name + ".w", {8}, std::move(init))})); }, parts);
  };
  refused("neg_std", ParamInit::normal({.std = -0.02}), {"'neg_std'", "'neg_std.w'", "std", "-0.02"});
  refused("nan_std", ParamInit::normal({.std = nan}), {"'nan_std.w'", "std"});
  refused("inf_mean", ParamInit::normal({.mean = inf, .std = 1.0}), {"'inf_mean.w'", "mean"});
  refused("reversed", ParamInit::uniform({.low = 1.0, .high = -1.0}), {"'reversed.w'", "low <= high"});
  refused("nan_low", ParamInit::uniform({.low = nan, .high = 1.0}), {"'nan_low.w'", "uniform"});
  refused("nan_value", ParamInit::constant(nan), {"'nan_value.w'", "constant"});
  refused("no_fill", ParamInit::custom({}), {"'no_fill.w'", "fill function"});
  // None of them was declared; the edge cases that are fine are.
  e->add_unit(unit("fine", {param("fine.zero_std", {8}, ParamInit::normal({.mean = 0.5, .std = 0.0})),
                            param("fine.point", {8}, ParamInit::uniform({.low = 2.0, .high = 2.0}))}));
  CHECK(e->unit_names() == std::vector<std::string>{"fine"});
  e->finalize();
  CHECK(bitwise_equal(e->gather_tensor("fine.zero_std", TensorKind::master), std::vector<float>(8, 0.5f)));
  CHECK(bitwise_equal(e->gather_tensor("fine.point", TensorKind::master), std::vector<float>(8, 2.0f)));
}

TEST_CASE("step() needs a closed GradScope since the last step()", "[engine][errors][step]") {
  for (const int gas : {1, 2}) {
    DYNAMIC_SECTION("gradient_accumulation_steps " << gas) {
      ConfigText text;
      text.gas = gas;
      text.zero = R"("stage3_param_persistence_threshold": 0)";
      auto e = make_engine(text);
      declare(*e, {flat_unit("a", 300), unit("f", {param("f.w", {40}, ParamInit::ones(), /*trainable=*/false)})});
      const std::vector<float> before = e->gather_tensor("a.w", TensorKind::master);
      // Right after finalize(), with nothing done.
      check_throws<UsageError>([&] { e->step(); },
                               {"step() with no gradient scope closed since the last step()", "once per micro-batch"});
      // A forward alone is not a backward.
      { auto g = e->gather("a"); }
      check_throws<UsageError>([&] { e->step(); }, {"no gradient scope closed"});
      // A micro-batch, then step() twice in a row: the second is refused and changes nothing.
      for (int micro = 0; micro < gas; ++micro) {
        forward_backward(*e, {"a", "f"}, micro);
        const StepResult r = e->step();
        CHECK(r.boundary == (micro == gas - 1));
        check_throws<UsageError>([&] { e->step(); },
                                 {"no gradient scope closed",
                                  gas == 1 ? "move the weights on zero gradients" : "shift the accumulation window"});
      }
      CHECK(e->global_step() == 1);
      const std::vector<float> after = e->gather_tensor("a.w", TensorKind::master);
      CHECK_FALSE(bitwise_equal(before, after));
      // A micro-batch whose backward reaches frozen units only still opens (empty) GradScopes for them.
      for (int micro = 0; micro < gas; ++micro) {
        auto g = e->gather("f");
        auto gr = e->grads("f");
        check_throws<UsageError>([&] { (void)gr.grad("f.w"); }, {"frozen"});
        gr.close();
        g.close();
        CHECK(e->step().boundary == (micro == gas - 1));
      }
      CHECK(e->global_step() == 2);
      CHECK(e->stats().last_step_reduce_scatter_elems == 0);
    }
  }
}

TEST_CASE("engine accessors: bootstrap and the state view", "[engine]") {
  auto e = make_engine(ConfigText{});
  CHECK(e->bootstrap() == env().bootstrap);
  check_throws<UsageError>([&] { (void)e->state().local_slices(true); }, {"finalize"});
  declare(*e, {flat_unit("a", 100)});
  const EngineState state = e->state();
  CHECK(state.keeps_state(TensorKind::exp_avg));
  CHECK(state.training_state().global_step == 0);
  std::uint64_t kept = 0;
  for (const ParamSlice& s : state.local_slices(false)) kept += s.count;
  CHECK(kept <= 100);
}

// Host compute on the compute stream, as engine.hpp and docs/engine.md show it: every read of a scope's
// memory is a launch_host function enqueued while the scope is open.
TEST_CASE("host compute through launch_host sees the gathered params and writes the gradients", "[engine][host]") {
  if (test::test_device_kind() != DeviceKind::host) return;  // host functions cannot read device memory
  ConfigText text;
  text.zero = R"("stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0)";
  auto e = make_engine(text);
  declare(*e, {flat_unit("fc", 1000)});
  Engine& engine = *e;
  double loss = 0.0;
  {
    auto g = engine.gather("fc");
    const BufferView w = g.param("fc.w");
    engine.compute_stream().launch_host([w, &loss] {  // runs once the gather has landed
      const float* x = w.as<const float>();
      for (std::size_t i = 0; i < w.count; ++i) loss += 0.5 * x[i] * x[i];
    });
    auto gr = engine.grads("fc");
    const BufferView dw = gr.grad("fc.w");
    engine.compute_stream().launch_host([w, dw, m = engine.loss_multiplier()] {  // after the zero fill
      for (std::size_t i = 0; i < dw.count; ++i) dw.as<float>()[i] = static_cast<float>(m) * w.as<const float>()[i];
    });
  }
  engine.compute_stream().synchronize();
  const std::vector<float> w = engine.gather_tensor("fc.w", TensorKind::param);
  double expected_loss = 0.0;
  for (const float x : w) expected_loss += 0.5 * x * x;
  CHECK(loss == expected_loss);
  const std::vector<float> grad = engine.gather_tensor("fc.w", TensorKind::grad);  // the mean over ranks of w
  REQUIRE(grad.size() == w.size());
  int bad = 0;
  for (std::size_t i = 0; i < w.size(); ++i) bad += std::fabs(grad[i] - w[i]) > 1e-6f * std::fabs(w[i]) ? 1 : 0;
  CHECK(bad == 0);
  CHECK(engine.step().applied);
}
