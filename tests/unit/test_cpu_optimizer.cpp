// The CPU optimizer of offload/: the scalar path against the host device's fused kernels and a SIMD path
// against the scalar path, bit for bit (master, states and the low-precision param), on fresh random inputs
// of odd sizes with Inf, NaN, huge and subnormal values mixed in and poisoned outputs, with fp32 master and
// states and with each 16-bit storage kernels.hpp allows (bf16 master with fp32 or bf16 states, fp16
// master; their rounding against a float64 reference is test_kernels_optim.cpp's). Then the 16-bit
// conversions over wide sweeps of bit patterns, GradStats against a long double reference, CpuThreadPool's
// tiles and CPU binding, and the ZERO3_CPU_SIMD override. The test cases tagged [simd] compare the path
// named by --simd-path (avx2 or avx512) with the scalar path and fail without the option; the program exits
// 77 (ctest: Skipped) when this CPU or build lacks that path, or ZERO3_CPU_SIMD names a narrower one.
// offload_cpu.tests.cmake runs "~[simd]" as unit.cpu_optimizer and "[simd]" as unit.cpu_optimizer.<path>.
// Rerun a failure with --rng-seed <printed seed>.
#define CATCH_CONFIG_RUNNER
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "skip.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/device/device.hpp"
#include "zero3/kernels/kernels.hpp"
#include "zero3/offload/cpu_optimizer.hpp"

namespace {

using zero3::DType;
using zero3::MemCategory;
using zero3::MemoryKind;
using zero3::offload::GradStats;
using zero3::offload::SimdPath;
using zero3::offload::StepSpan;
namespace kernels = zero3::kernels;
namespace offload = zero3::offload;
using Bytes = std::vector<std::uint8_t>;

constexpr DType kAllDTypes[] = {DType::f32, DType::bf16, DType::f16};
constexpr std::size_t kSizes[] = {1, 7, 15, 17, 31, 33, 1000, 4099, 100003};

std::uint32_t f32_bits(float f) {
  return zero3::float_bits(f);
}
float bits_f32(std::uint32_t u) {
  return zero3::bits_float(u);
}

// A NaN of dtype t with a random payload (quiet or signalling), as the bits of t.
std::uint32_t random_nan_bits(std::mt19937_64& rng, DType t) {
  const std::uint32_t sign = (rng() & 1u) ? 1u : 0u;
  switch (t) {
    case DType::f32:
      return (sign << 31) | 0x7f800000u | static_cast<std::uint32_t>(1u + rng() % 0x7fffffu);
    case DType::bf16:
      return (sign << 15) | 0x7f80u | static_cast<std::uint32_t>(1u + rng() % 0x7fu);
    case DType::f16:
      return (sign << 15) | 0x7c00u | static_cast<std::uint32_t>(1u + rng() % 0x3ffu);
  }
  return 0;
}

void put_bits(Bytes& b, DType t, std::size_t i, std::uint32_t bits) {
  if (t == DType::f32) {
    std::memcpy(b.data() + 4 * i, &bits, 4);
  } else {
    const auto h = static_cast<std::uint16_t>(bits);
    std::memcpy(b.data() + 2 * i, &h, 2);
  }
}

// Random non-zero values of varied magnitude, rounded to t, with about 1 in 16 special: Inf, NaN (random
// payloads), the largest finite magnitudes and subnormals of t.
Bytes random_values(std::mt19937_64& rng, DType t, std::size_t n, int lo_exp, int hi_exp, bool positive,
                    bool specials) {
  Bytes b(n * zero3::size_of(t));
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    if (specials && r % 16 == 0) {
      const float sign = (rng() & 1u) ? -1.0f : 1.0f;
      switch ((r >> 8) % 4) {
        case 0:
          zero3::store_from_float(b.data(), t, i, sign * INFINITY);
          break;
        case 1:
          put_bits(b, t, i, random_nan_bits(rng, t));
          break;
        case 2:
          zero3::store_from_float(b.data(), t, i, sign * (t == DType::f16 ? 65504.0f : 3.0e38f));
          break;
        default:
          zero3::store_from_float(b.data(), t, i, sign * (t == DType::f16 ? 0x1p-20f : 0x1p-130f));
          break;
      }
      continue;
    }
    for (;;) {
      zero3::store_from_float(b.data(), t, i, zero3::test::random_float(rng, lo_exp, hi_exp, positive));
      const float v = zero3::load_as_float(b.data(), t, i);
      if (v != 0.0f && std::isfinite(v)) break;
    }
  }
  return b;
}

// Master weights: random magnitudes from 2^-30 to 2^18 (past fp16's 65504, so the param copy overflows),
// and values at the edges of the 16-bit formats: fp16's rounding-to-Inf boundary, fp16 subnormals, bf16
// ties, Inf and NaN.
std::vector<float> random_master(std::mt19937_64& rng, std::size_t n) {
  std::vector<float> m(n);
  constexpr float kEdges[] = {65504.0f, 65519.0f, 65520.0f, 65536.0f, 1.0e5f, 0x1p-14f, 0x1p-24f, 0x1p-25f, 3e-6f};
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = rng();
    const float sign = (rng() & 1u) ? -1.0f : 1.0f;
    if (r % 32 == 0) {
      m[i] = sign * kEdges[(r >> 8) % std::size(kEdges)];
    } else if (r % 32 == 1) {
      m[i] = bits_f32((f32_bits(zero3::test::random_float(rng, -10, 10)) & 0xffff0000u) | 0x8000u);  // bf16 tie
    } else if (r % 97 == 2) {
      m[i] = sign * INFINITY;
    } else if (r % 97 == 3) {
      m[i] = bits_f32(random_nan_bits(rng, DType::f32));
    } else {
      m[i] = zero3::test::random_float(rng, -30, 18);
    }
  }
  return m;
}

std::vector<float> to_floats(const Bytes& b) {
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}
Bytes to_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

enum class Opt { adam, lion, adagrad };

// One step's inputs and outputs as bytes; param_dtype unset means no param.
struct StepData {
  std::vector<float> master, exp_avg, exp_avg_sq;
  Bytes grad, param;
  DType grad_dtype = DType::f32;
  std::optional<DType> param_dtype;
  std::size_t count = 0;

  StepSpan span() {
    StepSpan s;
    s.master = master.data();
    s.exp_avg = exp_avg.empty() ? nullptr : exp_avg.data();
    s.exp_avg_sq = exp_avg_sq.empty() ? nullptr : exp_avg_sq.data();
    s.grad = grad.data();
    s.grad_dtype = grad_dtype;
    s.param = param_dtype ? param.data() : nullptr;
    s.param_dtype = param_dtype.value_or(DType::bf16);
    s.count = count;
    return s;
  }
};

