// The CUDA kernels against the host backend on the same random inputs, odd sizes (the largest past the
// CUDA grids' caps, so grid-stride loops wrap). cast, scale, fill and nonfinite_check must match bit
// for bit (NaN results: NaN on both, payload and sign free); sum_squares within kSumSquaresRelTol.
// Device outputs are poisoned with NaN first. Skipped (exit 77) without a device: see gpu_main.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gpu_rig.hpp"
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
using Rig = zero3::test::GpuRig;
using zero3::test::check_same;

constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16};

// Both backends sum exact squares in double (error ~n * 2^-53 relative), in different orders, then round
// once to fp32: the results are equal or one fp32 ulp apart. Two ulps (relative 2^-22) leave a margin.
constexpr double kSumSquaresRelTol = 0x1p-22;

std::size_t size_case() {
  return GENERATE(as<std::size_t>{}, 0, 1, 7, 1023, 4097, 100003, 4194307);
}

float download_scalar(Rig& rig, const Buffer& d) {
  const std::vector<unsigned char> bytes = rig.download(d);
  float v;
  std::memcpy(&v, bytes.data(), sizeof v);
  return v;
}

}  // namespace

TEST_CASE("cuda kernels: cast matches the host bit for bit", "[kernels][gpu]") {
  const std::size_t n = size_case();
  const DType src_t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const DType dst_t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", " << zero3::dtype_name(src_t) << " -> " << zero3::dtype_name(dst_t) << ", seed " << seed);
  std::mt19937_64 rng(seed);
  Rig rig;
  Buffer src = rig.host_buffer(n, src_t);
  // Half the elements span fp16's range and past it, half all of fp32's (overflow, subnormals, ties).
  for (std::size_t i = 0; i < n; ++i) {
    for (;;) {
      const float v = (rng() & 1u) ? random_float(rng, -28, 18) : random_float(rng, -140, 128);
      zero3::store_from_float(src.data(), src_t, i, v);
      const double stored = value_at(src.data(), src_t, i);
      if (stored != 0.0 && std::isfinite(stored)) break;
    }
  }
  Buffer ref = rig.host_buffer(n, dst_t);
  poison(ref);
  kernels::cast(*rig.host_stream, ref.view(), src.cview());
  rig.host_stream->synchronize();

  Buffer d_src = rig.upload(src);
  Buffer poisoned = rig.host_buffer(n, dst_t);
  poison(poisoned);
  Buffer d_dst = rig.upload(poisoned);
  kernels::cast(*rig.gpu_stream, d_dst.view(), d_src.cview());
  check_same(rig.download(d_dst), ref);
}

TEST_CASE("cuda kernels: cast of NaN, Inf and overflow", "[kernels][gpu]") {
  Rig rig;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> special = {NAN, -NAN, inf, -inf, 1e30f, -1e30f, 65520.0f, 65519.996f, 1e-30f, -0.0f};
  Buffer src = rig.host_buffer(special.size(), DType::f32);
  std::memcpy(src.data(), special.data(), special.size() * sizeof(float));
  Buffer d_src = rig.upload(src);
  for (DType t : kAllDTypes) {
    INFO(zero3::dtype_name(t));
    Buffer ref = rig.host_buffer(special.size(), t);
    kernels::cast(*rig.host_stream, ref.view(), src.cview());
    rig.host_stream->synchronize();
    Buffer poisoned = rig.host_buffer(special.size(), t);
    poison(poisoned);
    Buffer d_dst = rig.upload(poisoned);
    kernels::cast(*rig.gpu_stream, d_dst.view(), d_src.cview());
    check_same(rig.download(d_dst), ref);
  }
}

TEST_CASE("cuda kernels: scale matches the host bit for bit", "[kernels][gpu]") {
  const std::size_t n = size_case();
  const DType t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed);
  const float alpha = std::uniform_real_distribution<float>(0.1f, 10.0f)(rng);
  INFO("n " << n << ", " << zero3::dtype_name(t) << ", alpha " << alpha << ", seed " << seed);
  Rig rig;
  Buffer x = rig.host_buffer(n, t);
  // Wide enough that fp16 overflows to Inf and bf16/fp16 results go subnormal.
  fill_random(x, rng, -30, 16);
  if (n > 2) {
    zero3::store_from_float(x.data(), t, 0, NAN);
    zero3::store_from_float(x.data(), t, n - 1, -INFINITY);
  }
  Buffer d_x = rig.upload(x);
  kernels::scale(*rig.host_stream, x.view(), alpha);
  rig.host_stream->synchronize();
  kernels::scale(*rig.gpu_stream, d_x.view(), alpha);
  check_same(rig.download(d_x), x);
}

