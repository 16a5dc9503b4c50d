// The host accumulate and fused optimizer steps against float64 references written here. Each optimizer
// runs steps 1..5 on fresh random inputs of odd sizes; before every step the fp32 state is read back, and
// the reference computes that one step from it in double, with a bound on the fp32 kernel's rounding
// error (see kU and the *_ref functions). The low-precision param copy must equal the fp32 master
// converted by zero3/core/dtype.hpp, bit for bit. Rerun a failure with --rng-seed <printed seed>.
#include <oneapi/tbb/global_control.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <future>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/device/device.hpp"
#include "zero3/kernels/kernels.hpp"

namespace {

using zero3::Buffer;
using zero3::BufferView;
using zero3::DType;
using zero3::MemCategory;
using zero3::MemoryKind;
namespace kernels = zero3::kernels;
using zero3::test::fill_random;
using zero3::test::poison;
using zero3::test::random_float;
using zero3::test::test_seed;
using zero3::test::value_at;

// fp32 unit roundoff: one correctly rounded fp32 operation has relative error at most kU. Every bound
// below is (number of roundings, counted along the formula) * kU * (a magnitude: the same formula with
// every term made non-negative, which bounds each intermediate), doubled for second-order terms.
constexpr double kU = 0x1p-24;

constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16};

std::vector<float> snapshot(const Buffer& b) {
  std::vector<float> out(b.count());
  for (std::size_t i = 0; i < b.count(); ++i) out[i] = zero3::load_as_float(b.data(), b.dtype(), i);
  return out;
}

bool same_bytes(const Buffer& a, const Buffer& b) {
  return a.size_bytes() == b.size_bytes() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

struct HostEnv {
  std::unique_ptr<zero3::Device> device = zero3::make_host_device();
  std::unique_ptr<zero3::Stream> stream = device->create_stream("optim-test");
  const kernels::KernelBackend& k = device->kernels();
  Buffer alloc(std::size_t n, DType t) { return device->allocate(n, t, MemoryKind::device, MemCategory::workspace); }
};

// Counts mismatches and reports the first few.
struct Mismatches {
  std::size_t count = 0;
  void add(const char* what, std::size_t i, double got, double want, double tol) {
    if (++count <= 5) {
      INFO(what << " element " << i << ": got " << got << ", want " << want << " +- " << tol);
      CHECK(false);
    }
  }
  void near(const char* what, std::size_t i, double got, double want, double tol) {
    if (!(std::fabs(got - want) <= tol)) add(what, i, got, want, tol);
  }
};

// The bits of v rounded to t by dtype.hpp, and the bits of element i of b.
std::uint32_t converted_bits(float v, DType t) {
  switch (t) {
    case DType::f32:
      return zero3::float_bits(v);
    case DType::f16:
      return zero3::float_to_fp16(v).bits;
    case DType::bf16:
      return zero3::float_to_bf16(v).bits;
  }
  return 0;
}
std::uint32_t bits_at(const Buffer& b, std::size_t i) {
  const auto* p = static_cast<const unsigned char*>(b.data()) + i * zero3::size_of(b.dtype());
  if (b.dtype() == DType::f32) {
    std::uint32_t u;
    std::memcpy(&u, p, sizeof u);
    return u;
  }
  std::uint16_t h;
  std::memcpy(&h, p, sizeof h);
  return h;
}

// The low-precision copy is the master as stored (fp32, or already rounded to a 16-bit master's dtype)
// converted once by dtype.hpp, bit for bit.
void check_param_copy(const Buffer& master, const Buffer& param, Mismatches& bad) {
  if (param.count() == 0) return;
  for (std::size_t i = 0; i < master.count(); ++i) {
    const auto m = static_cast<float>(value_at(master, i));
    if (bits_at(param, i) != converted_bits(m, param.dtype()))
      bad.add("param copy of master", i, value_at(param, i), m, 0.0);
  }
}

// ---- float64 references of one step, from fp32 inputs (exact in double) --------------------------

struct AdamRef {
  double p, m, v;
  double tol_p, tol_m, tol_v;
};

// g = grad * scale (+ wd * p for L2). G bounds |g| and every rounded term of it.
AdamRef adam_ref(const kernels::AdamArgs& a, double p0, double m0, double v0, double grad) {
  const double b1 = a.beta1, b2 = a.beta2, lr = a.lr, wd = a.weight_decay;
  const bool l2 = wd > 0 && !a.adamw;
  const bool decoupled = wd > 0 && a.adamw;
  double g = grad * a.grad_scale;
  double G = std::fabs(g);
  if (l2) {
    g += wd * p0;
    G += std::fabs(wd * p0);
  }
  AdamRef r{};
  r.m = b1 * m0 + (1 - b1) * g;
  r.v = b2 * v0 + (1 - b2) * g * g;
  const double M = b1 * std::fabs(m0) + (1 - b1) * G;
  const double V = b2 * v0 + (1 - b2) * G * G;
  const double t = static_cast<double>(a.step);
  const double bc1 = a.bias_correction ? 1 - std::pow(b1, t) : 1;
  const double bc2 = a.bias_correction ? 1 - std::pow(b2, t) : 1;
  const double denom = std::sqrt(r.v) / std::sqrt(bc2) + a.eps;
  r.p = p0;
  if (decoupled) r.p -= lr * wd * p0;
  r.p -= (lr / bc1) * (r.m / denom);
  // m: 2 products, 1 sum, and g's 2 roundings carried in: 4 kU M (doubled: 8). v: g*g carries 2x g's
  // error, then 3 more roundings: 7 kU V (doubled: 16). p: the update m/denom has relative error
  // (9 + 4 rho) kU, where rho = V / v amplifies v's error when an L2 term cancels the gradient (rho = 1
  // otherwise); the step size, its product and the 2 weight roundings add 4 more (doubled: 26 + 8 rho).
  const double rho = V / r.v;
  r.tol_m = 8 * kU * M;
  r.tol_v = 16 * kU * V;
  r.tol_p = (26 + 8 * rho) * kU * (std::fabs(p0) + (lr / bc1) * (M / denom));
  return r;
}

struct LionRef {
  double p_for_sign[3];  // the new weight for direction sign -1, 0, +1
  bool sign_allowed[3];  // which signs the fp32 kernel may take (all three when the direction is ~0)
  double m;
  double tol_p, tol_m;
};

LionRef lion_ref(const kernels::LionArgs& a, double p0, double m0, double grad) {
  const double b1 = a.beta1, b2 = a.beta2, lr = a.lr, wd = a.weight_decay;
  const double g = grad * a.grad_scale;
  const double c = b1 * m0 + (1 - b1) * g;
  // c: 3 roundings plus g's one: within 4 kU C (doubled: 8). Closer to 0 than that, fp32 may see
  // either sign (or exactly 0).
  const double tol_c = 8 * kU * (b1 * std::fabs(m0) + (1 - b1) * std::fabs(g));
  const double after_decay = wd > 0 ? 1 - lr * wd : 1;
  LionRef r{};
  for (int s = -1; s <= 1; ++s) {
    r.p_for_sign[s + 1] = p0 * after_decay - lr * s;
    r.sign_allowed[s + 1] = std::fabs(c) <= tol_c || (c > 0 ? s == 1 : s == -1);
  }
  r.m = b2 * m0 + (1 - b2) * g;
  // p: after_decay's rounding, the product, the difference (doubled: 8 kU of |p0| + lr). m: as c.
  r.tol_p = 8 * kU * (std::fabs(p0) + lr);
  r.tol_m = 8 * kU * (b2 * std::fabs(m0) + (1 - b2) * std::fabs(g));
  return r;
}

struct AdagradRef {
  double p, s;
  double tol_p, tol_s;
};

AdagradRef adagrad_ref(const kernels::AdagradArgs& a, double p0, double s0, double grad) {
  const double lr = a.lr, wd = a.weight_decay;
  double g = grad * a.grad_scale;
  double G = std::fabs(g);
  if (wd > 0) {
    g += wd * p0;
    G += std::fabs(wd * p0);
  }
  AdagradRef r{};
  r.s = s0 + g * g;
  const double S = s0 + G * G;
  const double denom = std::sqrt(r.s) + a.eps;
  r.p = p0 - lr * (g / denom);
  // s: g*g carries 2x g's error (4 kU), then 2 roundings (doubled: 16). p: g / denom has relative
  // error (5 + 4 rho) kU with rho = S / s (see adam_ref); the product and difference add 2 (doubled).
  const double rho = S / r.s;
  r.tol_s = 16 * kU * S;
  r.tol_p = (14 + 8 * rho) * kU * (std::fabs(p0) + lr * (G / denom));
  return r;
}

// ---- the buffers of one optimizer ----------------------------------------------------------------

// master, two state slots (the second unused by Lion and Adagrad), grad and the param copy; master and
// states fp32 unless a 16-bit storage is asked for.
struct StepBuffers {
  Buffer master, s1, s2, grad, param;
  StepBuffers(HostEnv& env, std::size_t n, DType grad_t, std::optional<DType> param_t, DType master_t = DType::f32,
              DType state_t = DType::f32)
      : master(env.alloc(n, master_t)),
        s1(env.alloc(n, state_t)),
        s2(env.alloc(n, state_t)),
        grad(env.alloc(n, grad_t)),
        param(param_t ? env.alloc(n, *param_t) : Buffer{}) {}
  // Weights around 1, first moments small and signed, second moments and sums positive.
  void init(std::mt19937_64& rng) {
    fill_random(master, rng, -4, 2);
    fill_random(s1, rng, -12, -4);
    fill_random(s2, rng, -20, -8, /*positive=*/true);
    poison(param);
  }
  // A fresh gradient for each step.
  void new_grad(std::mt19937_64& rng) { fill_random(grad, rng, -12, 0); }
  BufferView param_view() const { return param.count() == 0 ? BufferView{} : param.view(); }
};

std::optional<DType> param_case() {
  return GENERATE(as<std::optional<DType>>{}, std::nullopt, DType::f32, DType::f16, DType::bf16);
}

const char* param_name(std::optional<DType> t) {
  return t ? zero3::dtype_name(*t).data() : "none";
}

}  // namespace

