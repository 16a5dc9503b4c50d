// What the engine API tests share: the job's world, a seed chosen per run (ZERO3_TEST_SEED repeats it),
// engines for a ConfigText (tests/support/engine_fixtures.hpp) on a device the test makes, small param and
// unit specs, device data read and written through staging copies on the compute stream (the same path on
// the host device and on CUDA), gradients exact in every dtype, and exception checks.
#pragma once

#include <catch2/catch.hpp>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine_fixtures.hpp"
#include "mpi_test_env.hpp"
#include "zero3/engine/engine.hpp"

// Every collective call in these tests is unconditional on every rank and results are checked with CHECK
// afterwards, so a failure on one rank cannot leave the others waiting. (The model-level float64 equivalence
// is tests/mpi/test_engine_equivalence.cpp.)
namespace zero3::test::engine_api {

using test::ConfigText;

MpiTestEnv& env();
int world_size();
int rank();

// Chosen by rank 0 (ZERO3_TEST_SEED, or the clock), the same on every rank: a fresh model every run.
std::uint64_t session_seed();

// At world size 1 the engine uses units in place (zero3.single_rank_in_place) and gathers nothing; the tests
// of gathers, prefetch and communication volume ask for the sharded path, which larger worlds take anyway.
constexpr const char* kShardedPath = R"("single_rank_in_place": false)";

// The config of `text` with this run's seed.
config::Config session_config(ConfigText text);
// An unfinalized engine for `text` on a device the test makes and hands over, as an embedder may.
std::unique_ptr<Engine> make_engine(const ConfigText& text);

ParamSpec param(std::string name, std::vector<std::int64_t> shape, ParamInit init, bool trainable = true);
UnitSpec unit(std::string name, std::vector<ParamSpec> params);
// A unit of one trainable param of n elements.
UnitSpec flat_unit(const std::string& name, std::int64_t n);
void declare(Engine& e, const std::vector<UnitSpec>& units);

// Device data through staging copies on the compute stream: the engine's buffers are written and read in
// stream order.
void write(Engine& e, BufferView v, const std::vector<float>& values);
std::vector<float> read(Engine& e, BufferView v);

// Gradient value k / 64 with k in [-200, 200] \ {0}: exact in fp32, fp16 and bf16, so sums over ranks are exact.
float grad_value(std::string_view name, int r, int micro, std::size_t i);
std::vector<float> grad_values(const ParamSpec& p, int r, int micro);
// One micro-step: forward over `order`, then backward in reverse, writing this rank's gradients of
// micro-step `micro` into every trainable param.
void forward_backward(Engine& e, const std::vector<std::string>& order, int micro);

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b);
std::vector<std::string> names(const std::vector<UnitSpec>& units);

// Asserts that f throws exactly E (or a subclass) whose message contains every part.
template <typename E, typename F>
void check_throws(F&& f, std::initializer_list<std::string_view> parts) {
  try {
    f();
    FAIL_CHECK("no exception was thrown");
  } catch (const E& e) {
    for (std::string_view part : parts) CHECK_THAT(e.what(), Catch::Matchers::Contains(std::string(part)));
  } catch (const std::exception& e) {
    FAIL_CHECK("unexpected exception type: " << e.what());
  }
}

}  // namespace zero3::test::engine_api
