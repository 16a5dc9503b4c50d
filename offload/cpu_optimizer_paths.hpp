// The three implementations behind cpu_optimizer.hpp's range functions (private to offload/): scalar,
// AVX2 and AVX-512, each in its own file compiled with its own -m flags, each exporting one table of
// kernels (CpuOptimizerKernels below). The dispatcher (cpu_optimizer.cpp) checks the arguments, looks up
// the path's table once per call and turns the argument structs into optim_coeffs.hpp's coefficients, so
// the kernels trust their inputs. A SIMD path runs whole vectors and hands the remaining elements to the
// scalar table's kernels, whose file is the only one that calls optim_math.hpp's inline functions: an
// inline function compiled in an AVX-512 file could otherwise be the copy the linker keeps.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "optim_math.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/offload/cpu_optimizer.hpp"

namespace zero3::offload::detail {

using kernels::detail::AdagradCoeffs;
using kernels::detail::AdamCoeffs;
using kernels::detail::LionCoeffs;

// The fixed summation order of GradStats::sum_sq, shared by every path: the square of element i (exact in
// double: a float's 24-bit significand squared needs 48 bits) is added to lane i % 16, in increasing i;
// the dispatcher then folds the 16 lanes pairwise (sum_stat_lanes). A SIMD path keeps the lanes in
// registers (16 elements = one AVX-512 pair of 8 doubles, or four AVX2 vectors of 4) and the scalar path
// in this array, so every path adds the same doubles in the same order.
inline constexpr std::size_t kStatLanes = 16;
struct StatLanes {
  double lane[kStatLanes] = {};
};

// One path's kernels: the fused steps over a whole span, and accumulate / stats over [0, count). `lanes`
// (may be null in accumulate: no statistics) is continued, not reset, so a SIMD path can hand the scalar
// path its tail starting at a multiple of 16 elements.
struct CpuOptimizerKernels {
  void (*adam)(const AdamCoeffs& c, const StepSpan& span);
  void (*lion)(const LionCoeffs& c, const StepSpan& span);
  void (*adagrad)(const AdagradCoeffs& c, const StepSpan& span);
  void (*accumulate)(float* acc, const void* src, DType src_dtype, float alpha, std::size_t count, StatLanes* lanes);
  void (*grad_stats)(const float* acc, std::size_t count, StatLanes& lanes);
  // Built with this path's instructions (x86-64); the scalar path always is. A table that is not has null
  // kernels: simd_path_supported() is false for its path, so the dispatcher never returns it.
  bool compiled_in;
};

// One table per path, each defined in its path's file (constant-initialized: usable at any time).
extern constinit const CpuOptimizerKernels kScalarKernels;  // cpu_optimizer_scalar.cpp
extern constinit const CpuOptimizerKernels kAvx2Kernels;    // cpu_optimizer_avx2.cpp
extern constinit const CpuOptimizerKernels kAvx512Kernels;  // cpu_optimizer_avx512.cpp

// The span's elements [offset, count), for handing a tail to the scalar path. Out of line, in
// cpu_optimizer.cpp (no -m flags), like everything the SIMD files share.
StepSpan span_tail(const StepSpan& s, std::size_t offset);

// The param type of a step that writes no low-precision copy.
struct NoParam {};

// Calls fn(M* master, S* exp_avg, S* exp_avg_sq, const G* grad, P* param) typed by the span's dtypes: M and
// S one of the storage pairs that kernels::optimizer_storage_supported allows (the dispatcher has checked
// the span: no other pair gets here, so only those four are instantiated), G the gradient's type, P the
// param's (NoParam when param is null). A state the optimizer does not keep is a null S*.
template <typename Fn>
void with_span_types(const StepSpan& s, const Fn& fn) {
  auto with_param = [&](auto* p, auto* m, auto* v, const auto* g) {
    if (s.param == nullptr) {
      fn(p, m, v, g, static_cast<NoParam*>(nullptr));
    } else if (s.param_dtype == DType::f32) {
      fn(p, m, v, g, static_cast<float*>(s.param));
    } else if (s.param_dtype == DType::bf16) {
      fn(p, m, v, g, static_cast<bf16_t*>(s.param));
    } else {
      fn(p, m, v, g, static_cast<fp16_t*>(s.param));
    }
  };
  auto with_grad = [&](auto* p, auto* m, auto* v) {
    if (s.grad_dtype == DType::f32) {
      with_param(p, m, v, static_cast<const float*>(s.grad));
    } else if (s.grad_dtype == DType::bf16) {
      with_param(p, m, v, static_cast<const bf16_t*>(s.grad));
    } else {
      with_param(p, m, v, static_cast<const fp16_t*>(s.grad));
    }
  };
  auto with_state = [&](auto* p, auto state_tag) {
    using S = decltype(state_tag);
    with_grad(p, static_cast<S*>(s.exp_avg), static_cast<S*>(s.exp_avg_sq));
  };
  if (s.state_dtype == DType::bf16) {
    with_state(static_cast<bf16_t*>(s.master), bf16_t{});
  } else if (s.master_dtype == DType::f32) {
    with_state(static_cast<float*>(s.master), float{});
  } else if (s.master_dtype == DType::bf16) {
    with_state(static_cast<bf16_t*>(s.master), float{});
  } else {
    with_state(static_cast<fp16_t*>(s.master), float{});
  }
}

// ---- The loop skeleton of the SIMD paths, written once over a vector backend V that each SIMD file
// defines in an anonymous namespace (so every instantiation is local to its file and its -m flags):
//   F (fp32 vector), D (double vector), kWidth (floats per F); set1, load (float, bf16_t, fp16_t),
//   store (float, bf16_t, fp16_t, rounding as dtype.hpp; the NoParam overload does nothing), round
//   (const bf16_t* or const fp16_t* tag: x rounded to that type as store would, widened back to fp32),
//   store_exact / stream_exact (bf16_t, fp16_t: store / stream of a value round() returned, which may skip
//   the rounding), stream (the same as store, with a non-temporal store to an address aligned to kWidth
//   elements), fence
//   (orders the non-temporal stores before the stores that follow), mul, add, sub, div, sqrt, sign_of,
//   each the single correctly rounded IEEE operation of optim_math.hpp's function of the same name;
//   StatAcc: 16 double lanes, loaded from and stored to StatLanes, add(x, k) adding x's squares to the
//   lanes of floats [k * kWidth, (k + 1) * kWidth) of a block of 16.
// The loops mirror optim_math.hpp line by line and operand by operand; the optional terms are template
// flags fixed per call, as optim_math.hpp's `if (c.l2)` is uniform over a call.
namespace simd {

using detail::NoParam;

template <typename P>
inline P* offset_ptr(P* p, std::size_t i) {
  if constexpr (std::is_same_v<P, NoParam>) {
    return p;
  } else {
    return p + i;
  }
}

// The 16-bit (or fp32) copy's store: non-temporal when kStream.
template <typename V, bool kStream, typename P>
inline void put(P* p, typename V::F x) {
  if constexpr (kStream) {
    V::stream(p, x);
  } else {
    V::store(p, x);
  }
}

// The new master weights x: stored rounded to M, and the param copy made from the value stored (kernels.hpp:
// param == cast(master)). For fp32 M, or without a param copy, x is stored as it is (no extra rounding).
template <typename V, bool kStream, typename M, typename P>
inline void put_master(M* p, P* out, typename V::F x) {
  if constexpr (std::is_same_v<M, float> || std::is_same_v<P, NoParam>) {
    V::store(p, x);
    put<V, kStream>(out, x);
  } else {
    const typename V::F stored = V::round(static_cast<const M*>(p), x);
    V::store_exact(p, stored);
    if constexpr (std::is_same_v<P, M> && kStream) {
      V::stream_exact(out, stored);  // the master's own bits: no second rounding
    } else if constexpr (std::is_same_v<P, M>) {
      V::store_exact(out, stored);
    } else {
      put<V, kStream>(out, stored);
    }
  }
}

// M: the master's storage type, S: the states', G: the gradient's, P: the param copy's (or NoParam).
template <typename V, bool kL2, bool kDecoupled, bool kStream, typename M, typename S, typename G, typename P>
std::size_t adam_loop(const AdamCoeffs& c, M* p, S* m, S* v, const G* g, P* out, std::size_t n) {
  using F = typename V::F;
  const F grad_scale = V::set1(c.grad_scale), weight_decay = V::set1(c.weight_decay);
  const F beta1 = V::set1(c.beta1), one_minus_beta1 = V::set1(c.one_minus_beta1);
  const F beta2 = V::set1(c.beta2), one_minus_beta2 = V::set1(c.one_minus_beta2);
  const F eps = V::set1(c.eps), decay = V::set1(c.decay), step_size = V::set1(c.step_size);
  const F bc2_rsqrt = V::set1(c.bc2_rsqrt);
  std::size_t i = 0;
#pragma GCC unroll 2
  for (; i + V::kWidth <= n; i += V::kWidth) {
    F gi = V::mul(V::load(g + i), grad_scale);
    F pi = V::load(p + i);
    if constexpr (kL2) gi = V::add(gi, V::mul(weight_decay, pi));
    const F mi = V::add(V::mul(beta1, V::load(m + i)), V::mul(one_minus_beta1, gi));
    const F vi = V::add(V::mul(beta2, V::load(v + i)), V::mul(one_minus_beta2, V::mul(gi, gi)));
    const F denom = V::add(V::mul(V::sqrt(vi), bc2_rsqrt), eps);
    if constexpr (kDecoupled) pi = V::sub(pi, V::mul(decay, pi));
    pi = V::sub(pi, V::mul(step_size, V::div(mi, denom)));
    V::store(m + i, mi);
    V::store(v + i, vi);
    put_master<V, kStream>(p + i, offset_ptr(out, i), pi);
  }
  return i;
}

template <typename V, bool kDecay, bool kStream, typename M, typename S, typename G, typename P>
std::size_t lion_loop(const LionCoeffs& c, M* p, S* m, const G* g, P* out, std::size_t n) {
  using F = typename V::F;
  const F grad_scale = V::set1(c.grad_scale);
  const F beta1 = V::set1(c.beta1), one_minus_beta1 = V::set1(c.one_minus_beta1);
  const F beta2 = V::set1(c.beta2), one_minus_beta2 = V::set1(c.one_minus_beta2);
  const F lr = V::set1(c.lr), after_decay = V::set1(c.after_decay);
  std::size_t i = 0;
#pragma GCC unroll 2
  for (; i + V::kWidth <= n; i += V::kWidth) {
    const F gi = V::mul(V::load(g + i), grad_scale);
    const F m_old = V::load(m + i);
    const F direction = V::add(V::mul(beta1, m_old), V::mul(one_minus_beta1, gi));
    F pi = V::load(p + i);
    if constexpr (kDecay) pi = V::mul(pi, after_decay);
    pi = V::sub(pi, V::mul(lr, V::sign_of(direction)));
    const F mi = V::add(V::mul(beta2, m_old), V::mul(one_minus_beta2, gi));
    V::store(m + i, mi);
    put_master<V, kStream>(p + i, offset_ptr(out, i), pi);
  }
  return i;
}

template <typename V, bool kL2, bool kStream, typename M, typename S, typename G, typename P>
std::size_t adagrad_loop(const AdagradCoeffs& c, M* p, S* sum, const G* g, P* out, std::size_t n) {
  using F = typename V::F;
  const F grad_scale = V::set1(c.grad_scale), weight_decay = V::set1(c.weight_decay);
  const F lr = V::set1(c.lr), eps = V::set1(c.eps);
  std::size_t i = 0;
#pragma GCC unroll 2
  for (; i + V::kWidth <= n; i += V::kWidth) {
    F gi = V::mul(V::load(g + i), grad_scale);
    F pi = V::load(p + i);
    if constexpr (kL2) gi = V::add(gi, V::mul(weight_decay, pi));
    const F si = V::add(V::load(sum + i), V::mul(gi, gi));
    pi = V::sub(pi, V::mul(lr, V::div(gi, V::add(V::sqrt(si), eps))));
    V::store(sum + i, si);
    put_master<V, kStream>(p + i, offset_ptr(out, i), pi);
  }
  return i;
}

// Whole blocks of 16 elements (the stat lanes' period); returns how many elements were done.
template <typename V, bool kStats, typename S>
std::size_t accumulate_loop(float* acc, const S* src, float alpha, std::size_t n, StatLanes* lanes) {
  using F = typename V::F;
  constexpr std::size_t kPerBlock = kStatLanes / V::kWidth;
  const F a = V::set1(alpha);
  [[maybe_unused]] typename V::StatAcc stats{};
  if constexpr (kStats) stats.load(*lanes);
  std::size_t i = 0;
  for (; i + kStatLanes <= n; i += kStatLanes) {
    for (std::size_t k = 0; k < kPerBlock; ++k) {
      const std::size_t j = i + k * V::kWidth;
      const F x = V::add(V::load(acc + j), V::mul(a, V::load(src + j)));
      V::store(acc + j, x);
      if constexpr (kStats) stats.add(x, k);
    }
  }
  if constexpr (kStats) stats.store(*lanes);
  return i;
}

template <typename V>
std::size_t grad_stats_loop(const float* acc, std::size_t n, StatLanes& lanes) {
  constexpr std::size_t kPerBlock = kStatLanes / V::kWidth;
  typename V::StatAcc stats{};
  stats.load(lanes);
  std::size_t i = 0;
  for (; i + kStatLanes <= n; i += kStatLanes) {
    for (std::size_t k = 0; k < kPerBlock; ++k) stats.add(V::load(acc + i + k * V::kWidth), k);
  }
  stats.store(lanes);
  return i;
}

// Runs a fused step over span s: vector(span, std::bool_constant<kStream>) does whole vectors of its span
// and returns how many elements it did, scalar(span) does any span. With stream_param, the elements before
// the param copy's first kWidth-aligned address go to the scalar path, the vectors from there stream their
// stores, and a fence orders those stores before whatever the caller writes next (a flag, a task's end).
template <typename V, typename Vector, typename Scalar>
void run_step(const StepSpan& s, const Vector& vector, const Scalar& scalar) {
  bool stream = s.stream_param && s.param != nullptr;
  std::size_t head = 0;
  if (stream) {
    const std::size_t elem = size_of(s.param_dtype);
    const std::size_t align = V::kWidth * elem;
    const auto addr = reinterpret_cast<std::uintptr_t>(s.param);
    if (addr % elem != 0) {
      stream = false;  // not element-aligned: no vector store address is aligned
    } else {
      head = std::min(s.count, (align - addr % align) % align / elem);
    }
  }
  if (head > 0) {
    StepSpan h = s;
    h.count = head;
    scalar(h);
    if (head == s.count) return;
  }
  const StepSpan body = head > 0 ? span_tail(s, head) : s;
  const std::size_t done = stream ? vector(body, std::true_type{}) : vector(body, std::false_type{});
  if (stream) V::fence();
  if (done < body.count) scalar(span_tail(body, done));
}

// The path's kernels (its table's entries): whole vectors here, the rest on the scalar path.
template <typename V>
void adam(const AdamCoeffs& c, const StepSpan& s) {
  run_step<V>(
      s,
      [&](const StepSpan& b, auto stream) {
        constexpr bool kStream = decltype(stream)::value;
        std::size_t done = 0;
        with_span_types(b, [&](auto* p, auto* m, auto* v, const auto* g, auto* out) {
          if (c.l2) {
            done = adam_loop<V, true, false, kStream>(c, p, m, v, g, out, b.count);
          } else if (c.decoupled) {
            done = adam_loop<V, false, true, kStream>(c, p, m, v, g, out, b.count);
          } else {
            done = adam_loop<V, false, false, kStream>(c, p, m, v, g, out, b.count);
          }
        });
        return done;
      },
      [&](const StepSpan& t) { kScalarKernels.adam(c, t); });
}

template <typename V>
void lion(const LionCoeffs& c, const StepSpan& s) {
  run_step<V>(
      s,
      [&](const StepSpan& b, auto stream) {
        constexpr bool kStream = decltype(stream)::value;
        std::size_t done = 0;
        with_span_types(b, [&](auto* p, auto* m, auto*, const auto* g, auto* out) {
          if (c.decay) {
            done = lion_loop<V, true, kStream>(c, p, m, g, out, b.count);
          } else {
            done = lion_loop<V, false, kStream>(c, p, m, g, out, b.count);
          }
        });
        return done;
      },
      [&](const StepSpan& t) { kScalarKernels.lion(c, t); });
}

template <typename V>
void adagrad(const AdagradCoeffs& c, const StepSpan& s) {
  run_step<V>(
      s,
      [&](const StepSpan& b, auto stream) {
        constexpr bool kStream = decltype(stream)::value;
        std::size_t done = 0;
        with_span_types(b, [&](auto* p, auto*, auto* sum, const auto* g, auto* out) {
          if (c.l2) {
            done = adagrad_loop<V, true, kStream>(c, p, sum, g, out, b.count);
          } else {
            done = adagrad_loop<V, false, kStream>(c, p, sum, g, out, b.count);
          }
        });
        return done;
      },
      [&](const StepSpan& t) { kScalarKernels.adagrad(c, t); });
}

template <typename V>
void accumulate(float* acc, const void* src, DType src_dtype, float alpha, std::size_t count, StatLanes* lanes) {
  auto run = [&](const auto* x) {
    const std::size_t done = lanes != nullptr ? accumulate_loop<V, true>(acc, x, alpha, count, lanes)
                                              : accumulate_loop<V, false>(acc, x, alpha, count, lanes);
    if (done < count) kScalarKernels.accumulate(acc + done, x + done, src_dtype, alpha, count - done, lanes);
  };
  if (src_dtype == DType::f32) {
    run(static_cast<const float*>(src));
  } else if (src_dtype == DType::bf16) {
    run(static_cast<const bf16_t*>(src));
  } else {
    run(static_cast<const fp16_t*>(src));
  }
}

template <typename V>
void grad_stats(const float* acc, std::size_t count, StatLanes& lanes) {
  const std::size_t done = grad_stats_loop<V>(acc, count, lanes);
  if (done < count) kScalarKernels.grad_stats(acc + done, count - done, lanes);
}

}  // namespace simd

}  // namespace zero3::offload::detail