TEST_CASE("optim kernels: accumulate adds alpha * src in fp32, exactly as one multiply and one add", "[kernels]") {
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 1023, 4097, 300007);
  const DType src_t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", src " << zero3::dtype_name(src_t) << ", seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  Buffer dst = env.alloc(n, DType::f32);
  Buffer src = env.alloc(n, src_t);
  fill_random(dst, rng, -10, 6);
  fill_random(src, rng, -10, 6);
  const float alpha = random_float(rng, -3, 3);
  const std::vector<float> before = snapshot(dst);
  env.k.accumulate(*env.stream, dst.view(), src.cview(), alpha);
  env.stream->synchronize();
  // alpha * src is exact in double, and rounding a double sum of two floats to float is the correctly
  // rounded fp32 sum (53 >= 2 * 24 + 2): this reference is exact.
  Mismatches bad;
  for (std::size_t i = 0; i < n; ++i) {
    const float prod = static_cast<float>(static_cast<double>(alpha) * value_at(src, i));
    const float want = static_cast<float>(static_cast<double>(before[i]) + prod);
    if (std::memcmp(&want, static_cast<const float*>(dst.data()) + i, sizeof want) != 0) {
      bad.add("dst", i, value_at(dst, i), want, 0.0);
    }
  }
  CHECK(bad.count == 0);
}

TEST_CASE("optim kernels: accumulate onto itself doubles in place", "[kernels]") {
  HostEnv env;
  Buffer x = env.alloc(5, DType::f32);
  const float v[5] = {1.5f, -3.0f, 0.25f, 1e30f, -7.0f};
  std::memcpy(x.data(), v, sizeof v);
  env.k.accumulate(*env.stream, x.view(), x.cview(), 1.0f);
  env.stream->synchronize();
  for (std::size_t i = 0; i < 5; ++i) CHECK(static_cast<const float*>(x.data())[i] == 2 * v[i]);
}

TEST_CASE("optim kernels: adam_step matches a float64 reference over five steps", "[kernels]") {
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 7, 1023, 4097);
  const DType grad_t = GENERATE(DType::f32, DType::bf16);
  const std::optional<DType> param_t = param_case();
  // AdamW with decay, classic Adam (L2) with decay, no decay, and no bias correction.
  const int variant = GENERATE(0, 1, 2, 3);
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", grad " << zero3::dtype_name(grad_t) << ", param " << param_name(param_t) << ", variant "
            << variant << ", seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  kernels::AdamArgs args;
  args.lr = 3e-3f;
  args.beta1 = 0.9f;
  args.beta2 = 0.999f;
  args.eps = 1e-8f;
  args.weight_decay = variant <= 1 ? 0.05f : 0.0f;
  args.adamw = variant != 1;
  args.bias_correction = variant != 3;
  args.grad_scale = 0.75f;
  StepBuffers b(env, n, grad_t, param_t);
  b.init(rng);
  for (std::int64_t step = 1; step <= 5; ++step) {
    INFO("step " << step);
    args.step = step;
    b.new_grad(rng);
    const std::vector<float> p0 = snapshot(b.master), m0 = snapshot(b.s1), v0 = snapshot(b.s2);
    env.k.adam_step(*env.stream, args, b.master.view(), b.s1.view(), b.s2.view(), b.grad.cview(), b.param_view());
    env.stream->synchronize();
    Mismatches bad;
    for (std::size_t i = 0; i < n; ++i) {
      const AdamRef r = adam_ref(args, p0[i], m0[i], v0[i], value_at(b.grad, i));
      bad.near("master", i, value_at(b.master, i), r.p, r.tol_p);
      bad.near("exp_avg", i, value_at(b.s1, i), r.m, r.tol_m);
      bad.near("exp_avg_sq", i, value_at(b.s2, i), r.v, r.tol_v);
    }
    check_param_copy(b.master, b.param, bad);
    CHECK(bad.count == 0);
  }
}

