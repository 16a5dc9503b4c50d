// The host kernels against float64 references written here, on fresh random non-zero inputs of odd
// sizes (the last one large enough to split across oneTBB workers). Outputs are poisoned with NaN
// first, so an element left unwritten fails. Ops run on a host device stream, asynchronously; the
// tests synchronize before reading. Rerun a failure with --rng-seed <printed seed>.
#include <oneapi/tbb/global_control.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <future>
#include <limits>
#include <random>
#include <vector>

#include "kernel_test_util.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/device/device.hpp"
#include "zero3/kernels/kernels.hpp"

namespace {

using zero3::Buffer;
using zero3::DType;
using zero3::MemCategory;
using zero3::MemoryKind;
namespace kernels = zero3::kernels;
using zero3::test::fill_random;
using zero3::test::poison;
using zero3::test::random_float;
using zero3::test::test_seed;
using zero3::test::value_at;

constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16};

// Host vs the exact (long double) sum of squares: the kernel sums exact squares in double, so its only
// error beyond the final rounding to fp32 is ~n * 2^-53 relative, far below half an fp32 ulp. One fp32
// ulp (relative 2^-23) therefore always suffices.
constexpr double kSumSquaresRelTol = 0x1p-23;

// Round to nearest even of a double to `t`, computed independently of dtype.hpp: the quantum of the
// value's binade (or of the subnormal range), nearbyint under the default ties-to-even mode, and IEEE
// overflow to Inf at max + half an ulp.
double round_ref(double v, DType t) {
  if (std::isnan(v) || std::isinf(v)) return v;
  if (t == DType::f32) return static_cast<double>(static_cast<float>(v));
  const int man_bits = t == DType::f16 ? 10 : 7;
  const int emin = t == DType::f16 ? -14 : -126;
  const int emax = t == DType::f16 ? 15 : 127;
  const double a = std::fabs(v);
  if (a >= std::ldexp(2.0 - std::ldexp(1.0, -man_bits - 1), emax)) return std::copysign(INFINITY, v);
  int e = 0;
  std::frexp(a, &e);  // a = m * 2^e with m in [0.5, 1)
  const double q = std::ldexp(1.0, std::max(e - 1, emin) - man_bits);
  return std::copysign(std::nearbyint(a / q) * q, v);
}

bool same_value(double got, double want) {
  if (std::isnan(want)) return std::isnan(got);
  return got == want && std::signbit(got) == std::signbit(want);
}

struct HostEnv {
  std::unique_ptr<zero3::Device> device = zero3::make_host_device();
  std::unique_ptr<zero3::Stream> stream = device->create_stream("kernels-test");
  Buffer alloc(std::size_t n, DType t, MemoryKind kind = MemoryKind::device) {
    return device->allocate(n, t, kind, MemCategory::workspace);
  }
};

std::size_t size_case() {
  return GENERATE(as<std::size_t>{}, 0, 1, 7, 1023, 4097, 100003, 1048581);
}

// Reports the first few mismatches and their count.
struct Mismatches {
  std::size_t count = 0;
  void add(std::size_t i, double got, double want) {
    if (++count <= 5) {
      INFO("element " << i << ": got " << got << ", want " << want);
      CHECK(false);
    }
  }
};

}  // namespace

TEST_CASE("host kernels: cast between every pair of dtypes rounds to nearest even", "[kernels]") {
  const std::size_t n = size_case();
  const DType src_t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const DType dst_t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", " << zero3::dtype_name(src_t) << " -> " << zero3::dtype_name(dst_t) << ", seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  Buffer src = env.alloc(n, src_t);
  Buffer dst = env.alloc(n, dst_t);
  // Half the elements span fp16's range and beyond (overflow, subnormals), half all of fp32's.
  for (std::size_t i = 0; i < n; ++i) {
    for (;;) {
      const float v = (rng() & 1u) ? random_float(rng, -28, 18) : random_float(rng, -140, 128);
      zero3::store_from_float(src.data(), src_t, i, v);
      if (value_at(src, i) != 0.0 && std::isfinite(value_at(src, i))) break;
    }
  }
  poison(dst);
  kernels::cast(*env.stream, dst.view(), src.cview());
  env.stream->synchronize();
  Mismatches bad;
  for (std::size_t i = 0; i < n; ++i) {
    const double want = round_ref(value_at(src, i), dst_t);
    if (!same_value(value_at(dst, i), want)) bad.add(i, value_at(dst, i), want);
  }
  CHECK(bad.count == 0);
}

