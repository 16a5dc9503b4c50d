// vmath::tanh_f32 against tanh in double over a sweep of fp32 values: every bit pattern at a stride, dense
// windows around 0, 0.5 (the switch between its two formulas) and where tanh reaches 1, and the special
// values. Relative error within the bound its header states (4e-7), odd symmetry exact, NaN kept.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "vector_math.hpp"

namespace {

float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

TEST_CASE("vmath::tanh_f32 is within 4e-7 relative of tanh in double", "[models]") {
  std::vector<float> x;
  for (std::uint64_t u = 0; u < 0x7f800000u; u += 9973) {  // every finite positive magnitude, strided
    x.push_back(from_bits(static_cast<std::uint32_t>(u)));
    x.push_back(-from_bits(static_cast<std::uint32_t>(u)));
  }
  for (float c : {0.0f, 0.5f, 4.5f, 9.0f}) {
    float v = c;
    for (int k = 0; k < 4096; ++k) {
      x.push_back(v);
      x.push_back(-v);
      v = std::nextafter(v, 100.0f);
    }
    v = c;
    for (int k = 0; k < 4096; ++k) {
      v = std::nextafter(v, -100.0f);
      x.push_back(v);
    }
  }
  for (int k = -2000; k <= 2000; ++k) x.push_back(static_cast<float>(k) * 0.01f);
  // Odd lengths exercise the masked tail.
  for (std::size_t n : {x.size(), x.size() - 7}) {
    std::vector<float> y(n);
    zero3::models::vmath::tanh_f32(x.data(), y.data(), n);
    std::size_t bad = 0;
    double worst = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double want = std::tanh(static_cast<double>(x[i]));
      const double err = want == 0.0 ? std::fabs(static_cast<double>(y[i])) : std::fabs(y[i] - want) / std::fabs(want);
      worst = std::max(worst, err);
      if (!(err <= 4e-7) && ++bad <= 5) {
        INFO("x = " << x[i] << ": got " << y[i] << ", tanh " << want);
        CHECK(false);
      }
    }
    INFO("worst relative error " << worst);
    CHECK(bad == 0);
  }

  const float special[] = {std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           -0.0f,
                           0.0f,
                           1e-40f,
                           -1e-40f};
  float out[7];
  zero3::models::vmath::tanh_f32(special, out, 7);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == -1.0f);
  CHECK(std::isnan(out[2]));
  CHECK((out[3] == 0.0f && std::signbit(out[3])));
  CHECK((out[4] == 0.0f && !std::signbit(out[4])));
  CHECK(std::fabs(out[5] - 1e-40f) <= 1e-45f);
  CHECK(std::fabs(out[6] + 1e-40f) <= 1e-45f);
}

TEST_CASE("vmath::tanh_f32 works in place", "[models]") {
  std::vector<float> x(1000), want(1000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i) * 0.013f - 6.0f;
  zero3::models::vmath::tanh_f32(x.data(), want.data(), x.size());
  zero3::models::vmath::tanh_f32(x.data(), x.data(), x.size());
  CHECK(x == want);
}