// Which NaN comes out of an operation on two different NaNs is not specified (IEEE leaves it open, the
// compiler may swap the operands of + and *, CUDA returns a canonical NaN), so the bitwise tests give
// every element at most one source of NaN: a non-finite master never meets a non-finite gradient (their
// NaN, or the Inf - Inf NaN, would meet the other's). With nan_meets_nan, such elements get a NaN master
// and a non-finite gradient on purpose, and results need only agree on being NaN there.
StepData random_step(std::mt19937_64& rng, Opt opt, std::size_t n, DType grad_dtype, std::optional<DType> param_dtype,
                     bool nan_meets_nan = false) {
  StepData d;
  d.count = n;
  d.master = random_master(rng, n);
  if (opt != Opt::adagrad) d.exp_avg = to_floats(random_values(rng, DType::f32, n, -20, 2, false, false));
  if (opt != Opt::lion) d.exp_avg_sq = to_floats(random_values(rng, DType::f32, n, -40, 2, true, false));
  d.grad_dtype = grad_dtype;
  d.grad = random_values(rng, grad_dtype, n, -24, 4, false, true);
  for (std::size_t i = 0; i < n; ++i) {
    const bool master_special = !std::isfinite(d.master[i]);
    const bool grad_special = !std::isfinite(zero3::load_as_float(d.grad.data(), grad_dtype, i));
    if (master_special && grad_special) {
      if (nan_meets_nan) {
        d.master[i] = bits_f32(random_nan_bits(rng, DType::f32));
      } else {
        zero3::store_from_float(d.grad.data(), grad_dtype, i, 1.5f);
      }
    }
  }
  d.param_dtype = param_dtype;
  if (param_dtype) d.param.assign(n * zero3::size_of(*param_dtype), 0xff);  // poison: NaN in every dtype
  return d;
}

struct OptCase {
  Opt opt;
  kernels::AdamArgs adam;
  kernels::LionArgs lion;
  kernels::AdagradArgs adagrad;
  std::string name;
};

std::vector<OptCase> optimizer_cases() {
  std::vector<OptCase> out;
  for (bool adamw : {true, false}) {
    for (float wd : {0.0f, 0.01f}) {
      for (bool bc : {true, false}) {
        OptCase c{Opt::adam, {}, {}, {}, ""};
        c.adam.lr = 1e-3f;
        c.adam.weight_decay = wd;
        c.adam.adamw = adamw;
        c.adam.bias_correction = bc;
        c.adam.step = 3;
        c.adam.grad_scale = 0.25f;
        c.name = std::string(adamw ? "adamw" : "adam") + (wd > 0 ? " wd" : "") + (bc ? " bias-corr" : "");
        out.push_back(c);
      }
    }
  }
  for (float wd : {0.0f, 0.1f}) {
    OptCase c{Opt::lion, {}, {}, {}, ""};
    c.lion.lr = 3e-4f;
    c.lion.weight_decay = wd;
    c.lion.grad_scale = 0.5f;
    c.name = wd > 0 ? "lion wd" : "lion";
    out.push_back(c);
  }
  for (float wd : {0.0f, 0.05f}) {
    OptCase c{Opt::adagrad, {}, {}, {}, ""};
    c.adagrad.lr = 1e-2f;
    c.adagrad.weight_decay = wd;
    c.adagrad.grad_scale = 0.125f;
    c.name = wd > 0 ? "adagrad wd" : "adagrad";
    out.push_back(c);
  }
  return out;
}

void run_path(SimdPath path, const OptCase& c, StepData& d) {
  switch (c.opt) {
    case Opt::adam:
      offload::adam_range(path, c.adam, d.span());
      break;
    case Opt::lion:
      offload::lion_range(path, c.lion, d.span());
      break;
    case Opt::adagrad:
      offload::adagrad_range(path, c.adagrad, d.span());
      break;
  }
}

struct HostRig {
  std::unique_ptr<zero3::Device> device = zero3::make_host_device();
  std::unique_ptr<zero3::Stream> stream = device->create_stream("cpu-optimizer-test");

  zero3::Buffer upload(const void* data, std::size_t n, DType t) {
    zero3::Buffer b = device->allocate(n, t, MemoryKind::device, MemCategory::workspace);
    if (n != 0) std::memcpy(b.data(), data, b.size_bytes());
    return b;
  }
  static void download(const zero3::Buffer& b, void* out) {
    if (!b.empty()) std::memcpy(out, b.data(), b.size_bytes());
  }

  // The same step through kernels::host_backend() on a host device.
  void run(const OptCase& c, StepData& d) {
    const std::size_t n = d.count;
    zero3::Buffer master = upload(d.master.data(), n, DType::f32);
    zero3::Buffer m = upload(d.exp_avg.data(), d.exp_avg.size(), DType::f32);
    zero3::Buffer v = upload(d.exp_avg_sq.data(), d.exp_avg_sq.size(), DType::f32);
    zero3::Buffer g = upload(d.grad.data(), n, d.grad_dtype);
    zero3::Buffer p = d.param_dtype ? upload(d.param.data(), n, *d.param_dtype) : zero3::Buffer{};
    const kernels::KernelBackend& k = kernels::host_backend();
    switch (c.opt) {
      case Opt::adam:
        k.adam_step(*stream, c.adam, master.view(), m.view(), v.view(), g.cview(), p.view());
        break;
      case Opt::lion:
        k.lion_step(*stream, c.lion, master.view(), m.view(), g.cview(), p.view());
        break;
      case Opt::adagrad:
        k.adagrad_step(*stream, c.adagrad, master.view(), v.view(), g.cview(), p.view());
        break;
    }
    stream->synchronize();
    download(master, d.master.data());
    download(m, d.exp_avg.data());
    download(v, d.exp_avg_sq.data());
    if (d.param_dtype) download(p, d.param.data());
  }

  // The same for master and states in their storage dtypes (Bytes: any element type).
  template <typename Step>
  void run_typed(const OptCase& c, Step& d, DType master_dtype, DType state_dtype) {
    const std::size_t n = d.count;
    const std::size_t state_size = zero3::size_of(state_dtype);
    zero3::Buffer master = upload(d.master.data(), n, master_dtype);
    zero3::Buffer m = upload(d.exp_avg.data(), d.exp_avg.size() / state_size, state_dtype);
    zero3::Buffer v = upload(d.exp_avg_sq.data(), d.exp_avg_sq.size() / state_size, state_dtype);
    zero3::Buffer g = upload(d.grad.data(), n, d.grad_dtype);
    zero3::Buffer p = d.param_dtype ? upload(d.param.data(), n, *d.param_dtype) : zero3::Buffer{};
    const kernels::KernelBackend& k = kernels::host_backend();
    switch (c.opt) {
      case Opt::adam:
        k.adam_step(*stream, c.adam, master.view(), m.view(), v.view(), g.cview(), p.view());
        break;
      case Opt::lion:
        k.lion_step(*stream, c.lion, master.view(), m.view(), g.cview(), p.view());
        break;
      case Opt::adagrad:
        k.adagrad_step(*stream, c.adagrad, master.view(), v.view(), g.cview(), p.view());
        break;
    }
    stream->synchronize();
    download(master, d.master.data());
    download(m, d.exp_avg.data());
    download(v, d.exp_avg_sq.data());
    if (d.param_dtype) download(p, d.param.data());
  }
};

