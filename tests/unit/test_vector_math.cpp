// vmath::tanh_f32 and exp_f32 against tanh and exp in double over sweeps of fp32 values: every bit pattern
// at a stride, dense windows where the formulas switch or the result leaves the normal floats, and the
// special values; relative error within the bound the header states (4e-7), NaN kept. vmath::round_to_bf16
// against float_to_bf16 bit for bit: strided bit patterns, every rounding tie around a few binades, the
// overflow to Inf, subnormals and NaNs. vmath::max_f32 at every length to 40 and position, and
// exp_shifted_sum_f32's values, sum and summation order.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
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

namespace {

// Every float at a stride, both signs, plus a dense window on each side of each centre.
std::vector<float> sweep(std::uint32_t stride, std::initializer_list<float> centres, int window) {
  std::vector<float> x;
  for (std::uint64_t u = 0; u < 0x7f800000u; u += stride) {
    x.push_back(from_bits(static_cast<std::uint32_t>(u)));
    x.push_back(-from_bits(static_cast<std::uint32_t>(u)));
  }
  for (const float c : centres) {
    float up = c;
    float down = c;
    for (int k = 0; k < window; ++k) {
      x.push_back(up = std::nextafter(up, std::numeric_limits<float>::infinity()));
      x.push_back(down = std::nextafter(down, -std::numeric_limits<float>::infinity()));
    }
  }
  return x;
}

}  // namespace

TEST_CASE("vmath::exp_f32 is within 4e-7 relative of exp in double", "[models]") {
  // 88.72: exp reaches FLT_MAX; -87.34: FLT_MIN; -103.28: half the least subnormal; +-0.347: |r| = ln 2 / 2.
  const std::vector<float> x = sweep(4099, {0.0f, 0.34657f, -0.34657f, 88.72f, -87.34f, -103.28f, -10.0f}, 4096);
  for (const std::size_t n : {x.size(), x.size() - 5}) {
    std::vector<float> y(n);
    zero3::models::vmath::exp_f32(x.data(), y.data(), n);
    std::size_t bad = 0;
    double worst = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
      const double want = std::exp(static_cast<double>(x[i]));
      bool ok = false;
      if (want > std::numeric_limits<float>::max()) {
        ok = std::isinf(y[i]) && y[i] > 0;
      } else if (want < std::numeric_limits<float>::min()) {
        // Subnormal results: one rounding to the subnormal grid (spacing 2^-149) after the relative error.
        ok = std::fabs(y[i] - want) <= std::ldexp(1.0, -149) + 4e-7 * want;
      } else {
        const double err = std::fabs(y[i] - want) / want;
        worst = std::max(worst, err);
        ok = err <= 4e-7;
      }
      if (!ok && ++bad <= 5) {
        INFO("x = " << x[i] << ": got " << y[i] << ", exp " << want);
        CHECK(false);
      }
    }
    INFO("worst relative error (normal results) " << worst);
    CHECK(bad == 0);
  }
  const float special[] = {std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           0.0f,
                           -0.0f,
                           1000.0f,
                           -1000.0f};
  float out[7];
  zero3::models::vmath::exp_f32(special, out, 7);
  CHECK((std::isinf(out[0]) && out[0] > 0));
  CHECK(out[1] == 0.0f);
  CHECK(std::isnan(out[2]));
  CHECK(out[3] == 1.0f);
  CHECK(out[4] == 1.0f);
  CHECK((std::isinf(out[5]) && out[5] > 0));
  CHECK(out[6] == 0.0f);
}

TEST_CASE("vmath::round_to_bf16 gives float_to_bf16's bits", "[models]") {
  std::vector<float> x = sweep(251, {}, 0);
  // Every tie (low half 0x8000) and its neighbours, odd and even, in a few binades of each sign.
  for (const std::uint32_t binade : {0x3f800000u, 0x00000000u, 0x00800000u, 0x7f000000u, 0xbf800000u}) {
    for (std::uint32_t hi = 0; hi < 0x80u; ++hi) {
      for (const std::uint32_t lo : {0x7fffu, 0x8000u, 0x8001u, 0xffffu, 0x0000u}) {
        x.push_back(from_bits(binade | (hi << 16) | lo));
      }
    }
  }
  // The largest floats (rounding up to Inf), Inf, and NaNs with payloads in the low half only.
  for (const std::uint32_t u : {0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
                                0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7f808000u, 0xffffffffu}) {
    x.push_back(from_bits(u));
  }
  for (const std::size_t n : {x.size(), x.size() - 3}) {
    std::vector<zero3::bf16_t> y(n);
    zero3::models::vmath::round_to_bf16(x.data(), y.data(), n);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t want = zero3::float_to_bf16(x[i]).bits;
      if (y[i].bits != want && ++bad <= 5) {
        std::uint32_t u;
        std::memcpy(&u, &x[i], sizeof u);
        INFO("bits " << std::hex << u << ": got " << y[i].bits << ", float_to_bf16 " << want);
        CHECK(false);
      }
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("vmath::max_f32 is the largest element at every length and position", "[models]") {
  for (std::size_t n = 1; n <= 40; ++n) {
    for (std::size_t at = 0; at < n; ++at) {
      std::vector<float> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = -1.0f - static_cast<float>((i * 7) % 5);
      x[at] = 3.5f;
      INFO("n " << n << " at " << at);
      CHECK(zero3::models::vmath::max_f32(x.data(), n) == 3.5f);
    }
  }
  const float ninf = -std::numeric_limits<float>::infinity();
  const std::vector<float> all_ninf(19, ninf);
  CHECK(zero3::models::vmath::max_f32(all_ninf.data(), all_ninf.size()) == ninf);
}

TEST_CASE("vmath::exp_shifted_sum_f32 is exp(x - shift) with its sum, in a fixed order", "[models]") {
  for (std::size_t n : {1u, 7u, 16u, 17u, 64u, 255u, 256u}) {
    std::vector<float> x(n), y(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 6.0);
    const float shift = 2.25f;
    const double sum = zero3::models::vmath::exp_shifted_sum_f32(x.data(), y.data(), n, shift);
    double want_sum = 0;
    double lanes[16] = {};
    for (std::size_t i = 0; i < n; ++i) {
      const double want = std::exp(static_cast<double>(x[i] - shift));
      INFO("n " << n << " i " << i);
      CHECK(std::abs(y[i] - want) <= 4e-7 * want);
      want_sum += want;
      lanes[i % 16] += y[i];
    }
    CHECK(std::abs(sum - want_sum) <= 4e-7 * want_sum);
    // The documented order: 16 lanes, lane l + 8 onto lane l, then pairwise.
    double half[8];
    for (int l = 0; l < 8; ++l) half[l] = lanes[l] + lanes[l + 8];
    const double ordered = ((half[0] + half[1]) + (half[2] + half[3])) + ((half[4] + half[5]) + (half[6] + half[7]));
    CHECK(sum == ordered);
    // In place gives the same values.
    std::vector<float> z = x;
    CHECK(zero3::models::vmath::exp_shifted_sum_f32(z.data(), z.data(), n, shift) == sum);
    CHECK(std::memcmp(z.data(), y.data(), n * sizeof(float)) == 0);
  }
}
