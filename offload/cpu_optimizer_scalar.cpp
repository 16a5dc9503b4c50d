// The scalar path: plain loops over optim_math.hpp's element functions and dtype.hpp's conversions, the
// same calls as the host device's kernels (kernels/host/optim_host.cpp), so its results are theirs bit
// for bit. It is also the reference the SIMD paths are tested against, and its table runs their tails.
#include <cstdint>
#include <type_traits>

#include "cpu_optimizer_paths.hpp"

namespace zero3::offload::detail {
namespace {

struct NoParam {};

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

// Calls fn(const G*, P*) typed by the span's grad and param dtypes (NoParam when param is null).
template <typename Fn>
void with_step_types(const StepSpan& s, const Fn& fn) {
  with_src_type(s.grad_dtype, s.grad, [&](const auto* g) {
    if (s.param == nullptr) {
      fn(g, static_cast<NoParam*>(nullptr));
      return;
    }
    switch (s.param_dtype) {
      case DType::f32:
        fn(g, static_cast<float*>(s.param));
        return;
      case DType::bf16:
        fn(g, static_cast<bf16_t*>(s.param));
        return;
      case DType::f16:
        fn(g, static_cast<fp16_t*>(s.param));
        return;
    }
  });
}

inline double square(float x) {
  const double d = x;
  return d * d;
}

void adam(const AdamCoeffs& c, const StepSpan& s) {
  with_step_types(s, [&](const auto* g, auto* out) {
    float* p = s.master;
    float* m = s.exp_avg;
    float* v = s.exp_avg_sq;
    for (std::size_t i = 0; i < s.count; ++i) {
      float pi = p[i], mi = m[i], vi = v[i];
      kernels::detail::adam_elem(c, to_float(g[i]), pi, mi, vi);
      p[i] = pi;
      m[i] = mi;
      v[i] = vi;
      store(out, i, pi);
    }
  });
}

void lion(const LionCoeffs& c, const StepSpan& s) {
  with_step_types(s, [&](const auto* g, auto* out) {
    float* p = s.master;
    float* m = s.exp_avg;
    for (std::size_t i = 0; i < s.count; ++i) {
      float pi = p[i], mi = m[i];
      kernels::detail::lion_elem(c, to_float(g[i]), pi, mi);
      p[i] = pi;
      m[i] = mi;
      store(out, i, pi);
    }
  });
}

void adagrad(const AdagradCoeffs& c, const StepSpan& s) {
  with_step_types(s, [&](const auto* g, auto* out) {
    float* p = s.master;
    float* sum = s.exp_avg_sq;
    for (std::size_t i = 0; i < s.count; ++i) {
      float pi = p[i], si = sum[i];
      kernels::detail::adagrad_elem(c, to_float(g[i]), pi, si);
      p[i] = pi;
      sum[i] = si;
      store(out, i, pi);
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