// The first differing element of two same-sized arrays of `elem_size`-byte elements, or -1.
long first_diff(const void* a, const void* b, std::size_t bytes, std::size_t elem_size) {
  if (bytes == 0 || std::memcmp(a, b, bytes) == 0) return -1;  // empty vectors may hand out null data()
  const auto* pa = static_cast<const std::uint8_t*>(a);
  const auto* pb = static_cast<const std::uint8_t*>(b);
  for (std::size_t i = 0; i < bytes; i += elem_size) {
    if (std::memcmp(pa + i, pb + i, elem_size) != 0) return static_cast<long>(i / elem_size);
  }
  return -1;
}

std::string hex_bits(const void* p, std::size_t elem_size, long i) {
  std::uint32_t u = 0;
  std::memcpy(&u, static_cast<const std::uint8_t*>(p) + elem_size * static_cast<std::size_t>(i), elem_size);
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%0*x", static_cast<int>(2 * elem_size), u);
  return buf;
}

// got == want bit for bit, naming the first differing element.
void check_same(const char* what, const void* got, const void* want, std::size_t bytes, std::size_t elem_size) {
  const long i = first_diff(got, want, bytes, elem_size);
  INFO(what << ": first differing element " << i
            << (i >= 0 ? ": got " + hex_bits(got, elem_size, i) + ", want " + hex_bits(want, elem_size, i) : ""));
  CHECK(i == -1);
}

void check_same_step(const StepData& got, const StepData& want) {
  check_same("master", got.master.data(), want.master.data(), 4 * got.count, 4);
  check_same("exp_avg", got.exp_avg.data(), want.exp_avg.data(), 4 * got.exp_avg.size(), 4);
  check_same("exp_avg_sq", got.exp_avg_sq.data(), want.exp_avg_sq.data(), 4 * got.exp_avg_sq.size(), 4);
  if (got.param_dtype) {
    check_same("param", got.param.data(), want.param.data(), got.param.size(), zero3::size_of(*got.param_dtype));
  }
}

// got == want element by element, where two NaNs (of any payload) also count as equal.
void check_same_or_both_nan(const char* what, const void* got, const void* want, std::size_t n, DType t) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float g = zero3::load_as_float(got, t, i), w = zero3::load_as_float(want, t, i);
    const bool same =
        std::memcmp(static_cast<const std::uint8_t*>(got) + i * zero3::size_of(t),
                    static_cast<const std::uint8_t*>(want) + i * zero3::size_of(t), zero3::size_of(t)) == 0;
    if (!same && !(std::isnan(g) && std::isnan(w)) && ++bad <= 3) {
      INFO(what << " element " << i << ": got " << g << ", want " << w);
      CHECK(false);
    }
  }
  CHECK(bad == 0);
}

std::string dtype_label(std::optional<DType> t) {
  return t ? std::string(zero3::dtype_name(*t)) : "none";
}

// The SIMD path of the [simd] test cases, set by main from --simd-path.
std::optional<SimdPath> g_simd_path;

SimdPath simd_path_under_test() {
  INFO("the [simd] test cases compare one SIMD path with the scalar path: run with --simd-path avx2 or avx512");
  REQUIRE(g_simd_path.has_value());
  return *g_simd_path;
}

// Every optimizer variant, grad dtype, param dtype (or none) and size, on fresh random inputs:
// fn(case, input, want), want being the scalar path's result.
template <typename Fn>
void for_each_step_case(const Fn& fn) {
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::optional<DType> param_dtypes[] = {std::nullopt, DType::f32, DType::bf16, DType::f16};
  for (const OptCase& c : optimizer_cases()) {
    for (DType gt : kAllDTypes) {
      for (std::optional<DType> pt : param_dtypes) {
        for (std::size_t n : kSizes) {
          INFO(c.name << ", grad " << zero3::dtype_name(gt) << ", param " << dtype_label(pt) << ", n " << n);
          const StepData input = random_step(rng, c.opt, n, gt, pt);
          StepData want = input;
          run_path(SimdPath::scalar, c, want);
          fn(c, input, want);
        }
      }
    }
  }
}

// Every optimizer variant and param dtype, with NaNs of two sources meeting (random_step's nan_meets_nan):
// fn(case, input, want), want being the scalar path's result.
template <typename Fn>
void for_each_nan_case(const Fn& fn) {
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (const OptCase& c : optimizer_cases()) {
    for (DType pt : kAllDTypes) {
      INFO(c.name << ", param " << zero3::dtype_name(pt));
      const StepData input = random_step(rng, c.opt, 4099, DType::f32, pt, true);
      StepData want = input;
      run_path(SimdPath::scalar, c, want);
      fn(c, input, want);
    }
  }
}

void check_same_or_both_nan_step(const StepData& got, const StepData& want) {
  check_same_or_both_nan("master", got.master.data(), want.master.data(), got.count, DType::f32);
  check_same_or_both_nan("exp_avg", got.exp_avg.data(), want.exp_avg.data(), got.exp_avg.size(), DType::f32);
  check_same_or_both_nan("exp_avg_sq", got.exp_avg_sq.data(), want.exp_avg_sq.data(), got.exp_avg_sq.size(),
                         DType::f32);
  check_same_or_both_nan("param", got.param.data(), want.param.data(), got.count, *got.param_dtype);
}

// Lion's sign(+-0) = +0 is only visible on a -0 weight (-0 - 0 = -0, -0 - (-0) = +0), so every combination
// of signed zeros, units, Inf and NaN in p, m and g, twice over, in a vector-unaligned count; with and
// without weight decay: fn(case, input, want), want being the scalar path's result.
template <typename Fn>
void for_each_lion_sign_case(const Fn& fn) {
  const float ps[] = {0.0f, -0.0f, 1.0f, -1.0f, NAN, INFINITY};
  const float ms[] = {0.0f, -0.0f, 1.0f, -1.0f, NAN};
  const float gs[] = {0.0f, -0.0f, 2.0f, -2.0f, NAN, -INFINITY};
  StepData in;
  std::vector<float> grad;
  for (int rep = 0; rep < 2; ++rep) {
    for (float p : ps) {
      for (float m : ms) {
        for (float g : gs) {
          if (int{std::isnan(p)} + int{std::isnan(m)} + int{std::isnan(g)} > 1) continue;  // see random_step
          in.master.push_back(p);
          in.exp_avg.push_back(m);
          grad.push_back(g);
        }
      }
    }
  }
  for (int k = 0; k < 5; ++k) {
    in.master.push_back(-0.0f);
    in.exp_avg.push_back(-0.0f);
    grad.push_back(-0.0f);
  }
  in.count = in.master.size();
  in.grad = to_bytes(grad);
  in.param_dtype = DType::f16;
  in.param.assign(2 * in.count, 0xff);
  for (float wd : {0.0f, 0.5f}) {
    OptCase c{Opt::lion, {}, {}, {}, "lion"};
    c.lion.weight_decay = wd;
    INFO("weight decay " << wd);
    StepData want = in;
    run_path(SimdPath::scalar, c, want);
    fn(c, in, want);
  }
}

