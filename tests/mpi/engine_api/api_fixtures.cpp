#include "api_fixtures.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "device_staging.hpp"
#include "zero3/core/rng.hpp"

namespace zero3::test::engine_api {

namespace {
std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

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

// The config of `text` with this run's seed.
config::Config session_config(ConfigText text) {
  text.seed = session_seed();
  return text.parse();
}

// An unfinalized engine for `text` on a device the test makes and hands over, as an embedder may.
std::unique_ptr<Engine> make_engine(const ConfigText& text) {
  return test::make_engine(session_config(text), {.device_from_test = true});
}
ParamSpec param(std::string name, std::vector<std::int64_t> shape, ParamInit init, bool trainable) {
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
void write(Engine& e, BufferView v, const std::vector<float>& values) {
  REQUIRE(values.size() == v.count);
  test::upload_floats(e.device(), e.compute_stream(), v, values);
}

std::vector<float> read(Engine& e, BufferView v) {
  return test::download_floats(e.device(), e.compute_stream(), v);
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

std::vector<std::string> names(const std::vector<UnitSpec>& units) {
  std::vector<std::string> out;
  out.reserve(units.size());
  for (const UnitSpec& u : units) out.push_back(u.name);
  return out;
}

}  // namespace zero3::test::engine_api