TEST_CASE("optim kernels: lion_step matches a float64 reference over five steps", "[kernels]") {
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 7, 1023, 4097);
  const DType grad_t = GENERATE(DType::f32, DType::f16);
  const std::optional<DType> param_t = param_case();
  const float weight_decay = GENERATE(0.0f, 0.1f);
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", grad " << zero3::dtype_name(grad_t) << ", param " << param_name(param_t) << ", weight_decay "
            << weight_decay << ", seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  kernels::LionArgs args;
  args.lr = 1e-3f;
  args.beta1 = 0.9f;
  args.beta2 = 0.99f;
  args.weight_decay = weight_decay;
  args.grad_scale = 1.5f;
  StepBuffers b(env, n, grad_t, param_t);
  b.init(rng);
  for (int step = 1; step <= 5; ++step) {
    INFO("step " << step);
    b.new_grad(rng);
    const std::vector<float> p0 = snapshot(b.master), m0 = snapshot(b.s1);
    env.k.lion_step(*env.stream, args, b.master.view(), b.s1.view(), b.grad.cview(), b.param_view());
    env.stream->synchronize();
    Mismatches bad;
    for (std::size_t i = 0; i < n; ++i) {
      const LionRef r = lion_ref(args, p0[i], m0[i], value_at(b.grad, i));
      const double got = value_at(b.master, i);
      bool matched = false;
      for (int s = 0; s < 3; ++s) matched |= r.sign_allowed[s] && std::fabs(got - r.p_for_sign[s]) <= r.tol_p;
      if (!matched) bad.add("master", i, got, r.p_for_sign[1], r.tol_p);
      bad.near("exp_avg", i, value_at(b.s1, i), r.m, r.tol_m);
    }
    check_param_copy(b.master, b.param, bad);
    CHECK(bad.count == 0);
  }
}

TEST_CASE("optim kernels: adagrad_step matches a float64 reference over five steps", "[kernels]") {
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 7, 1023, 4097);
  const DType grad_t = GENERATE(DType::f32, DType::bf16);
  const std::optional<DType> param_t = param_case();
  const float weight_decay = GENERATE(0.0f, 0.01f);
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", grad " << zero3::dtype_name(grad_t) << ", param " << param_name(param_t) << ", weight_decay "
            << weight_decay << ", seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  kernels::AdagradArgs args;
  args.lr = 1e-2f;
  args.eps = 1e-10f;
  args.weight_decay = weight_decay;
  args.grad_scale = 0.5f;
  StepBuffers b(env, n, grad_t, param_t);
  b.init(rng);
  for (int step = 1; step <= 5; ++step) {
    INFO("step " << step);
    b.new_grad(rng);
    const std::vector<float> p0 = snapshot(b.master), s0 = snapshot(b.s2);
    env.k.adagrad_step(*env.stream, args, b.master.view(), b.s2.view(), b.grad.cview(), b.param_view());
    env.stream->synchronize();
    Mismatches bad;
    for (std::size_t i = 0; i < n; ++i) {
      const AdagradRef r = adagrad_ref(args, p0[i], s0[i], value_at(b.grad, i));
      bad.near("master", i, value_at(b.master, i), r.p, r.tol_p);
      bad.near("sum_sq", i, value_at(b.s2, i), r.s, r.tol_s);
    }
    check_param_copy(b.master, b.param, bad);
    CHECK(bad.count == 0);
  }
}

// ---- 16-bit master weights and optimizer states ---------------------------------------------------
// kernels.hpp's rule: widen to fp32, update in fp32 exactly as with fp32 storage, round each result to its
// storage dtype to nearest even. Two references per step: the fp32 step itself on the widened inputs,
// whose results rounded once by dtype.hpp must be the stored values bit for bit (the rule, exactly); and
// one step in double from the stored (widened) values, rounded straight to the storage dtype, which the
// stored value must lie within one ulp of (plus the fp32 error bound of the *_ref functions where that
// exceeds half an ulp: terms that cancel) and equal exactly in all but the few elements whose exact value
// lies within the fp32 error of a 16-bit rounding boundary (the fraction is printed).

