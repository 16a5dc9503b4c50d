// Non-finite steps and the engine's window controls at any world size, for fp32 and bf16, with the
// optimizer on the device and offloaded to the CPU: an Inf/NaN written into one rank's gradient inside its
// GradScope skips the step with every byte of params, master and moments unchanged (read through the
// engine's state API) and a warning event naming the step, the rank and the param; max_consecutive skips
// in a row, or the abort policy, end with NonFiniteError; a non-finite loss marked by one rank skips the
// step even with finite gradients; a discarded window is dropped whole; reset_moments zeroes the moments
// and the next step is a fresh optimizer's first; the lr factor scales the applied lr. Every collective is
// unconditional on every rank; results are checked afterwards.
#include <fmt/format.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "device_staging.hpp"
#include "engine_fixtures.hpp"
#include "mpi_test_env.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"
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

constexpr std::int64_t kShardedElems = 1536;   // unit "s": sharded (above the persistence threshold)
constexpr std::int64_t kPersistentElems = 40;  // unit "p": kept whole on every rank

struct Setup {
  std::string name;
  std::string dtype;  // "fp32" or "bf16"
  bool offload = false;
};

std::vector<Setup> setups() {
  return {{"fp32, on the device", "fp32", false},
          {"bf16, on the device", "bf16", false},
          {"fp32, optimizer offloaded", "fp32", true},
          {"bf16, optimizer offloaded", "bf16", true}};
}

std::unique_ptr<Engine> make_engine(const Setup& s, const std::string& zero3_extra = "",
                                    const std::string& optimizer = R"({"type": "AdamW", "params": {"lr": 0.01}})",
                                    int gas = 1) {
  test::ConfigText text;
  text.gas = gas;
  text.optimizer = optimizer;
  text.zero = R"("stage3_param_persistence_threshold": 50)";
  if (s.offload) text.zero += R"(, "offload_optimizer": {"device": "cpu"})";
  if (s.dtype == "bf16") text.precision = R"("bf16": {"enabled": true})";
  text.zero3_extra = zero3_extra;
  text.seed = 7;
  ParamSpec sharded{.name = "s.w", .shape = {kShardedElems}, .init = ParamInit::normal({.std = 0.5})};
  ParamSpec persistent{.name = "p.w", .shape = {kPersistentElems}, .init = ParamInit::normal({.std = 0.5})};
  return test::make_engine(text.parse(), {.units = {{"s", {sharded}}, {"p", {persistent}}}});
}

// Gradient value of element i: k / 64, k in [-100, 100] \ {0}, exact in bf16 and in sums over ranks.
float grad_value(int r, int window, std::size_t i) {
  int k = static_cast<int>((i * 37 + static_cast<std::size_t>(r) * 11 + static_cast<std::size_t>(window) * 101) % 200) -
          100;
  if (k >= 0) ++k;
  return static_cast<float>(k) / 64.0f;
}

// Where a poisoned gradient element goes in one rank's GradScope.
struct Poison {
  int rank = -1;  // -1: nobody
  std::string param;
  std::size_t element = 0;
  float value = std::numeric_limits<float>::quiet_NaN();
};

// One micro-batch's forward and backward; the poisoned element, if any, written inside the GradScope.
void window(Engine& e, int index, const Poison& poison = {}) {
  for (const char* u : {"s", "p"}) {
    auto g = e.gather(u);
  }
  for (const char* u : {"p", "s"}) {
    auto g = e.gather(u);
    auto gr = e.grads(u);
    const ParamSpec p = e.unit_params(u)[0];
    std::vector<float> v(p.numel());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = grad_value(rank(), index, i);
    if (poison.rank == rank() && poison.param == p.name) v[poison.element] = poison.value;
    test::upload_floats(e.device(), e.compute_stream(), gr.grad(p.name), v);
  }
}

// The first element of rank `r`'s shard of the sharded unit, computed from the layout rule (groups padded
// to world_size x 64, each rank keeping padded / world_size).
std::size_t shard_first(int r) {
  const std::int64_t align = 64LL * world_size();
  const std::int64_t padded = (kShardedElems + align - 1) / align * align;
  return static_cast<std::size_t>(padded / world_size() * r);
}