TEST_CASE("cuda kernels: fill matches the host bit for bit", "[kernels][gpu]") {
  const std::size_t n = size_case();
  const DType t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed);
  const float value = random_float(rng, -10, 10);
  INFO("n " << n << ", " << zero3::dtype_name(t) << ", value " << value << ", seed " << seed);
  Rig rig;
  Buffer ref = rig.host_buffer(n, t);
  poison(ref);
  Buffer d_x = rig.upload(ref);
  kernels::fill(*rig.host_stream, ref.view(), value);
  rig.host_stream->synchronize();
  kernels::fill(*rig.gpu_stream, d_x.view(), value);
  check_same(rig.download(d_x), ref);
}

TEST_CASE("cuda kernels: sum_squares matches the host within tolerance and is reproducible", "[kernels][gpu]") {
  const std::size_t n = size_case();
  const DType t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const bool accumulate = GENERATE(false, true);
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", " << zero3::dtype_name(t) << ", accumulate " << accumulate << ", seed " << seed);
  std::mt19937_64 rng(seed);
  Rig rig;
  Buffer x = rig.host_buffer(n, t);
  fill_random(x, rng, -8, 8);
  Buffer out = rig.host_buffer(1, DType::f32);
  const float initial = accumulate ? std::fabs(random_float(rng, 0, 10)) : NAN;  // NaN: must be overwritten
  *static_cast<float*>(out.data()) = initial;
  Buffer d_x = rig.upload(x);
  Buffer d_out = rig.upload(out);
  Buffer d_out2 = rig.upload(out);
  kernels::sum_squares(*rig.host_stream, x.cview(), out.view(), accumulate);
  rig.host_stream->synchronize();
  kernels::sum_squares(*rig.gpu_stream, d_x.cview(), d_out.view(), accumulate);
  kernels::sum_squares(*rig.gpu_stream, d_x.cview(), d_out2.view(), accumulate);
  const float want = *static_cast<const float*>(out.data());
  const float got = download_scalar(rig, d_out);
  const float again = download_scalar(rig, d_out2);
  INFO("device " << got << ", host " << want);
  CHECK(std::fabs(static_cast<double>(got) - want) <= kSumSquaresRelTol * std::fabs(want));
  CHECK(zero3::float_bits(got) == zero3::float_bits(again));
  if (n == 0) CHECK(got == (accumulate ? initial : 0.0f));
}

TEST_CASE("cuda kernels: sum_squares on two streams at once", "[kernels][gpu]") {
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  Rig rig;
  auto second = rig.gpu->create_stream("second");
  Buffer a = rig.host_buffer(3000017, DType::bf16);
  Buffer b = rig.host_buffer(1000003, DType::f32);
  fill_random(a, rng, -4, 4);
  fill_random(b, rng, -4, 4);
  Buffer ref = rig.host_buffer(2, DType::f32);
  kernels::sum_squares(*rig.host_stream, a.cview(), ref.view().slice(0, 1), false);
  kernels::sum_squares(*rig.host_stream, b.cview(), ref.view().slice(1, 1), false);
  rig.host_stream->synchronize();
  Buffer d_a = rig.upload(a);
  Buffer d_b = rig.upload(b);
  Buffer d_out = rig.gpu->allocate(2, DType::f32, MemoryKind::device, MemCategory::workspace);
  for (int rep = 0; rep < 20; ++rep) {
    kernels::sum_squares(*rig.gpu_stream, d_a.cview(), d_out.view().slice(0, 1), false);
    kernels::sum_squares(*second, d_b.cview(), d_out.view().slice(1, 1), false);
  }
  second->synchronize();
  const std::vector<unsigned char> bytes = rig.download(d_out);
  float got[2];
  std::memcpy(got, bytes.data(), sizeof got);
  for (int i = 0; i < 2; ++i) {
    const float want = static_cast<const float*>(ref.data())[i];
    INFO("tensor " << i << ": device " << got[i] << ", host " << want);
    CHECK(std::fabs(static_cast<double>(got[i]) - want) <= kSumSquaresRelTol * std::fabs(want));
  }
}