namespace {

// The 16-bit storages kernels.hpp allows: (master, state).
struct Storage {
  DType master, state;
};
constexpr Storage kStorages16[] = {{DType::bf16, DType::f32}, {DType::bf16, DType::bf16}, {DType::f16, DType::f32}};

std::string storage_name(Storage s) {
  return std::string("master ") + zero3::dtype_name(s.master).data() + ", state " + zero3::dtype_name(s.state).data();
}

// The spacing of t's values at magnitude |x| (the subnormal spacing below t's smallest normal).
double ulp_of(double x, DType t) {
  const int digits = t == DType::f32 ? 24 : (t == DType::bf16 ? 8 : 11);
  const int min_exp = t == DType::f16 ? -14 : -126;
  const int e = x == 0.0 || !std::isfinite(x) ? min_exp : std::max(std::ilogb(x), min_exp);
  return std::ldexp(1.0, e - (digits - 1));
}

// x rounded to t, to nearest with ties to even, in one step from double (no double rounding through fp32):
// x / ulp is exact (a power-of-two scaling), nearbyint rounds it to even under the default rounding mode.
double round_to(double x, DType t) {
  if (!std::isfinite(x) || x == 0.0) return x;
  if (t == DType::f32) return static_cast<float>(x);
  const double q = ulp_of(x, t);
  const double r = std::nearbyint(x / q) * q;
  const double max_finite = t == DType::bf16 ? 0x1.fcp127 : 65504.0;
  return std::fabs(r) > max_finite ? std::copysign(INFINITY, x) : r;
}

// Per storage: how many stored 16-bit values were compared with the rounded float64 reference, how many
// equal it, and how many lie more than one ulp from it (only where the fp32 error bound exceeds half an ulp:
// a sum whose terms cancel, where fp32 storage is that far off as well).
struct ExactCount {
  std::size_t compared = 0, exact = 0, beyond_ulp = 0;
  double max_ulps = 0;
};

// A 16-bit stored value against the reference `want` (exact, not yet rounded) with fp32 error bound tol:
// within one ulp of round_to(want) wherever tol is under half an ulp (the fp32 result then rounds to one of
// the two values around `want`), within one ulp plus tol elsewhere; counts exact equality. fp32 storage:
// within tol of want.
void check_stored(const char* what, std::size_t i, double got, double want, double tol, DType t, Mismatches& bad,
                  ExactCount& count) {
  if (t == DType::f32) {
    bad.near(what, i, got, want, tol);
    return;
  }
  const double rounded = round_to(want, t);
  const double ulp = ulp_of(std::max(std::fabs(rounded), std::fabs(got)), t);
  const double diff = std::fabs(got - rounded);
  ++count.compared;
  if (got == rounded) ++count.exact;
  if (diff > ulp) ++count.beyond_ulp;
  count.max_ulps = std::max(count.max_ulps, diff / ulp);
  bad.near(what, i, got, rounded, tol <= ulp / 2 ? ulp : ulp + tol);
}

void report_exact(const char* op, Storage st, const ExactCount& c) {
  std::printf(
      "%s, %s: %zu of %zu 16-bit values (%.4f%%) equal the rounded float64 reference; %zu more than 1 ulp "
      "from it (max %.0f ulp), only where terms cancel and the fp32 error bound passes half an ulp\n",
      op, storage_name(st).c_str(), c.exact, c.compared, c.compared ? 100.0 * c.exact / c.compared : 100.0,
      c.beyond_ulp, c.max_ulps);
  CHECK(c.compared > 0);
  CHECK(c.exact >= c.compared * 99 / 100);
}

// The shadow of a 16-bit step: the same step on fp32 master and states holding the 16-bit step's inputs
// (widened) and the same gradient. kernels.hpp's rule says the 16-bit step stores exactly the fp32 step's
// results rounded once to nearest even: checked bit for bit by check_rounded.
struct Shadow {
  StepBuffers w;
  Shadow(HostEnv& env, const StepBuffers& b) : w(env, b.master.count(), b.grad.dtype(), std::nullopt) {}
  void load(const StepBuffers& b) {
    for (Buffer* dst : {&w.master, &w.s1, &w.s2}) {
      const Buffer& src = dst == &w.master ? b.master : (dst == &w.s1 ? b.s1 : b.s2);
      for (std::size_t i = 0; i < src.count(); ++i) static_cast<float*>(dst->data())[i] = value_at(src, i);
    }
    std::memcpy(w.grad.data(), b.grad.data(), b.grad.size_bytes());
  }
};

void check_rounded(const char* what, const Buffer& stored, const Buffer& fp32, Mismatches& bad) {
  for (std::size_t i = 0; i < stored.count(); ++i) {
    const float w = static_cast<const float*>(fp32.data())[i];
    if (bits_at(stored, i) != converted_bits(w, stored.dtype())) bad.add(what, i, value_at(stored, i), w, 0.0);
  }
}

// The grad dtype of a storage's steps: 16-bit like the master (DeepSpeed's "master weights and grads").
DType grad_dtype_for(Storage st) {
  return st.master;
}

}  // namespace

TEST_CASE("optim kernels: adam_step with 16-bit master and states matches a rounded float64 reference", "[kernels]") {
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  for (const Storage st : kStorages16) {
    ExactCount exact;
    for (int variant = 0; variant < 4; ++variant) {
      for (const std::size_t n : {std::size_t{7}, std::size_t{4097}}) {
        const std::optional<DType> param_t = variant % 2 == 0 ? std::optional<DType>(DType::bf16) : std::nullopt;
        INFO(storage_name(st) << ", variant " << variant << ", n " << n);
        kernels::AdamArgs args;
        args.lr = 3e-3f;
        args.weight_decay = variant <= 1 ? 0.05f : 0.0f;
        args.adamw = variant != 1;
        args.bias_correction = variant != 3;
        args.grad_scale = 0.75f;
        StepBuffers b(env, n, grad_dtype_for(st), param_t, st.master, st.state);
        b.init(rng);
        Shadow shadow(env, b);
        for (std::int64_t step = 1; step <= 5; ++step) {
          INFO("step " << step);
          args.step = step;
          b.new_grad(rng);
          shadow.load(b);
          const std::vector<float> p0 = snapshot(b.master), m0 = snapshot(b.s1), v0 = snapshot(b.s2);
          env.k.adam_step(*env.stream, args, b.master.view(), b.s1.view(), b.s2.view(), b.grad.cview(), b.param_view());
          StepBuffers& w = shadow.w;
          env.k.adam_step(*env.stream, args, w.master.view(), w.s1.view(), w.s2.view(), w.grad.cview(), BufferView{});
          env.stream->synchronize();
          Mismatches bad;
          check_rounded("master vs the fp32 step", b.master, w.master, bad);
          check_rounded("exp_avg vs the fp32 step", b.s1, w.s1, bad);
          check_rounded("exp_avg_sq vs the fp32 step", b.s2, w.s2, bad);
          for (std::size_t i = 0; i < n; ++i) {
            const AdamRef r = adam_ref(args, p0[i], m0[i], v0[i], value_at(b.grad, i));
            check_stored("master", i, value_at(b.master, i), r.p, r.tol_p, st.master, bad, exact);
            check_stored("exp_avg", i, value_at(b.s1, i), r.m, r.tol_m, st.state, bad, exact);
            check_stored("exp_avg_sq", i, value_at(b.s2, i), r.v, r.tol_v, st.state, bad, exact);
          }
          check_param_copy(b.master, b.param, bad);
          CHECK(bad.count == 0);
        }
      }
    }
    report_exact("adam_step", st, exact);
  }
}

