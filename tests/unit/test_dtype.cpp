// The fp32 <-> bf16/fp16 conversions of zero3/core/dtype.hpp against references written here:
// 16-bit -> fp32 exhaustively against values built with ldexp, and fp32 -> 16-bit round-to-nearest-even
// against a search of the sorted table of every finite 16-bit value, decided in exact long double
// arithmetic. Random inputs come from a seed printed on failure (rerun with --rng-seed <seed>).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "zero3/core/dtype.hpp"

namespace {

using zero3::bf16_t;
using zero3::DType;
using zero3::fp16_t;

// A 16-bit binary format: 1 sign bit, `exp_bits` exponent bits, `man_bits` stored mantissa bits.
struct Format {
  const char* name;
  int exp_bits;
  int man_bits;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  std::uint16_t exp_mask() const { return static_cast<std::uint16_t>(((1u << exp_bits) - 1u) << man_bits); }
  std::uint16_t man_mask() const { return static_cast<std::uint16_t>((1u << man_bits) - 1u); }
  std::uint16_t inf_bits() const { return exp_mask(); }
  std::uint16_t quiet_bit() const { return static_cast<std::uint16_t>(1u << (man_bits - 1)); }
  bool is_nan(std::uint16_t b) const { return (b & exp_mask()) == exp_mask() && (b & man_mask()) != 0; }
};
constexpr Format kFp16{"fp16", 5, 10};
constexpr Format kBf16{"bf16", 8, 7};

// The value of a finite 16-bit pattern, from the IEEE definition (not from the code under test).
long double ref_value(const Format& f, std::uint16_t bits) {
  const bool neg = (bits & 0x8000u) != 0;
  const int e = (bits >> f.man_bits) & ((1 << f.exp_bits) - 1);
  const long double m = bits & f.man_mask();
  long double v;
  if (e == 0) {
    v = std::ldexp(m, 1 - f.bias() - f.man_bits);  // subnormal: m * 2^(emin - man_bits)
  } else {
    v = std::ldexp(m + std::ldexp(1.0L, f.man_bits), e - f.bias() - f.man_bits);
  }
  return neg ? -v : v;
}

// Non-negative finite values in bit order (which is value order), plus one entry past the largest finite
// value: 2^(emax+1), at the Inf pattern. Rounding to nearest with that extra entry reproduces IEEE
// overflow: a value at or above max + half an ulp rounds to Inf (a tie goes to the even pattern, Inf).
std::vector<long double> value_table(const Format& f) {
  std::vector<long double> t;
  for (std::uint32_t b = 0; b < f.inf_bits(); ++b) t.push_back(ref_value(f, static_cast<std::uint16_t>(b)));
  t.push_back(std::ldexp(1.0L, f.bias() + 1));
  return t;
}

// Round-to-nearest-even of a finite or infinite float to format f, by searching the table.
std::uint16_t ref_round(const std::vector<long double>& table, float x) {
  const std::uint16_t sign = std::signbit(x) ? 0x8000u : 0u;
  const long double a = std::fabs(static_cast<long double>(x));
  std::size_t idx;
  if (a >= table.back()) {
    idx = table.size() - 1;
  } else {
    const auto hi_it = std::upper_bound(table.begin(), table.end(), a);  // first value > a (exists)
    const std::size_t hi = static_cast<std::size_t>(hi_it - table.begin());
    const std::size_t lo = hi - 1;
    // Compare a with the midpoint as 2a vs lo + hi: both sides are exact in long double.
    const long double twice = 2.0L * a;
    const long double sum = table[lo] + table[hi];
    if (twice < sum) {
      idx = lo;
    } else if (twice > sum) {
      idx = hi;
    } else {
      idx = (lo % 2 == 0) ? lo : hi;  // tie: the pattern with an even last mantissa bit
    }
  }
  return static_cast<std::uint16_t>(sign | idx);
}

std::uint16_t convert(const Format& f, float x) {
  return &f == &kFp16 ? zero3::float_to_fp16(x).bits : zero3::float_to_bf16(x).bits;
}
float widen(const Format& f, std::uint16_t bits) {
  return &f == &kFp16 ? zero3::fp16_to_float(fp16_t{bits}) : zero3::bf16_to_float(bf16_t{bits});
}

std::uint64_t test_seed() {
  const std::uint64_t s = Catch::rngSeed();
  return s != 0 ? s : std::random_device{}();
}

float float_of(std::uint32_t bits) {
  return zero3::bits_float(bits);
}

// Checks one float against the reference, NaN handled apart (any quiet NaN of the same sign).
void check_round(const Format& f, const std::vector<long double>& table, float x) {
  const std::uint16_t got = convert(f, x);
  if (std::isnan(x)) {
    INFO(f.name << " of NaN 0x" << std::hex << zero3::float_bits(x) << " gave 0x" << got);
    CHECK(f.is_nan(got));
    CHECK((got & f.quiet_bit()) != 0);
    CHECK(((got & 0x8000u) != 0) == std::signbit(x));
    return;
  }
  const std::uint16_t want = ref_round(table, x);
  if (got != want) {
    INFO(f.name << " of " << x << " (0x" << std::hex << zero3::float_bits(x) << "): got 0x" << got << ", want 0x"
                << want);
    CHECK(got == want);
  }
}

}  // namespace

