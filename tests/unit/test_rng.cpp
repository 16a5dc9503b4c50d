// Counter-based RNG: values depend only on (seed, key, index), have the right distribution, and
// differ between keys and seeds.
#include <catch2/catch.hpp>
#include <cmath>
#include <set>

#include "zero3/core/rng.hpp"

using zero3::CounterRng;
using zero3::hash_name;

TEST_CASE("rng: a value is a pure function of seed, key and index", "[rng]") {
  const CounterRng a(7, hash_name("layers.0.mlp.weight"));
  const CounterRng b(7, hash_name("layers.0.mlp.weight"));
  // Visiting indices in another order (as a rank that owns a later slice would) gives the same values.
  for (std::uint64_t i = 1000; i-- > 0;) REQUIRE(a.bits(i) == b.bits(i));
  REQUIRE(a.normal(123456789) == b.normal(123456789));
}

TEST_CASE("rng: different keys, seeds and lanes give different streams", "[rng]") {
  const CounterRng a(7, hash_name("w1"));
  const CounterRng b(7, hash_name("w2"));
  const CounterRng c(8, hash_name("w1"));
  int same_ab = 0, same_ac = 0, same_lane = 0;
  for (std::uint64_t i = 0; i < 10000; ++i) {
    same_ab += a.bits(i) == b.bits(i);
    same_ac += a.bits(i) == c.bits(i);
    same_lane += a.bits(i, 0) == a.bits(i, 1);
  }
  REQUIRE(same_ab == 0);
  REQUIRE(same_ac == 0);
  REQUIRE(same_lane == 0);
  REQUIRE(hash_name("a.b") != hash_name("b.a"));
}

TEST_CASE("rng: uniform and normal have the expected moments", "[rng]") {
  const CounterRng r(42, hash_name("stats"));
  const int n = 200000;
  double su = 0, su2 = 0, sn = 0, sn2 = 0, sn4 = 0;
  std::set<std::uint64_t> distinct;
  for (int i = 0; i < n; ++i) {
    const double u = r.uniform(static_cast<std::uint64_t>(i));
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    su += u;
    su2 += u * u;
    const double z = r.normal(static_cast<std::uint64_t>(i));
    REQUIRE(std::isfinite(z));
    sn += z;
    sn2 += z * z;
    sn4 += z * z * z * z;
    if (i < 1000) distinct.insert(r.bits(static_cast<std::uint64_t>(i)));
  }
  REQUIRE(distinct.size() == 1000);
  // Standard errors at n = 2e5: mean of U ~ 6.5e-4, var of U ~ 2e-4; mean of Z ~ 2.2e-3, var of Z ~ 3.2e-3.
  // Bounds are about 5 standard errors.
  const double mu = su / n, vu = su2 / n - mu * mu;
  CHECK(std::abs(mu - 0.5) < 0.004);
  CHECK(std::abs(vu - 1.0 / 12.0) < 0.002);
  const double mz = sn / n, vz = sn2 / n - mz * mz, kz = sn4 / n;
  CHECK(std::abs(mz) < 0.012);
  CHECK(std::abs(vz - 1.0) < 0.016);
  CHECK(std::abs(kz - 3.0) < 0.12);  // fourth moment of a standard normal
}