TEST_CASE("optim kernels: lion_step with 16-bit master and states matches a rounded float64 reference", "[kernels]") {
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  for (const Storage st : kStorages16) {
    ExactCount exact;
    for (const float weight_decay : {0.0f, 0.1f}) {
      INFO(storage_name(st) << ", weight_decay " << weight_decay);
      const std::size_t n = 4097;
      kernels::LionArgs args;
      args.lr = 1e-2f;  // a step a bf16 weight of magnitude up to ~2 can take
      args.weight_decay = weight_decay;
      args.grad_scale = 1.5f;
      StepBuffers b(env, n, grad_dtype_for(st), DType::bf16, st.master, st.state);
      b.init(rng);
      Shadow shadow(env, b);
      for (int step = 1; step <= 5; ++step) {
        INFO("step " << step);
        b.new_grad(rng);
        shadow.load(b);
        const std::vector<float> p0 = snapshot(b.master), m0 = snapshot(b.s1);
        env.k.lion_step(*env.stream, args, b.master.view(), b.s1.view(), b.grad.cview(), b.param_view());
        StepBuffers& w = shadow.w;
        env.k.lion_step(*env.stream, args, w.master.view(), w.s1.view(), w.grad.cview(), BufferView{});
        env.stream->synchronize();
        Mismatches bad;
        check_rounded("master vs the fp32 step", b.master, w.master, bad);
        check_rounded("exp_avg vs the fp32 step", b.s1, w.s1, bad);
        for (std::size_t i = 0; i < n; ++i) {
          const LionRef r = lion_ref(args, p0[i], m0[i], value_at(b.grad, i));
          const double got = value_at(b.master, i);
          // The sign the exact direction takes; the fp32 kernel may take another only where sign_allowed says.
          const double g = value_at(b.grad, i) * args.grad_scale;
          const double c = args.beta1 * double{m0[i]} + (1 - double{args.beta1}) * g;
          const int exact_sign = c > 0 ? 2 : (c < 0 ? 0 : 1);
          bool matched = false;
          for (int sgn = 0; sgn < 3; ++sgn) {
            const double want = round_to(r.p_for_sign[sgn], st.master);
            matched |= r.sign_allowed[sgn] && std::fabs(got - want) <= ulp_of(want, st.master) + r.tol_p;
          }
          if (!matched) bad.add("master", i, got, round_to(r.p_for_sign[exact_sign], st.master), r.tol_p);
          const double want = round_to(r.p_for_sign[exact_sign], st.master);
          ++exact.compared;
          if (got == want) ++exact.exact;
          exact.max_ulps = std::max(exact.max_ulps, std::fabs(got - want) / ulp_of(want, st.master));
          check_stored("exp_avg", i, value_at(b.s1, i), r.m, r.tol_m, st.state, bad, exact);
        }
        check_param_copy(b.master, b.param, bad);
        CHECK(bad.count == 0);
      }
    }
    report_exact("lion_step", st, exact);
  }
}

TEST_CASE("optim kernels: adagrad_step with 16-bit master and states matches a rounded float64 reference",
          "[kernels]") {
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  for (const Storage st : kStorages16) {
    ExactCount exact;
    for (const float weight_decay : {0.0f, 0.01f}) {
      INFO(storage_name(st) << ", weight_decay " << weight_decay);
      const std::size_t n = 4097;
      kernels::AdagradArgs args;
      args.lr = 1e-2f;
      args.eps = 1e-10f;
      args.weight_decay = weight_decay;
      args.grad_scale = 0.5f;
      StepBuffers b(env, n, grad_dtype_for(st), DType::f16, st.master, st.state);
      b.init(rng);
      Shadow shadow(env, b);
      for (int step = 1; step <= 5; ++step) {
        INFO("step " << step);
        b.new_grad(rng);
        shadow.load(b);
        const std::vector<float> p0 = snapshot(b.master), s0 = snapshot(b.s2);
        env.k.adagrad_step(*env.stream, args, b.master.view(), b.s2.view(), b.grad.cview(), b.param_view());
        StepBuffers& w = shadow.w;
        env.k.adagrad_step(*env.stream, args, w.master.view(), w.s2.view(), w.grad.cview(), BufferView{});
        env.stream->synchronize();
        Mismatches bad;
        check_rounded("master vs the fp32 step", b.master, w.master, bad);
        check_rounded("sum_sq vs the fp32 step", b.s2, w.s2, bad);
        for (std::size_t i = 0; i < n; ++i) {
          const AdagradRef r = adagrad_ref(args, p0[i], s0[i], value_at(b.grad, i));
          check_stored("master", i, value_at(b.master, i), r.p, r.tol_p, st.master, bad, exact);
          check_stored("sum_sq", i, value_at(b.s2, i), r.s, r.tol_s, st.state, bad, exact);
        }
        check_param_copy(b.master, b.param, bad);
        CHECK(bad.count == 0);
      }
    }
    report_exact("adagrad_step", st, exact);
  }
}

TEST_CASE("optim kernels: a bf16 master rounds only what it stores: fp32 states as from an fp32 master", "[kernels]") {
  // A bf16 master with fp32 states computes the same fp32 states as an fp32 master holding the same
  // (bf16-representable) weights, and stores that master's new value rounded once.
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  HostEnv env;
  const std::size_t n = 4097;
  StepBuffers wide(env, n, DType::bf16, DType::bf16);
  StepBuffers narrow(env, n, DType::bf16, DType::bf16, DType::bf16, DType::f32);
  narrow.init(rng);
  narrow.new_grad(rng);
  for (std::size_t i = 0; i < n; ++i) static_cast<float*>(wide.master.data())[i] = value_at(narrow.master, i);
  std::memcpy(wide.s1.data(), narrow.s1.data(), narrow.s1.size_bytes());
  std::memcpy(wide.s2.data(), narrow.s2.data(), narrow.s2.size_bytes());
  std::memcpy(wide.grad.data(), narrow.grad.data(), narrow.grad.size_bytes());
  kernels::AdamArgs args;
  args.weight_decay = 0.01f;
  for (StepBuffers* b : {&wide, &narrow})
    env.k.adam_step(*env.stream, args, b->master.view(), b->s1.view(), b->s2.view(), b->grad.cview(), b->param.view());
  env.stream->synchronize();
  CHECK(same_bytes(wide.s1, narrow.s1));
  CHECK(same_bytes(wide.s2, narrow.s2));
  Mismatches bad;
  for (std::size_t i = 0; i < n; ++i) {
    const float w = static_cast<const float*>(wide.master.data())[i];
    if (zero3::float_to_bf16(w).bits != static_cast<const std::uint16_t*>(narrow.master.data())[i])
      bad.add("bf16 master vs rounded fp32 master", i, value_at(narrow.master, i), w, 0.0);
  }
  CHECK(bad.count == 0);
  CHECK(same_bytes(wide.param, narrow.param));  // bf16 param: cast(fp32 master) == cast(bf16 master)
}

