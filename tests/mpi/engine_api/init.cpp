// Engine init at any world size: every param equals the counter RNG's values computed here (identical for
// every world size, fp32 and bf16), and finalize fails on every rank when the ranks' models differ.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "api_fixtures.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/rng.hpp"

using namespace zero3;
using namespace zero3::test::engine_api;
using Catch::Matchers::Contains;

namespace {

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

}  // namespace

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
