// Mechanics of the ZeRO-3 engine at any world size, on the device ZERO3_TEST_DEVICE names (host by default;
// tests/support/device_staging.hpp) with the MPI communicator (host) or NCCL (cuda): init
// from the counter RNG (identical for every world size), API misuse errors, gather/release and prefetch
// against the live budget, trace rebuilds, communication volume, gradient accumulation and reduction,
// fp16 overflow skips and the first optimizer step. (The model-level float64 equivalence is
// test_engine_equivalence.cpp.) Every collective call is unconditional on every rank and results are
// checked with CHECK afterwards, so a failure on one rank cannot leave the others waiting.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "device_staging.hpp"
#include "engine_fixtures.hpp"
#include "mpi_test_env.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/engine/engine.hpp"

using namespace zero3;
using Catch::Matchers::Contains;

namespace {

test::MpiTestEnv& env() {
  return test::mpi_env();
}
int world_size() {
  return env().world.size;
}
int rank() {
  return env().world.rank;
}

// Chosen by rank 0 (ZERO3_TEST_SEED, or the clock), the same on every rank: a fresh model every run.
std::uint64_t session_seed() {
  static const std::uint64_t seed = [] {
    std::uint64_t s = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) % 1000003;
    // NOLINTNEXTLINE(concurrency-mt-unsafe): read once, before any thread changes the environment
    if (const char* fixed = std::getenv("ZERO3_TEST_SEED")) s = std::strtoull(fixed, nullptr, 10);
    std::vector<std::byte> bytes(sizeof s);
    std::memcpy(bytes.data(), &s, sizeof s);
    env().bootstrap->broadcast(bytes, 0);
    std::memcpy(&s, bytes.data(), sizeof s);
    if (rank() == 0)
      std::printf("engine tests: seed %llu (ZERO3_TEST_SEED repeats it)\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

// ---- configs

// At world size 1 the engine uses units in place (zero3.single_rank_in_place) and gathers nothing; the tests
// of gathers, prefetch and communication volume ask for the sharded path, which larger worlds take anyway.
constexpr const char* kShardedPath = R"("single_rank_in_place": false)";

using test::ConfigText;

// The config of `text` with this session's seed.
config::Config session_config(ConfigText text) {
  text.seed = session_seed();
  return text.parse();
}

// An unfinalized engine for `text` on a device the test makes and hands over, as an embedder may.
std::unique_ptr<Engine> make_engine(const ConfigText& text) {
  return test::make_engine(session_config(text), {.device_from_test = true});
}

// ---- models

ParamSpec param(std::string name, std::vector<std::int64_t> shape, ParamInit init, bool trainable = true) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.init = std::move(init);
  p.trainable = trainable;
  return p;
}

UnitSpec unit(std::string name, std::vector<ParamSpec> params) {
  return {std::move(name), std::move(params)};
}

// A unit of one trainable param of n elements.
UnitSpec flat_unit(const std::string& name, std::int64_t n) {
  return unit(name, {param(name + ".w", {n}, ParamInit::normal({.std = 0.02}))});
}

void declare(Engine& e, const std::vector<UnitSpec>& units) {
  for (const UnitSpec& u : units) e.add_unit(u);
  e.finalize();
}

// What the engine must produce for element `index` of `p`: computed here straight from the counter RNG.
float expected_init(const ParamSpec& p, std::uint64_t seed, std::uint64_t index) {
  const CounterRng rng(seed, hash_name(p.name));
  switch (p.init.kind) {
    case ParamInit::Kind::normal:
      return static_cast<float>(p.init.a + p.init.b * rng.normal(index));
    case ParamInit::Kind::uniform:
      return static_cast<float>(p.init.a + (p.init.b - p.init.a) * rng.uniform(index));
    case ParamInit::Kind::constant:
      return static_cast<float>(p.init.a);
    case ParamInit::Kind::custom: {
      float v = 0.0f;
      p.init.fill(index, std::span<float>(&v, 1));
      return v;
    }
  }
  return 0.0f;
}

// ---- device data through staging copies on the compute stream (the engine's buffers are written and read
// in stream order; the same path on the host device and on CUDA)

void write(Engine& e, BufferView v, const std::vector<float>& values) {
  REQUIRE(values.size() == v.count);
  test::upload_floats(e.device(), e.compute_stream(), v, values);
}

std::vector<float> read(Engine& e, BufferView v) {
  return test::download_floats(e.device(), e.compute_stream(), v);
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Gradient value k / 64 with k in [-200, 200] \ {0}: exact in fp32, fp16 and bf16, so sums over ranks are exact.
float grad_value(std::string_view name, int r, int micro, std::size_t i) {
  const std::uint64_t h = mix(mix(mix(session_seed() ^ hash_name(name)) + static_cast<std::uint64_t>(r)) +
                              static_cast<std::uint64_t>(micro) * 1000003u + i);
  int k = static_cast<int>(h % 400) - 200;
  if (k >= 0) ++k;
  return static_cast<float>(k) / 64.0f;
}

std::vector<float> grad_values(const ParamSpec& p, int r, int micro) {
  std::vector<float> v(p.numel());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = grad_value(p.name, r, micro, i);
  return v;
}

// One micro-step: forward over `order`, then backward in reverse, writing this rank's gradients of
// micro-step `micro` into every trainable param.
void forward_backward(Engine& e, const std::vector<std::string>& order, int micro) {
  for (const std::string& u : order) {
    auto g = e.gather(u);
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    auto g = e.gather(*it);
    auto gr = e.grads(*it);
    for (const ParamSpec& p : e.unit_params(*it)) {
      if (p.trainable) write(e, gr.grad(p.name), grad_values(p, rank(), micro));
    }
  }
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Asserts that f throws exactly E (or a subclass) whose message contains every part.
template <typename E, typename F>
void check_throws(F&& f, std::initializer_list<std::string_view> parts) {
  try {
    f();
    FAIL_CHECK("no exception was thrown");
  } catch (const E& e) {
    for (std::string_view part : parts) CHECK_THAT(e.what(), Contains(std::string(part)));
  } catch (const std::exception& e) {
    FAIL_CHECK("unexpected exception type: " << e.what());
  }
}

std::vector<std::string> names(const std::vector<UnitSpec>& units) {
  std::vector<std::string> out;
  out.reserve(units.size());
  for (const UnitSpec& u : units) out.push_back(u.name);
  return out;
}

}  // namespace

// ------------------------------------------------------------------------------------------------ init

TEST_CASE("init: every param equals the counter RNG's values, for any world size", "[engine][init]") {
  const std::uint64_t seed = session_seed();
  const std::vector<UnitSpec> units = {
      unit("embed", {param("embed.weight", {37, 29}, ParamInit::normal({.std = 0.02})),
                     param("embed.bias", {29}, ParamInit::uniform({.low = -0.5, .high = 0.5})),
                     param("embed.empty", {0, 5}, ParamInit::normal({.std = 1.0}))}),
      unit("ln", {param("ln.weight", {16}, ParamInit::ones()),
                  param("ln.bias", {16}, ParamInit::uniform({.low = -1.0, .high = 1.0}))}),
      unit("nothing", {param("nothing.a", {3, 0}, ParamInit::ones()), param("nothing.b", {0}, ParamInit::zeros())}),
      unit("scalar", {param("scalar.s", {}, ParamInit::constant(0.5))}),
      unit("mixed",
           {param("mixed.w", {50, 7}, ParamInit::custom([](std::uint64_t first, std::span<float> out) {
                    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(first + i) * 0.001f;
                  })),
            param("mixed.frozen", {123}, ParamInit::uniform({.low = -1.0, .high = 1.0}), /*trainable=*/false)}),
      unit("big", {param("big.w", {300}, ParamInit::normal({.mean = 1.0, .std = 3.0}))}),
  };
  for (const std::string precision : {"", R"("bf16": {"enabled": true})"}) {
    DYNAMIC_SECTION("precision " << (precision.empty() ? "fp32" : "bf16")) {
      ConfigText text;
      text.zero = R"("stage3_param_persistence_threshold": 100)";
      text.top = precision;
      auto e = make_engine(text);
      declare(*e, units);
      const EngineStats stats = e->stats();
      CHECK(stats.total_elems == 37 * 29 + 29 + 32 + 1 + 350 + 123 + 300);
      CHECK(stats.persistent_elems == 32 + 1);  // "ln", "nothing" (0 elements) and "scalar"

      for (const UnitSpec& u : units) {
        for (const ParamSpec& p : u.params) {
          std::vector<float> expected(p.numel());
          for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = expected_init(p, seed, i);
          const std::vector<float> master = e->gather_tensor(p.name, TensorKind::master);
          const std::vector<float> value = e->gather_tensor(p.name, TensorKind::param);
          INFO("param " << p.name);
          if (p.trainable || precision.empty()) {
            CHECK(bitwise_equal(master, expected));
          }
          std::vector<float> rounded = expected;
          if (!precision.empty()) {
            for (float& v : rounded) v = bf16_to_float(float_to_bf16(v));
          }
          CHECK(bitwise_equal(value, rounded));
          if (p.trainable) {
            CHECK(bitwise_equal(e->gather_tensor(p.name, TensorKind::grad), std::vector<float>(p.numel(), 0.0f)));
            CHECK(bitwise_equal(e->gather_tensor(p.name, TensorKind::exp_avg), std::vector<float>(p.numel(), 0.0f)));
          }
        }
        // The same values through a gather scope, on the compute stream.
        auto g = e->gather(u.name);
        for (const ParamSpec& p : u.params) {
          const BufferView v = g.param(p.name);
          CHECK(v.count == p.numel());
          CHECK(v.dtype == (precision.empty() ? DType::f32 : DType::bf16));
          CHECK(bitwise_equal(read(*e, v), e->gather_tensor(p.name, TensorKind::param)));
        }
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------ errors

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
  offload.zero = R"("offload_optimizer": {"device": "nvme", "nvme_path": "/tmp"})";
  check_throws<ConfigError>([&] { make_engine(offload); }, {"offload_optimizer", "nvme"});
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

// ------------------------------------------------------------------------------------------------ gathers

namespace {
// Sizes that are multiples of 64 * 12, so no unit is padded at world sizes 1-4: unpadded element counts
// (stats) and padded bytes (memory tracker) then describe the same buffers.
const std::vector<UnitSpec> kLayers = {flat_unit("l0", 768),  flat_unit("l1", 1536), flat_unit("l2", 768),
                                       flat_unit("l3", 2304), flat_unit("l4", 768),  flat_unit("l5", 1536)};
constexpr std::uint64_t kLayersTotal = 768 * 3 + 1536 * 2 + 2304;
constexpr std::uint64_t kLargest = 2304;
}  // namespace

TEST_CASE("gathers are released after use when reuse is off", "[engine][gather]") {
  ConfigText text;
  text.zero =
      R"("stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 0, "stage3_param_persistence_threshold": 0)";
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  declare(*e, kLayers);
  const std::vector<std::string> order = names(kLayers);
  for (int window = 0; window < 2; ++window) {
    for (const UnitSpec& u : kLayers) {
      auto g = e->gather(u.name);
      CHECK(e->stats().gathered_elems == u.params[0].numel());
    }
    CHECK(e->stats().gathered_elems == 0);
    forward_backward(*e, order, window);
    CHECK(e->stats().gathered_elems == 0);
    CHECK(e->step().applied);
  }
  const EngineStats s = e->stats();
  CHECK(s.last_step_all_gather_elems == 3 * kLayersTotal);  // the extra forward above, then forward and backward
  CHECK(s.gathered_peak_elems == kLargest);
  CHECK(e->memory().get(MemoryKind::device, MemCategory::param_gathered).current_bytes == 0);
}

TEST_CASE("prefetch stays within max_live_parameters", "[engine][gather]") {
  ConfigText text;
  text.zero = R"("stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 3000,
                 "stage3_max_live_parameters": 4000, "stage3_param_persistence_threshold": 0)";
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  declare(*e, kLayers);
  const std::vector<std::string> order = names(kLayers);
  forward_backward(*e, order, 0);  // records the trace
  CHECK(e->step().applied);
  e->reset_peaks();
  for (int window = 1; window < 4; ++window) {
    forward_backward(*e, order, window);
    CHECK(e->step().applied);
  }
  const EngineStats s = e->stats();
  CHECK(s.gathered_peak_elems <= 4000 + kLargest);
  CHECK(s.gathered_peak_elems > kLargest);  // prefetching did overlap gathers
  CHECK(e->memory().get(MemoryKind::device, MemCategory::param_gathered).peak_bytes <= (4000 + kLargest) * 4);
  CHECK(s.last_step_all_gather_elems == 2 * kLayersTotal);
  CHECK(s.gathered_elems == 0);
  CHECK(s.trace_rebuilds == 0);
}

TEST_CASE("a unit used again soon stays gathered (max_reuse_distance)", "[engine][gather]") {
  ConfigText text;
  text.zero = R"("stage3_param_persistence_threshold": 0)";  // reuse distance and live budget: DeepSpeed's defaults
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  declare(*e, kLayers);
  const std::vector<std::string> order = names(kLayers);
  forward_backward(*e, order, 0);
  CHECK(e->step().applied);
  CHECK(e->stats().last_step_all_gather_elems == 2 * kLayersTotal);  // no trace yet: nothing kept
  forward_backward(*e, order, 1);
  CHECK(e->step().applied);
  // The last unit of the forward is the first of the backward: kept, so gathered once. The others are
  // kept too when their next use is near enough, which with a 1e9 distance is every backward gather.
  CHECK(e->stats().last_step_all_gather_elems == kLayersTotal);
  CHECK(e->stats().gathered_elems == 0);  // all released at the step: the gathered copies are stale
}

TEST_CASE("a changed gather order rebuilds the trace once", "[engine][gather]") {
  ConfigText text;
  text.zero = R"("stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 3000,
                 "stage3_max_live_parameters": 5000, "stage3_param_persistence_threshold": 0)";
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  declare(*e, kLayers);
  std::vector<std::string> order = names(kLayers);
  for (int window = 0; window < 3; ++window) {
    forward_backward(*e, order, window);
    CHECK(e->step().applied);
  }
  CHECK(e->stats().trace_rebuilds == 0);
  std::swap(order[1], order[2]);
  for (int window = 3; window < 6; ++window) {
    forward_backward(*e, order, window);
    CHECK(e->step().applied);
    CHECK(e->stats().trace_rebuilds == 1);
    CHECK(e->stats().last_step_all_gather_elems == 2 * kLayersTotal);
  }
  // A shorter window (one unit left out) is a change too.
  order.pop_back();
  forward_backward(*e, order, 6);
  CHECK(e->step().applied);
  CHECK(e->stats().trace_rebuilds == 2);
}

TEST_CASE("an evaluation pass inside untraced() leaves the trace alone", "[engine][gather]") {
  ConfigText text;
  text.zero = R"("stage3_max_reuse_distance": 0, "stage3_prefetch_bucket_size": 3000,
                 "stage3_max_live_parameters": 5000, "stage3_param_persistence_threshold": 0)";
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  declare(*e, kLayers);
  const std::vector<std::string> order = names(kLayers);
  const auto eval = [&] {
    const Engine::UntracedScope untraced = e->untraced();
    for (const std::string& u : order) {
      auto g = e->gather(u);
      check_throws<UsageError>([&] { (void)e->grads(u); }, {"UntracedScope"});
    }
  };
  for (int window = 0; window < 4; ++window) {
    forward_backward(*e, order, window);
    CHECK(e->step().applied);
    eval();
  }
  CHECK(e->stats().trace_rebuilds == 0);
  CHECK(e->stats().gathered_elems == 0);
  {
    const Engine::UntracedScope untraced = e->untraced();
    check_throws<UsageError>([&] { (void)e->untraced(); }, {"already open"});
  }
  // The same pass without untraced() is a change of order (the control: the check above can fail).
  for (const std::string& u : order) auto g = e->gather(u);
  forward_backward(*e, order, 4);
  CHECK(e->step().applied);
  CHECK(e->stats().trace_rebuilds == 1);
}

TEST_CASE("wall_clock_breakdown reports the step's waits and optimizer time", "[engine][timing]") {
  for (const bool timed : {false, true}) {
    ConfigText text;
    text.zero = R"("stage3_param_persistence_threshold": 0)";
    text.top = timed ? R"("wall_clock_breakdown": true)" : R"("wall_clock_breakdown": false)";
    auto e = make_engine(text);
    declare(*e, kLayers);
    double window_ms = 0.0;  // the last window's forward/backward, and its step()
    double step_ms = 0.0;
    for (int window = 0; window < 3; ++window) {
      const auto t0 = std::chrono::steady_clock::now();
      forward_backward(*e, names(kLayers), window);
      const auto t1 = std::chrono::steady_clock::now();
      CHECK(e->step().applied);
      window_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      step_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count();
    }
    const StepTimes t = e->stats().last_step_times;
    if (timed) {
      CHECK(t.optimizer_ms > 0.0);
      // Each figure is a part of the wall time it is measured in: the gathers stall the window's
      // forward/backward, the reductions and the optimizer run inside step().
      CHECK(t.gather_wait_ms <= window_ms);
      CHECK(t.reduce_wait_ms + t.optimizer_ms <= step_ms);
    } else {
      CHECK(t.optimizer_ms == 0.0);
      CHECK(t.reduce_wait_ms == 0.0);
      CHECK(t.gather_wait_ms == 0.0);
    }
  }
}

// ------------------------------------------------------------------------------------------------ comm volume

TEST_CASE("one all-gather per use and one reduce-scatter per unit", "[engine][comm]") {
  ConfigText text;
  text.zero = R"("stage3_max_reuse_distance": 0, "stage3_param_persistence_threshold": 50)";
  text.zero3_extra = kShardedPath;
  auto e = make_engine(text);
  const std::vector<UnitSpec> units = {flat_unit("emb", 1000), flat_unit("norm", 40), flat_unit("h0", 333),
                                       flat_unit("h1", 777)};
  declare(*e, units);
  forward_backward(*e, names(units), 0);
  CHECK(e->step().applied);
  const EngineStats s = e->stats();
  CHECK(s.persistent_elems == 40);
  CHECK(s.last_step_all_gather_elems + s.last_step_reduce_scatter_elems == 3 * (s.total_elems - s.persistent_elems));
  CHECK(s.last_step_reduce_scatter_elems == s.total_elems - s.persistent_elems);
  CHECK(s.last_step_all_reduce_elems == 40);
  CHECK(s.all_gather_elems == 0);
}

// ------------------------------------------------------------------------------------------------ grads

TEST_CASE("gradients accumulate the mean over ranks of the sum over micro-steps", "[engine][grads]") {
  struct Case {
    const char* name;
    const char* top;
    DType comm;
  };
  const Case cases[] = {
      {"fp32", "", DType::f32},
      {"bf16, fp32 communication", R"("bf16": {"enabled": true}, "communication_data_type": "fp32")", DType::f32},
      {"bf16, bf16 communication", R"("bf16": {"enabled": true})", DType::bf16},
  };
  const std::vector<UnitSpec> units = {flat_unit("big", 1536), flat_unit("odd", 700), flat_unit("norm", 40),
                                       unit("mixed", {param("mixed.w", {10, 13}, ParamInit::normal({.std = 0.1})),
                                                      param("mixed.frozen", {9}, ParamInit::ones(), false),
                                                      param("mixed.b", {13}, ParamInit::zeros())})};
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      ConfigText text;
      text.gas = 4;
      text.top = c.top;
      // Small buckets: "big" and "odd" go in several pieces per reduce-scatter.
      text.zero = R"("reduce_bucket_size": 256, "stage3_param_persistence_threshold": 50)";
      auto e = make_engine(text);
      declare(*e, units);
      for (int micro = 0; micro < 4; ++micro) {
        forward_backward(*e, names(units), micro);
        if (micro < 3) CHECK_FALSE(e->step().boundary);
      }
      const float w = static_cast<float>(world_size());
      for (const UnitSpec& u : units) {
        for (const ParamSpec& p : u.params) {
          if (!p.trainable) continue;
          INFO("param " << p.name);
          std::vector<float> expected(p.numel(), 0.0f);
          for (int micro = 0; micro < 4; ++micro) {
            for (std::size_t i = 0; i < expected.size(); ++i) {
              float sum = 0.0f;  // exact: multiples of 1/64 far below 2^24 / 64
              for (int r = 0; r < world_size(); ++r) sum += grad_value(p.name, r, micro, i);
              float mean = sum / w;  // the communicator's avg: one fp32 division, one rounding to the dtype
              if (c.comm == DType::bf16) mean = bf16_to_float(float_to_bf16(mean));
              expected[i] += mean;
            }
          }
          CHECK(bitwise_equal(e->gather_tensor(p.name, TensorKind::grad), expected));
        }
      }
      const StepResult r = e->step();
      CHECK(r.boundary);
      CHECK(r.applied);
      CHECK(bitwise_equal(e->gather_tensor("odd.w", TensorKind::grad), std::vector<float>(700, 0.0f)));
    }
  }
}

// ------------------------------------------------------------------------------------------------ step

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

TEST_CASE("finalize fails on every rank when the ranks' models differ", "[engine][init]") {
  const bool odd_one = world_size() > 1 && rank() == world_size() - 1;
  const auto expect = [&](Engine& e, std::initializer_list<std::string_view> parts) {
    if (world_size() == 1) {
      CHECK_NOTHROW(e.finalize());
    } else {
      check_throws<Error>([&] { e.finalize(); }, parts);
    }
  };
  {  // A persistent param whose custom init depends on the rank.
    auto e = make_engine(ConfigText{});
    e->add_unit(flat_unit("a", 500));
    e->add_unit(unit("p", {param("p.w", {10}, ParamInit::custom([odd_one](std::uint64_t first, std::span<float> out) {
                                   for (std::size_t i = 0; i < out.size(); ++i) {
                                     out[i] = static_cast<float>(first + i) + (odd_one ? 1.0f : 0.0f);
                                   }
                                 }))}));
    expect(*e, {"'p.w'", "'p'", fmt::format("rank 0 differs from rank {}", world_size() - 1)});
  }
  {  // A shape that differs on one rank.
    auto e = make_engine(ConfigText{});
    e->add_unit(flat_unit("a", odd_one ? 501 : 500));
    expect(*e, {"'a.w'", "ranks disagree"});
  }
  {  // A config that differs on one rank.
    ConfigText text;
    text.top = fmt::format(R"("wall_clock_breakdown": {})", odd_one ? "true" : "false");
    auto e = make_engine(text);
    e->add_unit(flat_unit("a", 500));
    expect(*e, {"configuration"});
  }
}