TEST_CASE("optim kernels: AdamW decays the weight from before the update; Adam adds L2 to the gradient", "[kernels]") {
  // A step whose every intermediate is exact: p = 1, m = v = 0, g = 1, betas 0.5 and 0.75, lr = wd = 0.5,
  // eps = 0, t = 1. Then bc1 = 0.5, 1/sqrt(bc2) = 2, and
  //   AdamW: m = 0.5, v = 0.25, denom = 0.5 * 2 = 1, p = 1 - 0.25 * 1 = 0.75, p = 0.75 - (0.5 / 0.5) * 0.5 = 0.25
  //          (decaying after the update instead would give 0.375);
  //   Adam:  g = 1 + 0.5 * 1 = 1.5, m = 0.75, v = 0.5625, denom = 1.5, p = 1 - 1 * 0.5 = 0.5.
  HostEnv env;
  for (bool adamw : {true, false}) {
    INFO("adamw " << adamw);
    Buffer p = env.alloc(1, DType::f32), m = env.alloc(1, DType::f32), v = env.alloc(1, DType::f32),
           g = env.alloc(1, DType::f32), low = env.alloc(1, DType::bf16);
    kernels::fill(*env.stream, p.view(), 1.0f);
    kernels::fill(*env.stream, m.view(), 0.0f);
    kernels::fill(*env.stream, v.view(), 0.0f);
    kernels::fill(*env.stream, g.view(), 1.0f);
    kernels::AdamArgs args;
    args.lr = 0.5f;
    args.beta1 = 0.5f;
    args.beta2 = 0.75f;
    args.eps = 0.0f;
    args.weight_decay = 0.5f;
    args.adamw = adamw;
    args.step = 1;
    env.k.adam_step(*env.stream, args, p.view(), m.view(), v.view(), g.cview(), low.view());
    env.stream->synchronize();
    CHECK(value_at(p, 0) == (adamw ? 0.25 : 0.5));
    CHECK(value_at(m, 0) == (adamw ? 0.5 : 0.75));
    CHECK(value_at(v, 0) == (adamw ? 0.25 : 0.5625));
    CHECK(value_at(low, 0) == value_at(p, 0));
  }
}

TEST_CASE("optim kernels: Adam and AdamW agree without weight decay and differ with it", "[kernels]") {
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  const std::size_t n = 1023;
  HostEnv env;
  // Runs one step of the given flavour from the same seeded state; returns the new master.
  auto run = [&](bool adamw, float weight_decay, bool bias_correction) {
    std::mt19937_64 rng(seed);
    StepBuffers b(env, n, DType::f32, std::nullopt);
    b.init(rng);
    b.new_grad(rng);
    kernels::AdamArgs args;
    args.adamw = adamw;
    args.weight_decay = weight_decay;
    args.bias_correction = bias_correction;
    args.step = 3;
    env.k.adam_step(*env.stream, args, b.master.view(), b.s1.view(), b.s2.view(), b.grad.cview(), BufferView{});
    env.stream->synchronize();
    return snapshot(b.master);
  };
  CHECK(run(true, 0.0f, true) == run(false, 0.0f, true));
  CHECK(run(true, 0.1f, true) != run(false, 0.1f, true));
  CHECK(run(true, 0.1f, true) != run(true, 0.0f, true));
  CHECK(run(true, 0.0f, true) != run(true, 0.0f, false));
}

TEST_CASE("optim kernels: Lion takes sign(0) = 0: a zero direction leaves the weight to decay alone", "[kernels]") {
  HostEnv env;
  // With beta1 = 0.5 the direction 0.5 m + 0.5 g is exactly 0 when g = -m, and when both are 0.
  const float m0[4] = {0.25f, -3.0f, 0.0f, -0.0f};
  const float g0[4] = {-0.25f, 3.0f, 0.0f, 0.0f};
  const float p0[4] = {1.5f, -0.75f, 2.0f, -0.0f};
  for (float weight_decay : {0.0f, 0.5f}) {
    INFO("weight_decay " << weight_decay);
    Buffer master = env.alloc(4, DType::f32);
    Buffer m = env.alloc(4, DType::f32);
    Buffer g = env.alloc(4, DType::f32);
    std::memcpy(master.data(), p0, sizeof p0);
    std::memcpy(m.data(), m0, sizeof m0);
    std::memcpy(g.data(), g0, sizeof g0);
    kernels::LionArgs args;
    args.lr = 0.125f;
    args.beta1 = 0.5f;
    args.beta2 = 0.75f;
    args.weight_decay = weight_decay;
    env.k.lion_step(*env.stream, args, master.view(), m.view(), g.cview(), BufferView{});
    env.stream->synchronize();
    const float after_decay = 1.0f - 0.125f * weight_decay;  // exact here
    for (std::size_t i = 0; i < 4; ++i) {
      INFO("element " << i);
      const float want = weight_decay > 0 ? p0[i] * after_decay : p0[i];
      const float got = static_cast<const float*>(master.data())[i];
      CHECK(std::memcmp(&got, &want, sizeof got) == 0);  // no lr step, and -0 stays -0
      CHECK(static_cast<const float*>(m.data())[i] == 0.75f * m0[i] + 0.25f * g0[i]);
    }
  }
}

TEST_CASE("optim kernels: grad_scale is folded in: a scaled step equals a step on pre-scaled grads", "[kernels]") {
  const DType grad_t = GENERATE(DType::f32, DType::bf16);
  const int op = GENERATE(0, 1, 2);                 // adam, lion, adagrad
  const bool random_scale = GENERATE(false, true);  // 0.5, or a random scale with a rounded product
  const std::uint64_t seed = test_seed();
  std::mt19937_64 rng(seed);
  const float scale = random_scale ? random_float(rng, -8, 2, true) : 0.5f;
  INFO("grad " << zero3::dtype_name(grad_t) << ", op " << op << ", scale " << scale << ", seed " << seed);
  const std::size_t n = 4097;
  HostEnv env;
  StepBuffers a(env, n, grad_t, DType::bf16);
  a.init(rng);
  a.new_grad(rng);
  StepBuffers b(env, n, DType::f32, DType::bf16);
  // The same state, and grads already multiplied by the scale in fp32 (one rounding, as in the kernel).
  std::memcpy(b.master.data(), a.master.data(), a.master.size_bytes());
  std::memcpy(b.s1.data(), a.s1.data(), a.s1.size_bytes());
  std::memcpy(b.s2.data(), a.s2.data(), a.s2.size_bytes());
  for (std::size_t i = 0; i < n; ++i) {
    static_cast<float*>(b.grad.data())[i] = static_cast<float>(value_at(a.grad, i)) * scale;
  }
  auto step = [&](StepBuffers& s, float grad_scale) {
    if (op == 0) {
      kernels::AdamArgs args;
      args.weight_decay = 0.01f;
      args.grad_scale = grad_scale;
      env.k.adam_step(*env.stream, args, s.master.view(), s.s1.view(), s.s2.view(), s.grad.cview(), s.param.view());
    } else if (op == 1) {
      kernels::LionArgs args;
      args.weight_decay = 0.01f;
      args.grad_scale = grad_scale;
      env.k.lion_step(*env.stream, args, s.master.view(), s.s1.view(), s.grad.cview(), s.param.view());
    } else {
      kernels::AdagradArgs args;
      args.weight_decay = 0.01f;
      args.grad_scale = grad_scale;
      env.k.adagrad_step(*env.stream, args, s.master.view(), s.s2.view(), s.grad.cview(), s.param.view());
    }
  };
  step(a, scale);
  step(b, 1.0f);
  env.stream->synchronize();
  CHECK(same_bytes(a.master, b.master));
  CHECK(same_bytes(a.s1, b.s1));
  CHECK(same_bytes(a.s2, b.s2));
  CHECK(same_bytes(a.param, b.param));
}