TEST_CASE("cuda kernels: nonfinite_check matches the host", "[kernels][gpu]") {
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 7, 1023, 4097, 100003, 4194307);
  const DType t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", " << zero3::dtype_name(t) << ", seed " << seed);
  std::mt19937_64 rng(seed);
  Rig rig;
  Buffer x = rig.host_buffer(n, t);
  fill_random(x, rng, -20, 12);
  const float max_finite = t == DType::f16 ? 65504.0f : t == DType::bf16 ? 0x1.fep127f : 0x1.fffffep127f;
  zero3::store_from_float(x.data(), t, n / 3, max_finite);
  Buffer flag = rig.host_buffer(1, DType::f32);
  *static_cast<float*>(flag.data()) = 0.25f;
  Buffer d_flag = rig.upload(flag);
  Buffer d_x = rig.upload(x);
  kernels::nonfinite_check(*rig.gpu_stream, d_x.cview(), d_flag.view());
  CHECK(download_scalar(rig, d_flag) == 0.25f);  // clean: left unchanged

  std::vector<std::uint32_t> specials;
  if (t == DType::f32) specials = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u};
  if (t == DType::f16) specials = {0x7c00u, 0xfc00u, 0x7e00u, 0x7c01u};
  if (t == DType::bf16) specials = {0x7f80u, 0xff80u, 0x7fc0u, 0x7f81u};
  for (std::uint32_t bits : specials) {
    for (std::size_t pos : {std::size_t{0}, n / 2, n - 1}) {
      INFO("pattern 0x" << std::hex << bits << std::dec << " at " << pos);
      Buffer dirty = rig.host_buffer(n, t);
      std::memcpy(dirty.data(), x.data(), x.size_bytes());
      std::memcpy(static_cast<char*>(dirty.data()) + pos * zero3::size_of(t), &bits, zero3::size_of(t));
      Buffer d_dirty = rig.upload(dirty);
      kernels::fill(*rig.gpu_stream, d_flag.view(), 0.0f);
      kernels::nonfinite_check(*rig.gpu_stream, d_dirty.cview(), d_flag.view());
      kernels::nonfinite_check(*rig.gpu_stream, d_x.cview(), d_flag.view());  // a clean one does not clear it
      *static_cast<float*>(flag.data()) = 0.0f;
      kernels::nonfinite_check(*rig.host_stream, dirty.cview(), flag.view());
      rig.host_stream->synchronize();
      CHECK(*static_cast<const float*>(flag.data()) == 1.0f);
      CHECK(download_scalar(rig, d_flag) == 1.0f);
    }
  }
}

TEST_CASE("cuda kernels: pinned host views are reachable, pageable ones and host streams are refused",
          "[kernels][gpu]") {
  Rig rig;
  const std::size_t n = 1023;
  Buffer pinned = rig.gpu->allocate(n, DType::f32, MemoryKind::pinned_host, MemCategory::staging);
  for (std::size_t i = 0; i < n; ++i) static_cast<float*>(pinned.data())[i] = 0.1f * static_cast<float>(i + 1);
  Buffer d_low = rig.gpu->allocate(n, DType::bf16, MemoryKind::device, MemCategory::workspace);
  kernels::cast(*rig.gpu_stream, d_low.view(), pinned.cview());
  Buffer ref_src = rig.host_buffer(n, DType::f32);
  std::memcpy(ref_src.data(), pinned.data(), pinned.size_bytes());
  Buffer ref = rig.host_buffer(n, DType::bf16);
  kernels::cast(*rig.host_stream, ref.view(), ref_src.cview());
  rig.host_stream->synchronize();
  check_same(rig.download(d_low), ref);

  std::vector<float> pageable(n, 1.0f);
  zero3::BufferView pageable_view{pageable.data(), n, DType::f32, MemoryKind::pageable_host};
  CHECK_THROWS_AS(kernels::cast(*rig.gpu_stream, d_low.view(), pageable_view), zero3::UsageError);
  CHECK_THROWS_AS(kernels::cuda_backend().fill(*rig.host_stream, ref.view(), 1.0f), zero3::UsageError);
  Buffer short_out = rig.gpu->allocate(2, DType::f32, MemoryKind::device, MemCategory::workspace);
  CHECK_THROWS_AS(kernels::sum_squares(*rig.gpu_stream, d_low.cview(), short_out.view(), false), zero3::UsageError);
  rig.gpu_stream->synchronize();
}