// The fp32-to-16-bit conversion of `path` against dtype.hpp's, for bf16 and fp16 params, over a stride-4099
// sweep of all fp32 bit patterns plus dense windows at the format edges. Lion with lr = 0 and a positive
// direction leaves every master as it is (p - 0 * 1; an sNaN is quieted), so the param copy is the
// conversion of the sweep itself.
void check_param_conversion(SimdPath path) {
  std::vector<float> master;
  for (std::uint64_t u = 0; u < (std::uint64_t{1} << 32); u += 4099)
    master.push_back(bits_f32(static_cast<std::uint32_t>(u)));
  const std::uint32_t windows[] = {0x477fe000u,          0x38800000u - 0x1000u, 0x33000000u - 0x100u,
                                   0x7f800000u - 0x100u, 0x7fbfff00u,           0x3f7fff00u};
  for (std::uint32_t start : windows) {
    for (std::uint32_t k = 0; k < 0x2000u; ++k) {
      master.push_back(bits_f32(start + k));
      master.push_back(bits_f32((start + k) | 0x80000000u));
    }
  }
  const std::size_t n = master.size();
  kernels::LionArgs args;
  args.lr = 0.0f;
  for (DType pt : {DType::bf16, DType::f16}) {
    INFO("path " << offload::simd_path_name(path) << ", param " << zero3::dtype_name(pt));
    StepData d;
    d.count = n;
    d.master = master;
    d.exp_avg.assign(n, 1.0f);
    d.grad = to_bytes(std::vector<float>(n, 1.0f));
    d.param_dtype = pt;
    d.param.assign(n * 2, 0xff);
    offload::lion_range(path, args, d.span());
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t want =
          pt == DType::bf16 ? zero3::float_to_bf16(d.master[i]).bits : zero3::float_to_fp16(d.master[i]).bits;
      std::uint16_t got;
      std::memcpy(&got, d.param.data() + 2 * i, 2);
      if (got != want && ++bad <= 5) {
        INFO("fp32 bits " << hex_bits(d.master.data(), 4, long(i)) << " gave " << got << ", dtype.hpp gives " << want);
        CHECK(false);
      }
      // The master itself is untouched (an sNaN only gains its quiet bit).
      const std::uint32_t before = f32_bits(master[i]), after = f32_bits(d.master[i]);
      if (!std::isnan(master[i]) && before != after && ++bad <= 5) {
        INFO("master changed at " << i);
        CHECK(false);
      }
    }
    CHECK(bad == 0);
  }
}

// All 65536 patterns of a 16-bit type.
std::vector<std::uint16_t> all_16bit_patterns() {
  std::vector<std::uint16_t> src(65536);
  for (std::uint32_t u = 0; u < 65536; ++u) src[u] = static_cast<std::uint16_t>(u);
  return src;
}

// For every src dtype and size, random acc and src values (alpha 0.75): fn(rng, src dtype, n, acc0, src).
template <typename Fn>
void for_each_accumulate_case(const Fn& fn) {
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (DType st : kAllDTypes) {
    for (std::size_t n : kSizes) {
      INFO("src " << zero3::dtype_name(st) << ", n " << n);
      const std::vector<float> acc0 = to_floats(random_values(rng, DType::f32, n, -12, 12, false, false));
      const Bytes src = random_values(rng, st, n, -12, 12, false, false);
      fn(rng, st, n, acc0, src);
    }
  }
}

constexpr float kAccumulateAlpha = 0.75f;
constexpr float kNonFinite[] = {INFINITY, -INFINITY, NAN};

// ---- 16-bit master weights and states --------------------------------------------------------------

// The storages kernels.hpp allows besides fp32: (master, state).
struct Storage16 {
  DType master, state;
};
constexpr Storage16 kStorages16[] = {{DType::bf16, DType::f32}, {DType::bf16, DType::bf16}, {DType::f16, DType::f32}};

std::string storage_label(Storage16 s) {
  return std::string("master ") + zero3::dtype_name(s.master).data() + ", state " + zero3::dtype_name(s.state).data();
}

// One step's inputs and outputs with master and states in their storage dtypes, as bytes.
struct StoredStep {
  Bytes master, exp_avg, exp_avg_sq, grad, param;
  DType master_dtype = DType::bf16, state_dtype = DType::f32, grad_dtype = DType::f32;
  std::optional<DType> param_dtype;
  std::size_t count = 0;

  StepSpan span() {
    StepSpan s;
    s.master = master.data();
    s.exp_avg = exp_avg.empty() ? nullptr : exp_avg.data();
    s.exp_avg_sq = exp_avg_sq.empty() ? nullptr : exp_avg_sq.data();
    s.master_dtype = master_dtype;
    s.state_dtype = state_dtype;
    s.grad = grad.data();
    s.grad_dtype = grad_dtype;
    s.param = param_dtype ? param.data() : nullptr;
    s.param_dtype = param_dtype.value_or(DType::bf16);
    s.count = count;
    return s;
  }
};

// random_master's weights rounded to the master dtype (fp16's overflow to Inf included); states of
// random_step's magnitudes with about 1 in 16 subnormal in every storage dtype (2^-130, so that small
// gradients drive them to rounded subnormal results); random_step's gradients, one NaN source per element.
StoredStep random_stored_step(std::mt19937_64& rng, Opt opt, std::size_t n, Storage16 st, DType grad_dtype,
                              std::optional<DType> param_dtype) {
  StoredStep d;
  d.count = n;
  d.master_dtype = st.master;
  d.state_dtype = st.state;
  const std::vector<float> master = random_master(rng, n);
  d.master.resize(n * zero3::size_of(st.master));
  for (std::size_t i = 0; i < n; ++i) zero3::store_from_float(d.master.data(), st.master, i, master[i]);
  auto states = [&](int lo_exp, bool positive) {
    Bytes b = random_values(rng, st.state, n, lo_exp, 2, positive, false);
    for (std::size_t i = 0; i < n; ++i) {
      if (rng() % 16 == 0) zero3::store_from_float(b.data(), st.state, i, positive ? 0x1p-130f : -0x1p-130f);
    }
    return b;
  };
  if (opt != Opt::adagrad) d.exp_avg = states(-20, false);
  if (opt != Opt::lion) d.exp_avg_sq = states(-40, true);
  d.grad_dtype = grad_dtype;
  d.grad = random_values(rng, grad_dtype, n, -24, 4, false, true);
  for (std::size_t i = 0; i < n; ++i) {
    const bool master_special = !std::isfinite(zero3::load_as_float(d.master.data(), st.master, i));
    const bool grad_special = !std::isfinite(zero3::load_as_float(d.grad.data(), grad_dtype, i));
    if (master_special && grad_special) zero3::store_from_float(d.grad.data(), grad_dtype, i, 1.5f);
  }
  d.param_dtype = param_dtype;
  if (param_dtype) d.param.assign(n * zero3::size_of(*param_dtype), 0xff);  // poison: NaN in every dtype
  return d;
}

void run_stored(SimdPath path, const OptCase& c, StoredStep& d, bool stream_param = false) {
  StepSpan s = d.span();
  s.stream_param = stream_param;
  switch (c.opt) {
    case Opt::adam:
      offload::adam_range(path, c.adam, s);
      break;
    case Opt::lion:
      offload::lion_range(path, c.lion, s);
      break;
    case Opt::adagrad:
      offload::adagrad_range(path, c.adagrad, s);
      break;
  }
}