TEST_CASE("host kernels: cast keeps NaN a NaN, Inf an Inf, and copies same-dtype bits exactly", "[kernels]") {
  HostEnv env;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {NAN, -NAN, inf, -inf, 1e30f, -1e30f, 65520.0f, 1e-30f};
  Buffer src = env.alloc(special.size(), DType::f32);
  std::memcpy(src.data(), special.data(), special.size() * sizeof(float));
  for (DType t : kAllDTypes) {
    INFO(zero3::dtype_name(t));
    Buffer dst = env.alloc(special.size(), t);
    poison(dst);
    kernels::cast(*env.stream, dst.view(), src.cview());
    env.stream->synchronize();
    for (std::size_t i = 0; i < special.size(); ++i) {
      INFO("element " << i);
      CHECK(same_value(value_at(dst, i), round_ref(special[i], t)));
    }
  }
  // A signalling NaN payload survives a same-dtype cast (a copy), as it would a memcpy.
  Buffer a = env.alloc(3, DType::bf16);
  Buffer b = env.alloc(3, DType::bf16);
  const std::uint16_t bits[3] = {0x7f81u, 0xffa5u, 0x3f80u};
  std::memcpy(a.data(), bits, sizeof bits);
  poison(b);
  kernels::cast(*env.stream, b.view(), a.cview());
  kernels::cast(*env.stream, b.view(), b.cview());  // onto itself: allowed, a no-op
  env.stream->synchronize();
  CHECK(std::memcmp(a.data(), b.data(), sizeof bits) == 0);
}

TEST_CASE("host kernels: scale multiplies in fp32 and rounds to the dtype", "[kernels]") {
  const std::size_t n = size_case();
  const DType t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", " << zero3::dtype_name(t) << ", seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  Buffer x = env.alloc(n, t);
  fill_random(x, rng, -20, 12);
  std::vector<double> before(n);
  for (std::size_t i = 0; i < n; ++i) before[i] = value_at(x, i);
  const float alpha = std::uniform_real_distribution<float>(0.1f, 10.0f)(rng);
  INFO("alpha " << alpha);
  kernels::scale(*env.stream, x.view(), alpha);
  env.stream->synchronize();
  Mismatches bad;
  for (std::size_t i = 0; i < n; ++i) {
    // The product of two floats is exact in double; rounding it to float is the fp32 multiply.
    const double want = round_ref(static_cast<float>(before[i] * static_cast<double>(alpha)), t);
    if (!same_value(value_at(x, i), want)) bad.add(i, value_at(x, i), want);
  }
  CHECK(bad.count == 0);
}

TEST_CASE("host kernels: scale overflows to Inf and keeps NaN", "[kernels]") {
  HostEnv env;
  for (DType t : kAllDTypes) {
    INFO(zero3::dtype_name(t));
    Buffer x = env.alloc(4, t);
    const float big = t == DType::f16 ? 60000.0f : 3e38f;
    const float values[4] = {big, -big, NAN, 1.0f};
    for (std::size_t i = 0; i < 4; ++i) zero3::store_from_float(x.data(), t, i, values[i]);
    kernels::scale(*env.stream, x.view(), 4.0f);
    env.stream->synchronize();
    CHECK(value_at(x, 0) == INFINITY);
    CHECK(value_at(x, 1) == -INFINITY);
    CHECK(std::isnan(value_at(x, 2)));
    CHECK(value_at(x, 3) == 4.0);
  }
}

TEST_CASE("host kernels: sum_squares matches a float64 reference", "[kernels]") {
  const std::size_t n = size_case();
  const DType t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const bool accumulate = GENERATE(false, true);
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", " << zero3::dtype_name(t) << ", accumulate " << accumulate << ", seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  Buffer x = env.alloc(n, t);
  fill_random(x, rng, -8, 8);
  Buffer out = env.alloc(1, DType::f32);
  const float initial = accumulate ? std::fabs(random_float(rng, 0, 10)) : NAN;  // NaN: must be overwritten
  *static_cast<float*>(out.data()) = initial;
  kernels::sum_squares(*env.stream, x.cview(), out.view(), accumulate);
  env.stream->synchronize();
  long double ref = accumulate ? initial : 0.0L;
  for (std::size_t i = 0; i < n; ++i) ref += static_cast<long double>(value_at(x, i)) * value_at(x, i);
  const double got = *static_cast<const float*>(out.data());
  INFO("got " << got << ", want " << static_cast<double>(ref));
  CHECK(std::fabs(got - static_cast<double>(ref)) <= kSumSquaresRelTol * static_cast<double>(ref));
  if (n == 0) CHECK(got == (accumulate ? initial : 0.0f));
}