TEST_CASE("optim kernels: an empty param view skips the copy and changes nothing else", "[kernels]") {
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  const std::size_t n = 1023;
  HostEnv env;
  StepBuffers with(env, n, DType::f32, DType::bf16);
  with.init(rng);
  with.new_grad(rng);
  StepBuffers without(env, n, DType::f32, std::nullopt);
  std::memcpy(without.master.data(), with.master.data(), with.master.size_bytes());
  std::memcpy(without.s1.data(), with.s1.data(), with.s1.size_bytes());
  std::memcpy(without.s2.data(), with.s2.data(), with.s2.size_bytes());
  std::memcpy(without.grad.data(), with.grad.data(), with.grad.size_bytes());
  Buffer empty_param = env.alloc(0, DType::f16);  // a zero-count buffer is as empty as a default view
  kernels::AdamArgs args;
  env.k.adam_step(*env.stream, args, with.master.view(), with.s1.view(), with.s2.view(), with.grad.cview(),
                  with.param.view());
  env.k.adam_step(*env.stream, args, without.master.view(), without.s1.view(), without.s2.view(), without.grad.cview(),
                  empty_param.view());
  env.stream->synchronize();
  CHECK(same_bytes(with.master, without.master));
  CHECK(same_bytes(with.s1, without.s1));
  CHECK(same_bytes(with.s2, without.s2));
  Mismatches bad;
  check_param_copy(with.master, with.param, bad);
  CHECK(bad.count == 0);
  // Lion and Adagrad too, from default-constructed views.
  kernels::LionArgs lion;
  env.k.lion_step(*env.stream, lion, without.master.view(), without.s1.view(), without.grad.cview(), BufferView{});
  kernels::AdagradArgs adagrad;
  env.k.adagrad_step(*env.stream, adagrad, without.master.view(), without.s2.view(), without.grad.cview(),
                     BufferView{});
  // All views empty: nothing to do.
  env.k.adam_step(*env.stream, args, BufferView{}, BufferView{}, BufferView{}, zero3::ConstBufferView{}, BufferView{});
  env.stream->synchronize();
}

TEST_CASE("optim kernels: results do not depend on the number of threads", "[kernels]") {
  const std::uint64_t seed = test_seed();
  INFO("seed " << seed);
  const std::size_t n = 600011;  // past the host kernels' threshold for oneTBB
  HostEnv env;
  auto run = [&](bool one_thread) {
    std::mt19937_64 rng(seed);
    StepBuffers b(env, n, DType::bf16, DType::bf16);
    b.init(rng);
    b.new_grad(rng);
    kernels::AdamArgs args;
    args.weight_decay = 0.01f;
    std::unique_ptr<tbb::global_control> limit;
    if (one_thread) limit = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, 1);
    env.k.adam_step(*env.stream, args, b.master.view(), b.s1.view(), b.s2.view(), b.grad.cview(), b.param.view());
    env.stream->synchronize();
    std::vector<unsigned char> bytes(static_cast<const unsigned char*>(b.master.data()),
                                     static_cast<const unsigned char*>(b.master.data()) + b.master.size_bytes());
    bytes.insert(bytes.end(), static_cast<const unsigned char*>(b.param.data()),
                 static_cast<const unsigned char*>(b.param.data()) + b.param.size_bytes());
    return bytes;
  };
  CHECK(run(false) == run(true));
}

TEST_CASE("optim kernels: steps are enqueued without blocking and run in stream order", "[kernels]") {
  HostEnv env;
  const std::size_t n = 7;
  Buffer master = env.alloc(n, DType::f32);
  Buffer sum_sq = env.alloc(n, DType::f32);
  Buffer grad = env.alloc(n, DType::f32);
  Buffer accum = env.alloc(n, DType::f32);
  kernels::fill(*env.stream, master.view(), 1.0f);
  kernels::fill(*env.stream, sum_sq.view(), 0.0f);
  kernels::fill(*env.stream, grad.view(), 0.0f);
  kernels::fill(*env.stream, accum.view(), 2.0f);
  env.stream->synchronize();
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  env.stream->launch_host([opened] { opened.wait(); });
  env.k.accumulate(*env.stream, grad.view(), accum.cview(), 1.5f);  // grad = 3
  kernels::AdagradArgs args;
  args.lr = 0.5f;
  args.eps = 0.0f;
  env.k.adagrad_step(*env.stream, args, master.view(), sum_sq.view(), grad.cview(), BufferView{});
  CHECK(static_cast<const float*>(grad.data())[0] == 0.0f);
  CHECK(static_cast<const float*>(master.data())[0] == 1.0f);
  gate.set_value();
  env.stream->synchronize();
  // s = 9, p = 1 - 0.5 * 3 / 3.
  for (std::size_t i = 0; i < n; ++i) {
    CHECK(static_cast<const float*>(sum_sq.data())[i] == 9.0f);
    CHECK(static_cast<const float*>(master.data())[i] == 0.5f);
  }
}

TEST_CASE("optim kernels: the supported storage pairs are those of kernels.hpp's table", "[kernels]") {
  using kernels::optimizer_storage_supported;
  for (const DType master : kAllDTypes) {
    for (const DType state : kAllDTypes) {
      INFO("master " << zero3::dtype_name(master) << ", state " << zero3::dtype_name(state));
      const bool want = state == DType::f32 || (state == DType::bf16 && master == DType::bf16);
      CHECK(optimizer_storage_supported(master, state) == want);
    }
  }
  CHECK_FALSE(optimizer_storage_supported(static_cast<DType>(7), DType::f32));
  static_assert(optimizer_storage_supported(DType::bf16, DType::bf16), "usable in constant expressions");
}