// A directory every rank agrees on (rank 0's pid), empty, configured as the event log's run directory.
std::filesystem::path event_dir(const std::string& name) {
  std::int64_t pid = ::getpid();
  std::vector<std::byte> bytes(sizeof pid);
  std::memcpy(bytes.data(), &pid, sizeof pid);
  env().bootstrap->broadcast(bytes, 0);
  std::memcpy(&pid, bytes.data(), sizeof pid);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("zero3-nonfinite-{}-{}", name, pid);
  env().bootstrap->barrier();
  if (rank() == 0) std::filesystem::remove_all(dir);
  env().bootstrap->barrier();
  events::configure({.run_dir = dir, .rank = rank()});
  return dir;
}

std::string read_events(const std::filesystem::path& dir) {
  std::ifstream in(dir / "events.jsonl");
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void done_with(const std::filesystem::path& dir) {
  events::configure({});
  env().bootstrap->barrier();
  if (rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

TEST_CASE("an Inf/NaN gradient skips the step with every state byte unchanged and names the param",
          "[engine][nonfinite]") {
  for (const Setup& s : setups()) {
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
      DYNAMIC_SECTION(s.name << ", " << bad) {
        const std::filesystem::path dir = event_dir("skip");
        auto e = make_engine(s);
        window(*e, 0);
        CHECK(e->step().applied);
        const std::vector<std::byte> before = test::state_bytes(*e);
        // Written by rank 0 into an element that the last rank's shard holds after the reduce-scatter.
        const std::size_t element = shard_first(world_size() - 1) + 3;
        window(*e, 1, {.rank = 0, .param = "s.w", .element = element, .value = bad});
        const StepResult r = e->step();
        CHECK(r.boundary);
        CHECK_FALSE(r.applied);
        CHECK(r.nonfinite);
        CHECK_FALSE(r.discarded);
        CHECK_FALSE(std::isfinite(r.grad_norm));
        CHECK(r.global_step == 2);
        CHECK(r.skipped_steps == 1);
        CHECK(test::state_bytes(*e) == before);
        CHECK(e->state().training_state().applied_steps == 1);
        // The window's gradients are gone: the next step applies the next window alone.
        window(*e, 2);
        const StepResult next = e->step();
        CHECK(next.applied);
        CHECK(std::isfinite(next.grad_norm));
        CHECK(test::state_bytes(*e) != before);
        env().bootstrap->barrier();
        if (rank() == 0) {
          const std::string log = read_events(dir);
          CHECK_THAT(log, Contains("\"kind\": \"nonfinite_skip\""));
          CHECK_THAT(log, Contains("\"step\": 2"));
          CHECK_THAT(log, Contains("'s.w'"));
          CHECK_THAT(log, Contains(fmt::format("element {}, rank {}", element, world_size() - 1)));
          CHECK_THAT(log, Contains(fmt::format("\"grad_ranks\": \"{}\"", world_size() - 1)));
        }
        done_with(dir);
      }
    }
  }
}

TEST_CASE("a NaN in the first micro-batch of an accumulation window skips the window's step", "[engine][nonfinite]") {
  for (const Setup& s : setups()) {
    DYNAMIC_SECTION(s.name) {
      auto e = make_engine(s, "", R"({"type": "AdamW", "params": {"lr": 0.01}})", 2);
      const std::vector<std::byte> before = test::state_bytes(*e);
      const std::size_t element = shard_first(world_size() - 1) + 1;
      window(*e, 0, {.rank = world_size() - 1, .param = "s.w", .element = element});
      CHECK_FALSE(e->step().boundary);
      window(*e, 1);
      const StepResult r = e->step();
      CHECK(r.boundary);
      CHECK(r.nonfinite);
      CHECK(test::state_bytes(*e) == before);
      for (int i = 2; i < 4; ++i) {  // the next window is clean: the NaN went with the skipped one
        window(*e, i);
        e->step();
      }
      CHECK(e->skipped_steps() == 1);
      CHECK(e->global_step() == 2);
      CHECK(test::state_bytes(*e) != before);
    }
  }
}

TEST_CASE("a poisoned persistent param is named, and found on every rank", "[engine][nonfinite]") {
  const Setup s = setups()[1];
  const std::filesystem::path dir = event_dir("persistent");
  auto e = make_engine(s);
  const std::vector<std::byte> before = test::state_bytes(*e);
  window(*e, 0, {.rank = world_size() - 1, .param = "p.w", .element = 7});
  const StepResult r = e->step();
  CHECK(r.nonfinite);
  CHECK(test::state_bytes(*e) == before);
  env().bootstrap->barrier();
  if (rank() == 0) {
    const std::string log = read_events(dir);
    CHECK_THAT(log, Contains("'p.w' (unit 'p', element 7, rank 0"));
    std::string all;
    for (int q = 0; q < world_size(); ++q) all += fmt::format("{}{}", q ? ", " : "", q);
    CHECK_THAT(log, Contains(fmt::format("\"grad_ranks\": \"{}\"", all)));
  }
  done_with(dir);
}

TEST_CASE("max_consecutive non-finite steps in a row end with NonFiniteError; an applied step resets the count",
          "[engine][nonfinite]") {
  for (const Setup& s : {setups()[1], setups()[2]}) {
    DYNAMIC_SECTION(s.name) {
      auto e = make_engine(s, R"("nonfinite": {"max_consecutive": 3})");
      const Poison poison{.rank = 0, .param = "s.w", .element = 11};
      for (int i = 0; i < 2; ++i) {
        window(*e, i, poison);
        CHECK(e->step().nonfinite);
      }
      window(*e, 2);
      CHECK(e->step().applied);
      const std::vector<std::byte> before = test::state_bytes(*e);
      for (int i = 3; i < 5; ++i) {
        window(*e, i, poison);
        CHECK(e->step().nonfinite);
      }
      window(*e, 5, poison);
      std::string error;
      try {
        e->step();
      } catch (const NonFiniteError& x) {
        error = x.what();
      }
      CHECK_THAT(error, Contains("step 6"));
      CHECK_THAT(error, Contains("'s.w'"));
      CHECK_THAT(error, Contains("3 non-finite steps in a row"));
      CHECK_THAT(error, Contains("max_consecutive 3"));
      CHECK(e->global_step() == 6);
      CHECK(e->skipped_steps() == 5);
      CHECK(test::state_bytes(*e) == before);  // the aborted step was not applied either
    }
  }
}

TEST_CASE("the abort policy ends at the first non-finite step", "[engine][nonfinite]") {
  auto e = make_engine(setups()[0], R"("nonfinite": {"policy": "abort"})");
  const std::vector<std::byte> before = test::state_bytes(*e);
  window(*e, 0,
         {.rank = world_size() - 1, .param = "s.w", .element = 0, .value = -std::numeric_limits<float>::infinity()});
  std::string error;
  try {
    e->step();
  } catch (const NonFiniteError& x) {
    error = x.what();
  }
  CHECK_THAT(error, Contains("step 1: non-finite gradient in 's.w'"));
  CHECK_THAT(error, Contains("policy is \"abort\""));
  CHECK(test::state_bytes(*e) == before);
}

TEST_CASE("a rank's non-finite loss skips the step although every gradient is finite", "[engine][nonfinite]") {
  for (const Setup& s : {setups()[0], setups()[3]}) {
    DYNAMIC_SECTION(s.name) {
      const std::filesystem::path dir = event_dir("loss");
      auto e = make_engine(s);
      const std::vector<std::byte> before = test::state_bytes(*e);
      window(*e, 0);
      if (rank() == world_size() - 1) e->discard_window(Engine::DiscardReason::nonfinite_loss);
      const StepResult r = e->step();
      CHECK_FALSE(r.applied);
      CHECK(r.nonfinite);
      CHECK(std::isfinite(r.grad_norm));
      CHECK(test::state_bytes(*e) == before);
      env().bootstrap->barrier();
      if (rank() == 0) {
        const std::string log = read_events(dir);
        CHECK_THAT(log, Contains("every gradient element is finite"));
        CHECK_THAT(log, Contains(fmt::format("non-finite loss on rank(s) {}", world_size() - 1)));
      }
      done_with(dir);
    }
  }
}

TEST_CASE("a discarded window is dropped whole, without counting as non-finite", "[engine][nonfinite]") {
  for (const Setup& s : {setups()[1], setups()[2]}) {
    DYNAMIC_SECTION(s.name) {
      // Two runs of the same windows: the second discards window 1, so its step 2 must equal the first
      // run's step 1 applied to window 2 alone.
      auto reference = make_engine(s);
      window(*reference, 0);
      reference->step();
      window(*reference, 2);
      reference->step();
      auto e = make_engine(s, R"("nonfinite": {"max_consecutive": 1})");
      window(*e, 0);
      e->step();
      const std::vector<std::byte> before = test::state_bytes(*e);
      window(*e, 1);
      if (rank() == 0) e->discard_window(Engine::DiscardReason::requested);
      const StepResult r = e->step();
      CHECK_FALSE(r.applied);
      CHECK(r.discarded);
      CHECK_FALSE(r.nonfinite);
      CHECK(r.skipped_steps == 1);
      CHECK(test::state_bytes(*e) == before);
      window(*e, 2);
      CHECK(e->step().applied);
      CHECK(test::state_bytes(*e) == test::state_bytes(*reference));
    }
  }
}

TEST_CASE("reset_moments zeroes the moments and the next step is a fresh optimizer's first", "[engine][nonfinite]") {
  for (const Setup& s : {setups()[0], setups()[2]}) {
    DYNAMIC_SECTION(s.name) {
      auto e = make_engine(s, "", R"({"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0, "eps": 1e-8}})");
      for (int i = 0; i < 3; ++i) {
        window(*e, i);
        e->step();
      }
      const std::vector<float> master = test::local_floats(*e, TensorKind::master);
      CHECK(test::local_floats(*e, TensorKind::exp_avg) != std::vector<float>(master.size(), 0.0f));
      e->reset_moments();
      CHECK(test::local_floats(*e, TensorKind::exp_avg) == std::vector<float>(master.size(), 0.0f));
      CHECK(test::local_floats(*e, TensorKind::exp_avg_sq) == std::vector<float>(master.size(), 0.0f));
      CHECK(test::local_floats(*e, TensorKind::master) == master);
      CHECK(e->state().training_state().applied_steps == 0);
      // Adam's step 1 after the reset: m_hat = g, v_hat = g^2, so each element moves by lr * g / (|g| + eps).
      window(*e, 3);
      const StepResult r = e->step();
      CHECK(r.applied);
      const std::vector<float> after = test::local_floats(*e, TensorKind::master);
      const std::vector<ParamSlice> slices = e->state().local_slices(false);
      int bad = 0;
      std::size_t k = 0;
      for (const ParamSlice& slice : slices) {
        for (std::uint64_t i = 0; i < slice.count; ++i, ++k) {
          double g = 0.0;
          for (int q = 0; q < world_size(); ++q) g += grad_value(q, 3, slice.first + i);
          g /= world_size();
          const double expected = master[k] - 0.01 * g / (std::fabs(g) + 1e-8);
          if (std::fabs(after[k] - expected) > 1e-5 * std::max(1.0, std::fabs(expected))) ++bad;
        }
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("the lr factor multiplies the applied lr", "[engine][nonfinite]") {
  auto e = make_engine(setups()[0]);
  CHECK(e->lr_factor() == 1.0);
  e->set_lr_factor(0.25);
  window(*e, 0);
  const StepResult r = e->step();
  CHECK(r.lr == 0.01 * 0.25);
  CHECK_THROWS_AS(e->set_lr_factor(-1.0), UsageError);
  CHECK_THROWS_AS(e->set_lr_factor(std::numeric_limits<double>::quiet_NaN()), UsageError);
}