TEST_CASE("dtype: names, sizes and parsing", "[dtype]") {
  CHECK(zero3::size_of(DType::f32) == 4);
  CHECK(zero3::size_of(DType::f16) == 2);
  CHECK(zero3::size_of(DType::bf16) == 2);
  CHECK(zero3::parse_dtype("bfloat16") == DType::bf16);
  CHECK(zero3::parse_dtype("torch.float16") == DType::f16);
  CHECK(zero3::parse_dtype("FP32") == DType::f32);
  CHECK_FALSE(zero3::parse_dtype("int8").has_value());
}

TEST_CASE("dtype: every 16-bit pattern widens to its exact value and narrows back unchanged", "[dtype]") {
  for (const Format* f : {&kFp16, &kBf16}) {
    INFO(f->name);
    int mismatches = 0;
    for (std::uint32_t b = 0; b <= 0xffffu; ++b) {
      const auto bits = static_cast<std::uint16_t>(b);
      const float w = widen(*f, bits);
      const bool inf = (bits & 0x7fffu) == f->inf_bits();
      if (f->is_nan(bits)) {
        // NaN stays NaN with its sign; a signalling NaN comes back quiet.
        const std::uint16_t back = convert(*f, w);
        const bool ok = std::isnan(w) && std::signbit(w) == ((bits & 0x8000u) != 0) && f->is_nan(back) &&
                        (back & 0x8000u) == (bits & 0x8000u) && (back & f->quiet_bit()) != 0;
        if (!ok) ++mismatches;
        continue;
      }
      const bool value_ok = inf ? (std::isinf(w) && std::signbit(w) == ((bits & 0x8000u) != 0))
                                : static_cast<long double>(w) == ref_value(*f, bits) &&
                                      std::signbit(w) == ((bits & 0x8000u) != 0);  // -0 stays -0
      const bool round_trip = convert(*f, w) == bits;
      if (!value_ok || !round_trip) {
        if (++mismatches <= 10) {
          INFO("pattern 0x" << std::hex << b << " widened to " << w);
          CHECK(value_ok);
          CHECK(round_trip);
        }
      }
    }
    CHECK(mismatches == 0);
  }
}

TEST_CASE("dtype: fp32 -> 16-bit rounds to nearest even, exhaustively at ties and their neighbours", "[dtype]") {
  for (const Format* f : {&kFp16, &kBf16}) {
    INFO(f->name);
    const std::vector<long double> table = value_table(*f);
    // Every midpoint between neighbouring values (including max..2^(emax+1), the overflow tie) is an
    // fp32 value; so are the fp32 numbers just either side of it.
    for (std::size_t i = 0; i + 1 < table.size(); ++i) {
      const float mid = static_cast<float>((table[i] + table[i + 1]) / 2);
      REQUIRE(static_cast<long double>(mid) == (table[i] + table[i + 1]) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, std::numeric_limits<float>::infinity()),
                      static_cast<float>(table[i])}) {
        check_round(*f, table, x);
        check_round(*f, table, -x);
      }
    }
  }
}

TEST_CASE("dtype: fp32 -> 16-bit rounds to nearest even on random floats", "[dtype]") {
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const Format* f : {&kFp16, &kBf16}) {
    INFO(f->name);
    const std::vector<long double> table = value_table(*f);
    // Any bit pattern: every exponent, NaNs and Infs included.
    for (int i = 0; i < 400000; ++i) check_round(*f, table, float_of(static_cast<std::uint32_t>(rng())));
    // Exponents around the format's own range, where the interesting rounding happens.
    const int emin = 1 - f->bias() - f->man_bits - 2;  // below the smallest subnormal
    const int emax = f->bias() + 2;                    // above the largest finite value
    std::uniform_int_distribution<int> exp_dist(std::max(emin, -127), std::min(emax, 128));  // fp32's own range
    for (int i = 0; i < 400000; ++i) {
      const std::uint32_t e = static_cast<std::uint32_t>(exp_dist(rng) + 127);
      const std::uint32_t bits =
          (static_cast<std::uint32_t>(rng() & 1u) << 31) | (e << 23) | static_cast<std::uint32_t>(rng() & 0x7fffffu);
      check_round(*f, table, float_of(bits));
    }
  }
}