TEST_CASE("host kernels: sum_squares is bitwise reproducible for any thread count", "[kernels]") {
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  Buffer x = env.alloc(3000017, DType::f32);
  fill_random(x, rng, -12, 12);
  Buffer out = env.alloc(3, DType::f32);
  kernels::sum_squares(*env.stream, x.cview(), out.view().slice(0, 1), false);
  kernels::sum_squares(*env.stream, x.cview(), out.view().slice(1, 1), false);
  env.stream->synchronize();
  {
    tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
    kernels::sum_squares(*env.stream, x.cview(), out.view().slice(2, 1), false);
    env.stream->synchronize();
  }
  const auto* o = static_cast<const std::uint32_t*>(out.data());
  CHECK(o[0] == o[1]);
  CHECK(o[0] == o[2]);
}

TEST_CASE("host kernels: nonfinite_check sets the flag for any Inf or NaN and leaves it otherwise", "[kernels]") {
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 7, 1023, 4097, 100003, 1048581);
  const DType t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", " << zero3::dtype_name(t) << ", seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  Buffer x = env.alloc(n, t);
  fill_random(x, rng, -20, 12);
  // The largest finite values are not Inf.
  const float max_finite = t == DType::f16 ? 65504.0f : t == DType::bf16 ? 0x1.fep127f : 0x1.fffffep127f;
  zero3::store_from_float(x.data(), t, n / 3, max_finite);
  zero3::store_from_float(x.data(), t, n - 1, -max_finite);
  Buffer flag = env.alloc(1, DType::f32);
  auto* f = static_cast<float*>(flag.data());

  for (float initial : {0.0f, 0.25f}) {  // clean input: the flag keeps whatever it held
    *f = initial;
    kernels::nonfinite_check(*env.stream, x.cview(), flag.view());
    env.stream->synchronize();
    CHECK(*f == initial);
  }
  // Each special pattern of the dtype, at the first, a middle and the last element.
  std::vector<std::uint32_t> specials;
  if (t == DType::f32) specials = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffffffffu};
  if (t == DType::f16) specials = {0x7c00u, 0xfc00u, 0x7e00u, 0x7c01u, 0xffffu};
  if (t == DType::bf16) specials = {0x7f80u, 0xff80u, 0x7fc0u, 0x7f81u, 0xffffu};
  for (std::uint32_t bits : specials) {
    for (std::size_t pos : {std::size_t{0}, n / 2, n - 1}) {
      INFO("pattern 0x" << std::hex << bits << std::dec << " at " << pos);
      std::uint32_t saved = 0;
      auto* p = static_cast<char*>(x.data()) + pos * zero3::size_of(t);
      std::memcpy(&saved, p, zero3::size_of(t));
      std::memcpy(p, &bits, zero3::size_of(t));  // little-endian: the low bytes hold the pattern
      *f = 0.0f;
      kernels::nonfinite_check(*env.stream, x.cview(), flag.view());
      env.stream->synchronize();
      CHECK(*f == 1.0f);
      std::memcpy(p, &saved, zero3::size_of(t));
    }
  }
}

TEST_CASE("host kernels: one flag collects several tensors", "[kernels]") {
  HostEnv env;
  Buffer clean = env.alloc(5, DType::bf16);
  Buffer dirty = env.alloc(5, DType::bf16);
  kernels::fill(*env.stream, clean.view(), 3.0f);
  kernels::fill(*env.stream, dirty.view(), 3.0f);
  kernels::fill(*env.stream, dirty.view().slice(4, 1), INFINITY);
  Buffer flag = env.alloc(1, DType::f32);
  kernels::fill(*env.stream, flag.view(), 0.0f);
  kernels::nonfinite_check(*env.stream, dirty.cview(), flag.view());
  kernels::nonfinite_check(*env.stream, clean.cview(), flag.view());  // must not clear it
  env.stream->synchronize();
  CHECK(*static_cast<const float*>(flag.data()) == 1.0f);
}

TEST_CASE("host kernels: fill writes the value rounded to the dtype", "[kernels]") {
  const std::size_t n = size_case();
  const DType t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed);
  const float value = random_float(rng, -10, 10);
  INFO("n " << n << ", " << zero3::dtype_name(t) << ", value " << value << ", seed " << seed);
  HostEnv env;
  Buffer x = env.alloc(n, t);
  poison(x);
  kernels::fill(*env.stream, x.view(), value);
  env.stream->synchronize();
  const double want = round_ref(value, t);
  Mismatches bad;
  for (std::size_t i = 0; i < n; ++i) {
    if (!same_value(value_at(x, i), want)) bad.add(i, value_at(x, i), want);
  }
  CHECK(bad.count == 0);
}

