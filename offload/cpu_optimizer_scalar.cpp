// The scalar path: plain loops over optim_math.hpp's element functions and dtype.hpp's conversions (the
// widening loads and round-to-nearest-even stores of 16-bit master and state too), the same calls as the
// host device's kernels (kernels/host/optim_host.cpp), so its results are theirs bit for bit. It is also
// the reference the SIMD paths are tested against, and its table runs their tails.
#include <cstdint>
#include <type_traits>

#include "cpu_optimizer_paths.hpp"

namespace zero3::offload::detail {
namespace {

inline void store(float* out, std::size_t i, float v) {
  out[i] = v;
}
inline void store(bf16_t* out, std::size_t i, float v) {
  out[i] = float_to_bf16(v);
}
inline void store(fp16_t* out, std::size_t i, float v) {
  out[i] = float_to_fp16(v);
}
inline void store(NoParam*, std::size_t, float) {}

// Stores the new master weight p rounded to M, and the param copy of the value stored (kernels.hpp:
// param == cast(master)); for fp32 M both are p itself.
template <typename M, typename P>
inline void store_master(M* master, P* out, std::size_t i, float p) {
  store(master, i, p);
  if constexpr (std::is_same_v<M, float>) {
    store(out, i, p);
  } else {
    store(out, i, to_float(master[i]));
  }
}

// Calls fn(const G*) with G the storage type of `t`.
template <typename Fn>
void with_src_type(DType t, const void* p, const Fn& fn) {
  switch (t) {
    case DType::f32:
      fn(static_cast<const float*>(p));
      return;
    case DType::bf16:
      fn(static_cast<const bf16_t*>(p));
      return;
    case DType::f16:
      fn(static_cast<const fp16_t*>(p));
      return;
  }
}

inline double square(float x) {
  const double d = x;
  return d * d;
}

void adam(const AdamCoeffs& c, const StepSpan& s) {
  with_span_types(s, [&](auto* p, auto* m, auto* v, const auto* g, auto* out) {
    for (std::size_t i = 0; i < s.count; ++i) {
      float pi = to_float(p[i]), mi = to_float(m[i]), vi = to_float(v[i]);
      kernels::detail::adam_elem(c, to_float(g[i]), pi, mi, vi);
      store(m, i, mi);
      store(v, i, vi);
      store_master(p, out, i, pi);
    }
  });
}

void lion(const LionCoeffs& c, const StepSpan& s) {
  with_span_types(s, [&](auto* p, auto* m, auto*, const auto* g, auto* out) {
    for (std::size_t i = 0; i < s.count; ++i) {
      float pi = to_float(p[i]), mi = to_float(m[i]);
      kernels::detail::lion_elem(c, to_float(g[i]), pi, mi);
      store(m, i, mi);
      store_master(p, out, i, pi);
    }
  });
}

void adagrad(const AdagradCoeffs& c, const StepSpan& s) {
  with_span_types(s, [&](auto* p, auto*, auto* sum, const auto* g, auto* out) {
    for (std::size_t i = 0; i < s.count; ++i) {
      float pi = to_float(p[i]), si = to_float(sum[i]);
      kernels::detail::adagrad_elem(c, to_float(g[i]), pi, si);
      store(sum, i, si);
      store_master(p, out, i, pi);
    }
  });
}

void accumulate(float* acc, const void* src, DType src_dtype, float alpha, std::size_t count, StatLanes* lanes) {
  with_src_type(src_dtype, src, [&](const auto* x) {
    if (lanes == nullptr) {
      for (std::size_t i = 0; i < count; ++i) acc[i] = kernels::detail::accumulate_elem(acc[i], alpha, to_float(x[i]));
      return;
    }
    for (std::size_t i = 0; i < count; ++i) {
      const float a = kernels::detail::accumulate_elem(acc[i], alpha, to_float(x[i]));
      acc[i] = a;
      lanes->lane[i % kStatLanes] += square(a);
    }
  });
}

void grad_stats(const float* acc, std::size_t count, StatLanes& lanes) {
  for (std::size_t i = 0; i < count; ++i) lanes.lane[i % kStatLanes] += square(acc[i]);
}

}  // namespace

constinit const CpuOptimizerKernels kScalarKernels = {
    .adam = &adam,
    .lion = &lion,
    .adagrad = &adagrad,
    .accumulate = &accumulate,
    .grad_stats = &grad_stats,
    .compiled_in = true,
};

}  // namespace zero3::offload::detail