void check_same_stored(const StoredStep& got, const StoredStep& want) {
  check_same("master", got.master.data(), want.master.data(), got.master.size(), zero3::size_of(got.master_dtype));
  check_same("exp_avg", got.exp_avg.data(), want.exp_avg.data(), got.exp_avg.size(), zero3::size_of(got.state_dtype));
  check_same("exp_avg_sq", got.exp_avg_sq.data(), want.exp_avg_sq.data(), got.exp_avg_sq.size(),
             zero3::size_of(got.state_dtype));
  if (got.param_dtype) {
    check_same("param", got.param.data(), want.param.data(), got.param.size(), zero3::size_of(*got.param_dtype));
  }
}

// Every optimizer variant, 16-bit storage, grad dtype, param dtype (or none) and a few sizes, on fresh
// random inputs: fn(case, input, want), want being the scalar path's result.
template <typename Fn>
void for_each_stored_case(const Fn& fn) {
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::optional<DType> param_dtypes[] = {std::nullopt, DType::f32, DType::bf16, DType::f16};
  constexpr std::size_t kStoredSizes[] = {1, 17, 33, 4099};
  for (const OptCase& c : optimizer_cases()) {
    for (const Storage16 st : kStorages16) {
      for (DType gt : kAllDTypes) {
        for (std::optional<DType> pt : param_dtypes) {
          for (std::size_t n : kStoredSizes) {
            INFO(c.name << ", " << storage_label(st) << ", grad " << zero3::dtype_name(gt) << ", param "
                        << dtype_label(pt) << ", n " << n);
            const StoredStep input = random_stored_step(rng, c.opt, n, st, gt, pt);
            StoredStep want = input;
            run_stored(SimdPath::scalar, c, want);
            fn(c, input, want);
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("cpu optimizer: the host device's kernels equal the scalar path bit for bit", "[offload]") {
  HostRig host;
  for_each_step_case([&](const OptCase& c, const StepData& input, const StepData& want) {
    StepData got = input;
    host.run(c, got);
    check_same_step(got, want);
  });
}

TEST_CASE("cpu optimizer: the SIMD path equals the scalar path bit for bit", "[offload][simd]") {
  const SimdPath path = simd_path_under_test();
  INFO("path " << offload::simd_path_name(path) << " vs scalar path");
  for_each_step_case([&](const OptCase& c, const StepData& input, const StepData& want) {
    StepData got = input;
    run_path(path, c, got);
    check_same_step(got, want);
  });
}

TEST_CASE("cpu optimizer: streamed param stores give the scalar path's bits at every alignment of the copy",
          "[offload][simd]") {
  const SimdPath path = simd_path_under_test();
  INFO("path " << offload::simd_path_name(path) << " with stream_param vs scalar path");
  for_each_step_case([&](const OptCase& c, const StepData& input, const StepData& want) {
    if (!input.param_dtype) return;
    const std::size_t elem = zero3::size_of(*input.param_dtype);
    // Offsets 0..16 elements into a 64-byte-aligned buffer: every start a vector store can have, including
    // none aligned within a short span; guard bytes on both sides must stay as they were.
    for (std::size_t offset = 0; offset <= 16; ++offset) {
      INFO("param offset " << offset << " elements");
      StepData got = input;
      constexpr std::uint8_t kGuard = 0xa5;
      std::vector<std::uint8_t> storage((input.count + 32) * elem + 64, kGuard);
      const auto base_addr = reinterpret_cast<std::uintptr_t>(storage.data());
      std::uint8_t* base = storage.data() + (64 - base_addr % 64) % 64;
      const std::span<std::uint8_t> buf(base, (input.count + 32) * elem);
      std::uint8_t* param = buf.data() + offset * elem;
      std::memcpy(param, input.param.data(), input.count * elem);
      StepSpan span = got.span();
      span.param = param;
      span.stream_param = true;
      switch (c.opt) {
        case Opt::adam:
          offload::adam_range(path, c.adam, span);
          break;
        case Opt::lion:
          offload::lion_range(path, c.lion, span);
          break;
        case Opt::adagrad:
          offload::adagrad_range(path, c.adagrad, span);
          break;
      }
      std::memcpy(got.param.data(), param, input.count * elem);
      check_same_step(got, want);
      bool guards_intact = true;
      for (std::size_t i = 0; i < offset * elem; ++i) guards_intact = guards_intact && buf[i] == kGuard;
      for (std::size_t i = (offset + input.count) * elem; i < buf.size(); ++i)
        guards_intact = guards_intact && buf[i] == kGuard;
      CHECK(guards_intact);
    }
  });
}

TEST_CASE("cpu optimizer: where NaNs of two sources meet, the host kernels still give NaN", "[offload]") {
  HostRig host;
  for_each_nan_case([&](const OptCase& c, const StepData& input, const StepData& want) {
    StepData got = input;
    host.run(c, got);
    check_same_or_both_nan_step(got, want);
  });
}

TEST_CASE("cpu optimizer: where NaNs of two sources meet, the SIMD path still gives NaN", "[offload][simd]") {
  const SimdPath path = simd_path_under_test();
  INFO("path " << offload::simd_path_name(path));
  for_each_nan_case([&](const OptCase& c, const StepData& input, const StepData& want) {
    StepData got = input;
    run_path(path, c, got);
    check_same_or_both_nan_step(got, want);
  });
}

TEST_CASE("cpu optimizer: Lion's sign of +-0, NaN and Inf directions: the host kernels equal the scalar path",
          "[offload]") {
  HostRig host;
  for_each_lion_sign_case([&](const OptCase& c, const StepData& input, const StepData& want) {
    StepData got = input;
    host.run(c, got);
    check_same_step(got, want);
  });
}

TEST_CASE("cpu optimizer: Lion's sign of +-0, NaN and Inf directions: the SIMD path equals the scalar path",
          "[offload][simd]") {
  const SimdPath path = simd_path_under_test();
  INFO("path " << offload::simd_path_name(path));
  for_each_lion_sign_case([&](const OptCase& c, const StepData& input, const StepData& want) {
    StepData got = input;
    run_path(path, c, got);
    check_same_step(got, want);
  });
}

TEST_CASE("cpu optimizer: fp32 to bf16/fp16 over a sweep of bit patterns equals dtype.hpp on the scalar path",
          "[offload]") {
  check_param_conversion(SimdPath::scalar);
}

TEST_CASE("cpu optimizer: fp32 to bf16/fp16 over a sweep of bit patterns equals dtype.hpp on the SIMD path",
          "[offload][simd]") {
  check_param_conversion(simd_path_under_test());
}

TEST_CASE("cpu optimizer: every bf16/fp16 gradient bit pattern is read as dtype.hpp reads it on the scalar path",
          "[offload]") {
  // accumulate into zeros with alpha = 1: acc = 0 + 1 * x.
  const std::vector<std::uint16_t> src = all_16bit_patterns();
  for (DType t : {DType::bf16, DType::f16}) {
    INFO("src " << zero3::dtype_name(t));
    std::vector<float> want(65536, 0.0f);
    offload::accumulate_range(SimdPath::scalar, want.data(), src.data(), t, 1.0f, src.size(), false);
    for (std::uint32_t u = 0; u < 65536; ++u) {
      const float x = zero3::load_as_float(src.data(), t, u);
      const float expect = 0.0f + 1.0f * x;
      if (!(f32_bits(want[u]) == f32_bits(expect) || (std::isnan(x) && std::isnan(want[u])))) {
        INFO("scalar path, pattern " << u);
        CHECK(false);
      }
    }
  }
}

TEST_CASE("cpu optimizer: every bf16/fp16 gradient bit pattern is read as the scalar path reads it on the SIMD path",
          "[offload][simd]") {
  const SimdPath path = simd_path_under_test();
  const std::vector<std::uint16_t> src = all_16bit_patterns();
  for (DType t : {DType::bf16, DType::f16}) {
    INFO("path " << offload::simd_path_name(path) << ", src " << zero3::dtype_name(t));
    std::vector<float> want(65536, 0.0f);
    offload::accumulate_range(SimdPath::scalar, want.data(), src.data(), t, 1.0f, src.size(), false);
    std::vector<float> got(65536, 0.0f);
    const GradStats s = offload::accumulate_range(path, got.data(), src.data(), t, 1.0f, src.size(), true);
    check_same("acc", got.data(), want.data(), 4 * got.size(), 4);
    CHECK(s.nonfinite);
  }
}

TEST_CASE("cpu optimizer: accumulate and grad stats on the scalar path, sum_sq near a long double sum", "[offload]") {
  for_each_accumulate_case([](std::mt19937_64& rng, DType st, std::size_t n, const std::vector<float>& acc0,
                              const Bytes& src) {
    std::vector<float> want = acc0;
    const GradStats want_stats =
        offload::accumulate_range(SimdPath::scalar, want.data(), src.data(), st, kAccumulateAlpha, n, true);
    long double ref = 0;
    for (float x : want) ref += static_cast<long double>(x) * x;
    CHECK(!want_stats.nonfinite);
    CHECK(std::fabs(static_cast<double>((want_stats.sum_sq - ref) / ref)) <= 1e-12);
    const GradStats only = offload::grad_stats_range(SimdPath::scalar, want.data(), n);
    CHECK(only.sum_sq == want_stats.sum_sq);

    // Without stats, the same acc.
    std::vector<float> plain = acc0;
    const GradStats none =
        offload::accumulate_range(SimdPath::scalar, plain.data(), src.data(), st, kAccumulateAlpha, n, false);
    CHECK(none.sum_sq == 0.0);
    check_same("acc without stats", plain.data(), want.data(), 4 * n, 4);

    // One Inf or NaN anywhere is seen, in acc (grad_stats) and in src (accumulate).
    const std::size_t at = rng() % n;
    for (float bad : kNonFinite) {
      std::vector<float> a = want;
      a[at] = bad;
      CHECK(offload::grad_stats_range(SimdPath::scalar, a.data(), n).nonfinite);
      Bytes s2 = src;
      zero3::store_from_float(s2.data(), st, at, bad);
      std::vector<float> b = acc0;
      CHECK(offload::accumulate_range(SimdPath::scalar, b.data(), s2.data(), st, kAccumulateAlpha, n, true).nonfinite);
    }
  });
}

TEST_CASE("cpu optimizer: accumulate and grad stats on the SIMD path equal the scalar path's bit for bit",
          "[offload][simd]") {
  const SimdPath path = simd_path_under_test();
  INFO("path " << offload::simd_path_name(path));
  for_each_accumulate_case(
      [&](std::mt19937_64& rng, DType st, std::size_t n, const std::vector<float>& acc0, const Bytes& src) {
        std::vector<float> want = acc0;
        const GradStats want_stats =
            offload::accumulate_range(SimdPath::scalar, want.data(), src.data(), st, kAccumulateAlpha, n, true);
        const GradStats only = offload::grad_stats_range(SimdPath::scalar, want.data(), n);

        std::vector<float> got = acc0;
        const GradStats s = offload::accumulate_range(path, got.data(), src.data(), st, kAccumulateAlpha, n, true);
        check_same("acc", got.data(), want.data(), 4 * n, 4);
        CHECK(std::memcmp(&s.sum_sq, &want_stats.sum_sq, sizeof(double)) == 0);
        CHECK(s.nonfinite == want_stats.nonfinite);
        const GradStats g = offload::grad_stats_range(path, want.data(), n);
        CHECK(std::memcmp(&g.sum_sq, &only.sum_sq, sizeof(double)) == 0);
        CHECK(!g.nonfinite);

        // One Inf or NaN anywhere is seen, in acc (grad_stats) and in src (accumulate), with the scalar acc.
        const std::size_t at = rng() % n;
        for (float bad : kNonFinite) {
          std::vector<float> a = want;
          a[at] = bad;
          CHECK(offload::grad_stats_range(path, a.data(), n).nonfinite);
          Bytes s2 = src;
          zero3::store_from_float(s2.data(), st, at, bad);
          std::vector<float> b = acc0;
          offload::accumulate_range(SimdPath::scalar, b.data(), s2.data(), st, kAccumulateAlpha, n, true);
          std::vector<float> c = acc0;
          CHECK(offload::accumulate_range(path, c.data(), s2.data(), st, kAccumulateAlpha, n, true).nonfinite);
          check_same("acc with a non-finite src", c.data(), b.data(), 4 * n, 4);
        }
      });
}

TEST_CASE("cpu optimizer: 16-bit master and states: the host device's kernels equal the scalar path bit for bit",
          "[offload]") {
  HostRig host;
  for_each_stored_case([&](const OptCase& c, const StoredStep& input, const StoredStep& want) {
    StoredStep got = input;
    host.run_typed(c, got, got.master_dtype, got.state_dtype);
    check_same_stored(got, want);
  });
}

TEST_CASE("cpu optimizer: 16-bit master and states: the SIMD path equals the scalar path bit for bit",
          "[offload][simd]") {
  const SimdPath path = simd_path_under_test();
  INFO("path " << offload::simd_path_name(path) << " vs scalar path");
  for_each_stored_case([&](const OptCase& c, const StoredStep& input, const StoredStep& want) {
    StoredStep got = input;
    run_stored(path, c, got);
    check_same_stored(got, want);
    // Streamed param stores too (their head and tail go to the scalar path, the body streams).
    if (input.param_dtype && input.count > 16) {
      StoredStep streamed = input;
      run_stored(path, c, streamed, true);
      check_same_stored(streamed, want);
    }
  });
}

TEST_CASE("cpu optimizer: 16-bit master and states: the param copy is the stored master converted", "[offload]") {
  // kernels.hpp's rule, on every path this CPU has: param == cast(master) after the step, for every param
  // dtype, including fp16 params of an fp16 master past 65504 (Inf in both) and bf16 params of fp16 masters.
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  for (SimdPath path : {SimdPath::scalar, SimdPath::avx2, SimdPath::avx512}) {
    if (!offload::simd_path_supported(path)) continue;
    for (const Storage16 st : kStorages16) {
      for (DType pt : kAllDTypes) {
        INFO("path " << offload::simd_path_name(path) << ", " << storage_label(st) << ", param "
                     << zero3::dtype_name(pt));
        OptCase c{Opt::adam, {}, {}, {}, "adamw"};
        c.adam.weight_decay = 0.01f;
        StoredStep d = random_stored_step(rng, Opt::adam, 4099, st, DType::f32, pt);
        run_stored(path, c, d);
        std::size_t bad = 0;
        for (std::size_t i = 0; i < d.count; ++i) {
          const float m = zero3::load_as_float(d.master.data(), st.master, i);
          Bytes want(zero3::size_of(pt));
          zero3::store_from_float(want.data(), pt, 0, m);
          if (std::memcmp(want.data(), d.param.data() + i * zero3::size_of(pt), want.size()) != 0 && ++bad <= 3) {
            INFO("element " << i << ": master " << m);
            CHECK(false);
          }
        }
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("cpu optimizer: fp32 storage named explicitly is the default step", "[offload]") {
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const SimdPath path = offload::best_simd_path();
  for (const OptCase& c : optimizer_cases()) {
    INFO(c.name);
    const StepData input = random_step(rng, c.opt, 4099, DType::bf16, DType::bf16);
    StepData want = input;
    run_path(path, c, want);
    StepData got = input;
    StepSpan s = got.span();
    s.master_dtype = DType::f32;
    s.state_dtype = DType::f32;
    switch (c.opt) {
      case Opt::adam:
        offload::adam_range(path, c.adam, s);
        break;
      case Opt::lion:
        offload::lion_range(path, c.lion, s);
        break;
      case Opt::adagrad:
        offload::adagrad_range(path, c.adagrad, s);
        break;
    }
    check_same_step(got, want);
  }
}

TEST_CASE("cpu optimizer: arguments are checked at the boundary", "[offload]") {
  const SimdPath path = offload::best_simd_path();
  std::vector<float> a(8, 1.0f), m(8, 0.0f), v(8, 1.0f), g(8, 1.0f);
  StepSpan s{a.data(), m.data(), v.data(), g.data(), DType::f32, nullptr, DType::bf16, 8};
  kernels::AdamArgs adam;
  CHECK_NOTHROW(offload::adam_range(path, adam, s));
  StepSpan bad = s;
  bad.exp_avg = nullptr;
  CHECK_THROWS_AS(offload::adam_range(path, adam, bad), zero3::UsageError);
  CHECK_THROWS_AS(offload::lion_range(path, kernels::LionArgs{}, bad), zero3::UsageError);
  CHECK_NOTHROW(offload::adagrad_range(path, kernels::AdagradArgs{}, bad));  // Adagrad keeps no exp_avg
  bad = s;
  bad.grad = nullptr;
  CHECK_THROWS_AS(offload::adagrad_range(path, kernels::AdagradArgs{}, bad), zero3::UsageError);
  bad = s;
  bad.grad_dtype = static_cast<DType>(7);
  CHECK_THROWS_AS(offload::adam_range(path, adam, bad), zero3::UsageError);
  bad = s;
  bad.param = g.data();
  bad.param_dtype = static_cast<DType>(9);
  CHECK_THROWS_AS(offload::adam_range(path, adam, bad), zero3::UsageError);
  CHECK_NOTHROW(offload::adam_range(path, adam, StepSpan{}));  // count 0: nothing to check
  // Storage pairs: kernels::optimizer_storage_supported's (bf16 state only with a bf16 master, no fp16 state).
  std::vector<std::uint16_t> h(8, 0x3f80), hm(8, 0), hv(8, 0x3f80);  // bf16 1, 0, 1
  StepSpan low = s;
  low.master = h.data();
  low.master_dtype = DType::bf16;
  CHECK_NOTHROW(offload::adam_range(path, adam, low));
  low.exp_avg = hm.data();
  low.exp_avg_sq = hv.data();
  low.state_dtype = DType::bf16;
  CHECK_NOTHROW(offload::adam_range(path, adam, low));
  low.master_dtype = DType::f16;
  CHECK_THROWS_WITH(offload::adam_range(path, adam, low), Catch::Contains("bf16 state only with a bf16 master"));
  low.master_dtype = DType::bf16;
  low.state_dtype = DType::f16;
  CHECK_THROWS_AS(offload::lion_range(path, kernels::LionArgs{}, low), zero3::UsageError);
  bad = s;
  bad.state_dtype = DType::bf16;  // fp32 master
  CHECK_THROWS_AS(offload::adagrad_range(path, kernels::AdagradArgs{}, bad), zero3::UsageError);
  bad = s;
  bad.master_dtype = static_cast<DType>(6);
  CHECK_THROWS_WITH(offload::adam_range(path, adam, bad), Catch::Contains("unknown dtype 6"));
  CHECK_THROWS_AS(offload::accumulate_range(path, nullptr, g.data(), DType::f32, 1.0f, 8, true), zero3::UsageError);
  CHECK_THROWS_AS(offload::accumulate_range(path, a.data(), g.data(), static_cast<DType>(5), 1.0f, 8, true),
                  zero3::UsageError);
  CHECK_THROWS_AS(offload::grad_stats_range(path, nullptr, 8), zero3::UsageError);
  CHECK(offload::grad_stats_range(path, nullptr, 0).sum_sq == 0.0);
  // A value outside the enum, and each path: usable exactly where supported.
  CHECK_THROWS_WITH(offload::grad_stats_range(static_cast<SimdPath>(3), g.data(), 8),
                    "grad_stats_range: unknown SIMD path 3");
  for (SimdPath p : {SimdPath::scalar, SimdPath::avx2, SimdPath::avx512}) {
    INFO("path " << offload::simd_path_name(p));
    if (offload::simd_path_supported(p)) {
      CHECK(offload::grad_stats_range(p, g.data(), 8).sum_sq == 8.0);  // g: eight 1s
    } else {
      CHECK_THROWS_WITH(offload::grad_stats_range(p, g.data(), 8), Catch::Contains("is not supported"));
    }
  }
}

TEST_CASE("cpu optimizer: ZERO3_CPU_SIMD narrows the path; a bogus value is an Error", "[offload]") {
  const char* old = std::getenv("ZERO3_CPU_SIMD");
  const std::string saved = old ? old : "";
  ::unsetenv("ZERO3_CPU_SIMD");
  const SimdPath widest = offload::best_simd_path();
  CHECK(offload::simd_path_supported(SimdPath::scalar));
  // Without the variable: the last supported path in scalar, avx2, avx512.
  SimdPath want_widest = SimdPath::scalar;
  for (SimdPath p : {SimdPath::avx2, SimdPath::avx512}) {
    if (offload::simd_path_supported(p)) want_widest = p;
  }
  CHECK(widest == want_widest);
  CHECK(offload::simd_path_name(SimdPath::avx2) == "avx2");

  // Each path by name: that path where supported, else an Error naming the variable and the path.
  for (SimdPath p : {SimdPath::scalar, SimdPath::avx2, SimdPath::avx512}) {
    const std::string name(offload::simd_path_name(p));
    INFO("ZERO3_CPU_SIMD=" << name);
    ::setenv("ZERO3_CPU_SIMD", name.c_str(), 1);
    if (offload::simd_path_supported(p)) {
      CHECK(offload::best_simd_path() == p);
    } else {
      CHECK_THROWS_WITH(offload::best_simd_path(), Catch::Contains("ZERO3_CPU_SIMD=" + name));
      CHECK_THROWS_AS(offload::best_simd_path(), zero3::Error);
    }
  }
  ::setenv("ZERO3_CPU_SIMD", "sse9", 1);
  CHECK_THROWS_WITH(offload::best_simd_path(), Catch::Contains("ZERO3_CPU_SIMD") && Catch::Contains("sse9"));
  CHECK_THROWS_AS(offload::best_simd_path(), zero3::Error);

  if (old) {
    ::setenv("ZERO3_CPU_SIMD", saved.c_str(), 1);
  } else {
    ::unsetenv("ZERO3_CPU_SIMD");
  }
}

namespace {

int allowed_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  return CPU_COUNT(&set);
}

}  // namespace

TEST_CASE("CpuThreadPool: tiles cover every element once, with fixed boundaries", "[offload]") {
  for (int threads : {1, 2, 4}) {
    offload::CpuThreadPool pool(threads);
    CHECK(pool.threads() == threads);
    for (std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{100003}, std::size_t{1} << 20}) {
      for (std::size_t tile : {std::size_t{1} << 10, offload::kCpuStepTileElems}) {
        INFO("threads " << threads << ", count " << count << ", tile " << tile);
        std::vector<std::atomic<int>> hits(count);
        std::atomic<bool> aligned{true};
        pool.for_tiles(count, tile, [&](std::size_t b, std::size_t e) {
          if (b % tile != 0 || e != std::min(b + tile, count)) aligned = false;
          for (std::size_t i = b; i < e; ++i) hits[i].fetch_add(1, std::memory_order_relaxed);
        });
        CHECK(aligned.load());
        CHECK(std::all_of(hits.begin(), hits.end(), [](const std::atomic<int>& h) { return h.load() == 1; }));
      }
    }
  }
  offload::CpuThreadPool pool(2);
  CHECK_THROWS_AS(pool.for_tiles(10, 0, [](std::size_t, std::size_t) {}), zero3::UsageError);
  bool called = false;
  pool.for_tiles(0, 16, [&](std::size_t, std::size_t) { called = true; });
  CHECK(!called);
}

TEST_CASE("CpuThreadPool: reduce_tiles gives the same bits on 1 and several threads", "[offload]") {
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::size_t n = (std::size_t{1} << 20) + 12345;
  const std::vector<float> x = to_floats(random_values(rng, DType::f32, n, -10, 10, false, false));
  const SimdPath path = offload::best_simd_path();
  auto stats = [&](std::size_t b, std::size_t e) { return offload::grad_stats_range(path, x.data() + b, e - b); };
  offload::CpuThreadPool one(1);
  const GradStats want = one.reduce_tiles(n, offload::kCpuStepTileElems, stats);
  long double ref = 0;
  for (float v : x) ref += static_cast<long double>(v) * v;
  CHECK(std::fabs(static_cast<double>((want.sum_sq - ref) / ref)) <= 1e-12);
  CHECK(!want.nonfinite);
  for (int threads : {2, 3, 4}) {
    offload::CpuThreadPool pool(threads);
    for (int rep = 0; rep < 3; ++rep) {
      const GradStats got = pool.reduce_tiles(n, offload::kCpuStepTileElems, stats);
      CHECK(std::memcmp(&got.sum_sq, &want.sum_sq, sizeof(double)) == 0);
      CHECK(got.nonfinite == want.nonfinite);
    }
  }
}

TEST_CASE("CpuThreadPool: workers bound to one CPU run there; defaults follow the CPU set", "[offload]") {
  cpu_set_t before;
  CPU_ZERO(&before);
  REQUIRE(sched_getaffinity(0, sizeof before, &before) == 0);
  int cpu = 0;  // the first CPU of this process's set
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &before)) ++cpu;
  REQUIRE(cpu < CPU_SETSIZE);
  INFO("bound to CPU " << cpu);
  offload::CpuThreadPool pool(2, {cpu});
  CHECK(pool.cpus() == std::vector<int>{cpu});
  std::atomic<int> tiles{0}, off_cpu{0};
  pool.for_tiles(std::size_t{1} << 20, std::size_t{1} << 14, [&](std::size_t, std::size_t) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0 || CPU_COUNT(&set) != 1 || !CPU_ISSET(cpu, &set)) ++off_cpu;
    ++tiles;
  });
  CHECK(tiles.load() == 64);
  CHECK(off_cpu.load() == 0);
  // The caller's own mask is given back when it leaves the arena.
  cpu_set_t after;
  CPU_ZERO(&after);
  REQUIRE(sched_getaffinity(0, sizeof after, &after) == 0);
  CHECK(CPU_EQUAL(&before, &after));

  CHECK(offload::CpuThreadPool(0).threads() == allowed_cpu_count());
  CHECK(offload::CpuThreadPool(-1, {cpu}).threads() == 1);
  CHECK_THROWS_AS(offload::CpuThreadPool(1, {1 << 20}), zero3::UsageError);
  CHECK_THROWS_AS(offload::CpuThreadPool(1, {-1}), zero3::UsageError);
}

// --simd-path NAME picks the path of the [simd] test cases. A path this CPU or build lacks, or one wider
// than ZERO3_CPU_SIMD allows, is reported as skipped (exit code 77) before any test case runs.
int main(int argc, char** argv) {
  Catch::Session session;
  std::string path_name;
  session.cli(session.cli() | Catch::clara::Opt(path_name, "avx2|avx512")["--simd-path"](
                                  "the SIMD path the [simd] test cases compare with the scalar path"));
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  if (!path_name.empty()) {
    std::optional<SimdPath> path;
    for (SimdPath p : {SimdPath::avx2, SimdPath::avx512}) {
      if (path_name == offload::simd_path_name(p)) path = p;
    }
    if (!path) {
      std::fprintf(stderr, "--simd-path %s: use avx2 or avx512\n", path_name.c_str());
      return 2;
    }
    if (!offload::simd_path_supported(*path)) {
      zero3::test::skip("SIMD path " + path_name + " is not supported by this CPU or build");
    }
    try {
      const SimdPath allowed = offload::best_simd_path();
      if (static_cast<int>(*path) > static_cast<int>(allowed)) {
        zero3::test::skip("SIMD path " + path_name +
                          " is wider than ZERO3_CPU_SIMD=" + std::string(offload::simd_path_name(allowed)) + " allows");
      }
    } catch (const zero3::Error& e) {
      std::fprintf(stderr, "%s\n", e.what());
      return 2;
    }
    g_simd_path = path;
  }
  return session.run();
}