TEST_CASE("optim kernels: bad arguments throw UsageError on the calling thread", "[kernels]") {
  HostEnv env;
  const std::size_t n = 8;
  Buffer p = env.alloc(n, DType::f32);
  Buffer m = env.alloc(n, DType::f32);
  Buffer v = env.alloc(n, DType::f32);
  Buffer g = env.alloc(n, DType::f32);
  Buffer short_f32 = env.alloc(n - 1, DType::f32);
  Buffer low = env.alloc(n, DType::bf16);
  Buffer low_short = env.alloc(n - 1, DType::bf16);
  const kernels::AdamArgs adam;
  const kernels::LionArgs lion;
  const kernels::AdagradArgs adagrad;
  const auto& k = env.k;
  auto& s = *env.stream;
  using zero3::UsageError;

  // Count mismatches: a state, the grad, a non-empty param.
  CHECK_THROWS_AS(k.adam_step(s, adam, p.view(), short_f32.view(), v.view(), g.cview(), BufferView{}), UsageError);
  CHECK_THROWS_AS(k.adam_step(s, adam, p.view(), m.view(), v.view(), short_f32.cview(), BufferView{}), UsageError);
  CHECK_THROWS_AS(k.adam_step(s, adam, p.view(), m.view(), v.view(), g.cview(), low_short.view()), UsageError);
  CHECK_THROWS_AS(k.lion_step(s, lion, p.view(), short_f32.view(), g.cview(), BufferView{}), UsageError);
  CHECK_THROWS_AS(k.adagrad_step(s, adagrad, p.view(), m.view(), short_f32.cview(), low.view()), UsageError);
  // Storage: master fp32, bf16 or fp16 with fp32 states; bf16 states with a bf16 master only; one dtype for
  // all states; no fp16 states.
  Buffer low2 = env.alloc(n, DType::bf16);
  Buffer low3 = env.alloc(n, DType::bf16);
  Buffer half = env.alloc(n, DType::f16);
  Buffer half2 = env.alloc(n, DType::f16);
  CHECK_NOTHROW(k.adam_step(s, adam, low.view(), m.view(), v.view(), g.cview(), BufferView{}));
  CHECK_NOTHROW(k.adam_step(s, adam, low.view(), low2.view(), low3.view(), g.cview(), BufferView{}));
  CHECK_NOTHROW(k.adam_step(s, adam, half.view(), m.view(), v.view(), g.cview(), BufferView{}));
  CHECK_NOTHROW(k.adagrad_step(s, adagrad, low.view(), m.view(), g.cview(), BufferView{}));
  CHECK_NOTHROW(k.lion_step(s, lion, low.view(), low2.view(), g.cview(), BufferView{}));
  s.synchronize();
  CHECK_THROWS_AS(k.adam_step(s, adam, p.view(), m.view(), low.view(), g.cview(), BufferView{}), UsageError);
  CHECK_THROWS_AS(k.adam_step(s, adam, low.view(), m.view(), low2.view(), g.cview(), BufferView{}), UsageError);
  CHECK_THROWS_AS(k.adam_step(s, adam, p.view(), low.view(), low2.view(), g.cview(), BufferView{}), UsageError);
  CHECK_THROWS_AS(k.lion_step(s, lion, p.view(), low.view(), g.cview(), BufferView{}), UsageError);
  CHECK_THROWS_AS(k.lion_step(s, lion, half.view(), low.view(), g.cview(), BufferView{}), UsageError);
  CHECK_THROWS_AS(k.adagrad_step(s, adagrad, half.view(), half2.view(), g.cview(), BufferView{}), UsageError);
  CHECK_THROWS_AS(k.adagrad_step(s, adagrad, p.view(), half.view(), g.cview(), BufferView{}), UsageError);
  CHECK_THROWS_WITH(k.lion_step(s, lion, p.view(), low.view(), g.cview(), BufferView{}),
                    Catch::Contains("bf16 state only with a bf16 master"));
  CHECK_THROWS_WITH(k.adam_step(s, adam, low.view(), m.view(), low2.view(), g.cview(), BufferView{}),
                    Catch::Contains("every state view must have one dtype"));
  // Overlapping views, and a view with elements but no data.
  CHECK_THROWS_AS(k.adam_step(s, adam, p.view(), p.view(), v.view(), g.cview(), BufferView{}), UsageError);
  CHECK_THROWS_AS(k.adagrad_step(s, adagrad, p.view(), m.view(), g.cview(),
                                 BufferView{m.data(), n, DType::bf16, MemoryKind::device}),
                  UsageError);
  CHECK_THROWS_AS(
      k.lion_step(s, lion, p.view(), m.view(), g.cview(), BufferView{nullptr, n, DType::bf16, MemoryKind::device}),
      UsageError);
  // Hyperparameters out of range.
  auto adam_with = [&](auto&& edit) {
    kernels::AdamArgs a;
    edit(a);
    k.adam_step(s, a, p.view(), m.view(), v.view(), g.cview(), BufferView{});
  };
  CHECK_THROWS_AS(adam_with([](auto& a) { a.step = 0; }), UsageError);
  CHECK_THROWS_AS(adam_with([](auto& a) { a.beta1 = 1.0f; }), UsageError);
  CHECK_THROWS_AS(adam_with([](auto& a) { a.beta2 = -0.1f; }), UsageError);
  CHECK_THROWS_AS(adam_with([](auto& a) { a.lr = -1e-3f; }), UsageError);
  CHECK_THROWS_AS(adam_with([](auto& a) { a.grad_scale = NAN; }), UsageError);
  CHECK_THROWS_AS(adam_with([](auto& a) { a.weight_decay = INFINITY; }), UsageError);
  kernels::LionArgs bad_lion;
  bad_lion.beta2 = 1.5f;
  CHECK_THROWS_AS(k.lion_step(s, bad_lion, p.view(), m.view(), g.cview(), BufferView{}), UsageError);
  kernels::AdagradArgs bad_adagrad;
  bad_adagrad.eps = -1.0f;
  CHECK_THROWS_AS(k.adagrad_step(s, bad_adagrad, p.view(), m.view(), g.cview(), BufferView{}), UsageError);
  // accumulate: an fp32 destination of src's count, apart from src unless it is the same fp32 view.
  CHECK_THROWS_AS(k.accumulate(s, low.view(), g.cview(), 1.0f), UsageError);
  CHECK_THROWS_AS(k.accumulate(s, p.view(), short_f32.cview(), 1.0f), UsageError);
  CHECK_THROWS_AS(k.accumulate(s, p.view().slice(0, 4), p.cview().slice(2, 4), 1.0f), UsageError);
  CHECK_THROWS_AS(
      k.accumulate(s, p.view().slice(0, 4), zero3::ConstBufferView{p.data(), 4, DType::bf16, MemoryKind::device}, 1.0f),
      UsageError);
  s.synchronize();  // nothing was enqueued, nothing failed on the stream
}