TEST_CASE("host kernels: ops are enqueued without blocking and run in stream order", "[kernels]") {
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  const std::size_t n = 4097;
  Buffer src = env.alloc(n, DType::f32);
  fill_random(src, rng, -6, 6);
  Buffer low = env.alloc(n, DType::bf16);
  poison(low);
  Buffer out = env.alloc(1, DType::f32);
  *static_cast<float*>(out.data()) = NAN;

  // A gate holds the stream: if any op ran on the calling thread or out of order, out would change
  // before the gate opens, or come out wrong after.
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  env.stream->launch_host([opened] { opened.wait(); });
  const float alpha = 0.375f;
  kernels::cast(*env.stream, low.view(), src.cview());
  kernels::scale(*env.stream, low.view(), alpha);
  kernels::sum_squares(*env.stream, low.cview(), out.view(), false);
  CHECK(std::isnan(*static_cast<const float*>(out.data())));
  CHECK(std::isnan(value_at(low, 0)));
  gate.set_value();
  env.stream->synchronize();

  long double ref = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double lowered = round_ref(value_at(src, i), DType::bf16);
    const double scaled = round_ref(static_cast<float>(lowered * alpha), DType::bf16);
    ref += static_cast<long double>(scaled) * scaled;
  }
  const double got = *static_cast<const float*>(out.data());
  INFO("got " << got << ", want " << static_cast<double>(ref));
  CHECK(std::fabs(got - static_cast<double>(ref)) <= kSumSquaresRelTol * static_cast<double>(ref));
}

TEST_CASE("host kernels: ops on two streams joined by an event", "[kernels]") {
  HostEnv env;
  auto other = env.device->create_stream("consumer");
  auto ready = env.device->create_event();
  const std::size_t n = 100003;
  Buffer x = env.alloc(n, DType::f16);
  Buffer out = env.alloc(1, DType::f32);
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  env.stream->launch_host([opened] { opened.wait(); });
  kernels::fill(*env.stream, x.view(), 0.5f);
  kernels::scale(*env.stream, x.view(), 3.0f);
  env.stream->record(*ready);
  other->wait(*ready);
  kernels::sum_squares(*other, x.cview(), out.view(), false);
  gate.set_value();
  other->synchronize();
  CHECK(*static_cast<const float*>(out.data()) == static_cast<float>(n * 2.25));
}

TEST_CASE("host kernels: every memory kind of the host device is host memory", "[kernels]") {
  HostEnv env;
  Buffer pageable = env.alloc(9, DType::f32, MemoryKind::pageable_host);
  Buffer dev = env.alloc(9, DType::bf16);
  kernels::fill(*env.stream, pageable.view(), 2.0f);
  kernels::cast(*env.stream, dev.view(), pageable.cview());
  env.stream->synchronize();
  CHECK(value_at(dev, 8) == 2.0);
}

TEST_CASE("host kernels: bad arguments throw on the calling thread", "[kernels]") {
  HostEnv env;
  Buffer a = env.alloc(8, DType::f32);
  Buffer b = env.alloc(7, DType::bf16);
  Buffer half_out = env.alloc(1, DType::f16);
  Buffer two_out = env.alloc(2, DType::f32);
  CHECK_THROWS_AS(kernels::cast(*env.stream, b.view(), a.cview()), zero3::UsageError);
  CHECK_THROWS_AS(kernels::sum_squares(*env.stream, a.cview(), half_out.view(), false), zero3::UsageError);
  CHECK_THROWS_AS(kernels::sum_squares(*env.stream, a.cview(), two_out.view(), false), zero3::UsageError);
  CHECK_THROWS_AS(kernels::nonfinite_check(*env.stream, a.cview(), half_out.view()), zero3::UsageError);
  // Overlapping views: a cast that would read what it has already written, an output inside its input.
  zero3::BufferView low{a.data(), 8, DType::bf16, MemoryKind::device};
  CHECK_THROWS_AS(kernels::cast(*env.stream, low, a.cview()), zero3::UsageError);
  CHECK_THROWS_AS(kernels::sum_squares(*env.stream, a.cview(), a.view().slice(3, 1), false), zero3::UsageError);
  // A view with elements but no data.
  zero3::BufferView dangling{nullptr, 4, DType::f32, MemoryKind::device};
  CHECK_THROWS_AS(kernels::fill(*env.stream, dangling, 1.0f), zero3::UsageError);
  env.stream->synchronize();  // nothing failed on the stream
}