TEST_CASE("dtype: edge cases", "[dtype]") {
  const float inf = std::numeric_limits<float>::infinity();
  // fp16
  CHECK(zero3::float_to_fp16(0.0f).bits == 0x0000u);
  CHECK(zero3::float_to_fp16(-0.0f).bits == 0x8000u);
  CHECK(zero3::float_to_fp16(1.0f).bits == 0x3c00u);
  CHECK(zero3::float_to_fp16(65504.0f).bits == 0x7bffu);    // max finite
  CHECK(zero3::float_to_fp16(65519.996f).bits == 0x7bffu);  // just under the overflow tie
  CHECK(zero3::float_to_fp16(65520.0f).bits == 0x7c00u);    // overflow tie rounds to Inf
  CHECK(zero3::float_to_fp16(-1e9f).bits == 0xfc00u);
  CHECK(zero3::float_to_fp16(inf).bits == 0x7c00u);
  CHECK(zero3::float_to_fp16(-inf).bits == 0xfc00u);
  CHECK(zero3::float_to_fp16(std::ldexp(1.0f, -24)).bits == 0x0001u);         // smallest subnormal
  CHECK(zero3::float_to_fp16(std::ldexp(1.0f, -25)).bits == 0x0000u);         // tie to even: zero
  CHECK(zero3::float_to_fp16(std::ldexp(3.0f, -25)).bits == 0x0002u);         // tie to even: 2
  CHECK(zero3::float_to_fp16(-std::ldexp(1.0f, -26)).bits == 0x8000u);        // underflow keeps the sign
  CHECK(zero3::float_to_fp16(std::ldexp(1023.5f, -24)).bits == 0x0400u);      // rounds up to the smallest normal
  CHECK(zero3::float_to_fp16(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00u);  // tie, even below
  CHECK(zero3::float_to_fp16(1.0f + std::ldexp(3.0f, -11)).bits == 0x3c02u);  // tie, even above
  CHECK(zero3::fp16_to_float(fp16_t{0x7bffu}) == 65504.0f);
  CHECK(zero3::fp16_to_float(fp16_t{0x0001u}) == std::ldexp(1.0f, -24));
  CHECK(std::signbit(zero3::fp16_to_float(fp16_t{0x8000u})));
  // bf16
  CHECK(zero3::float_to_bf16(-0.0f).bits == 0x8000u);
  CHECK(zero3::float_to_bf16(1.0f).bits == 0x3f80u);
  CHECK(zero3::float_to_bf16(std::numeric_limits<float>::max()).bits == 0x7f80u);  // rounds past max to Inf
  CHECK(zero3::float_to_bf16(float_of(0x7f7f7fffu)).bits == 0x7f7fu);              // just under the overflow tie
  CHECK(zero3::float_to_bf16(float_of(0x7f7f8000u)).bits == 0x7f80u);              // overflow tie rounds to Inf
  CHECK(zero3::float_to_bf16(float_of(0x3f808000u)).bits == 0x3f80u);              // tie, even below
  CHECK(zero3::float_to_bf16(float_of(0x3f818000u)).bits == 0x3f82u);              // tie, even above
  CHECK(zero3::float_to_bf16(float_of(0x00000001u)).bits == 0x0000u);              // smallest fp32 subnormal -> 0
  CHECK(zero3::float_to_bf16(float_of(0x00008000u)).bits == 0x0000u);              // subnormal tie, even below
  CHECK(zero3::float_to_bf16(float_of(0x00018000u)).bits == 0x0002u);              // subnormal tie, even above
  CHECK(zero3::float_to_bf16(inf).bits == 0x7f80u);
  CHECK(zero3::float_to_bf16(-inf).bits == 0xff80u);
  // NaN stays NaN, even when its payload lies only in the bits that bf16 drops; Inf stays Inf.
  for (std::uint32_t nan_bits : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffc00000u, 0x7f80ffffu}) {
    const float nan = float_of(nan_bits);
    INFO("NaN 0x" << std::hex << nan_bits);
    CHECK(kBf16.is_nan(zero3::float_to_bf16(nan).bits));
    CHECK(kFp16.is_nan(zero3::float_to_fp16(nan).bits));
    CHECK(std::isnan(zero3::bf16_to_float(zero3::float_to_bf16(nan))));
    CHECK(std::isnan(zero3::fp16_to_float(zero3::float_to_fp16(nan))));
  }
  CHECK(std::isinf(zero3::fp16_to_float(fp16_t{0xfc00u})));
  CHECK(std::isinf(zero3::bf16_to_float(bf16_t{0x7f80u})));
}

TEST_CASE("dtype: load_as_float and store_from_float agree with the typed conversions", "[dtype]") {
  std::vector<std::uint16_t> h(3);
  float f32 = 0;
  zero3::store_from_float(&f32, DType::f32, 0, 1.5f);
  zero3::store_from_float(h.data(), DType::f16, 1, 1.0f / 3.0f);
  zero3::store_from_float(h.data(), DType::bf16, 2, 1.0f / 3.0f);
  CHECK(f32 == 1.5f);
  CHECK(h[1] == zero3::float_to_fp16(1.0f / 3.0f).bits);
  CHECK(h[2] == zero3::float_to_bf16(1.0f / 3.0f).bits);
  CHECK(zero3::load_as_float(&f32, DType::f32, 0) == 1.5f);
  CHECK(zero3::load_as_float(h.data(), DType::f16, 1) == zero3::fp16_to_float(fp16_t{h[1]}));
  CHECK(zero3::load_as_float(h.data(), DType::bf16, 2) == zero3::bf16_to_float(bf16_t{h[2]}));
}
