// The range functions of cpu_optimizer.hpp: the path's kernel table looked up (kernels_for) and the
// arguments checked once here, coefficients computed once per call (optim_coeffs.hpp, as the device
// kernels do), then the table's kernel runs over the whole span.
// GradStats' lanes are folded here, in one place, so every path sums them in the same order.
#include "zero3/offload/cpu_optimizer.hpp"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "cpu_optimizer_paths.hpp"
#include "optim_coeffs.hpp"
#include "zero3/core/error.hpp"

namespace zero3::offload {
namespace detail {

StepSpan span_tail(const StepSpan& s, std::size_t offset) {
  StepSpan t = s;
  t.master = static_cast<char*>(s.master) + offset * size_of(s.master_dtype);
  if (s.exp_avg != nullptr) t.exp_avg = static_cast<char*>(s.exp_avg) + offset * size_of(s.state_dtype);
  if (s.exp_avg_sq != nullptr) t.exp_avg_sq = static_cast<char*>(s.exp_avg_sq) + offset * size_of(s.state_dtype);
  t.grad = static_cast<const char*>(s.grad) + offset * size_of(s.grad_dtype);
  if (s.param != nullptr) t.param = static_cast<char*>(s.param) + offset * size_of(s.param_dtype);
  t.count = s.count - offset;
  return t;
}

}  // namespace detail

namespace {

using detail::StatLanes;

// The one place a SimdPath becomes code: its table (cpu_optimizer_paths.hpp), once `path` is known to be
// a path that this CPU and build support.
const detail::CpuOptimizerKernels& kernels_for(std::string_view op, SimdPath path) {
  const detail::CpuOptimizerKernels* k = nullptr;
  switch (path) {
    case SimdPath::scalar:
      k = &detail::kScalarKernels;
      break;
    case SimdPath::avx2:
      k = &detail::kAvx2Kernels;
      break;
    case SimdPath::avx512:
      k = &detail::kAvx512Kernels;
      break;
  }
  if (k == nullptr) throw UsageError(fmt::format("{}: unknown SIMD path {}", op, static_cast<int>(path)));
  if (!simd_path_supported(path)) {
    throw UsageError(fmt::format("{}: SIMD path {} is not supported by this CPU or build (use best_simd_path())", op,
                                 simd_path_name(path)));
  }
  return *k;
}

void check_dtype(std::string_view op, std::string_view what, DType t) {
  if (t != DType::f32 && t != DType::bf16 && t != DType::f16) {
    throw UsageError(fmt::format("{}: {} has unknown dtype {}", op, what, static_cast<int>(t)));
  }
}

// A dtype's name, or its number when it is none of DType's values.
std::string dtype_label(DType t) {
  if (t == DType::f32 || t == DType::bf16 || t == DType::f16) return std::string(dtype_name(t));
  return fmt::format("unknown dtype {}", static_cast<int>(t));
}

void check_ptr(std::string_view op, std::string_view what, const void* p) {
  if (p == nullptr) throw UsageError(fmt::format("{}: {} is null with a non-zero count", op, what));
}

// The span's pointers that `op` uses (master and grad always, the named states) are non-null, its dtypes
// known and its master and state storage a supported pair. Only called with count > 0.
void check_span(std::string_view op, const StepSpan& s, bool uses_exp_avg, bool uses_exp_avg_sq) {
  check_ptr(op, "master", s.master);
  if (uses_exp_avg) check_ptr(op, "exp_avg", s.exp_avg);
  if (uses_exp_avg_sq) check_ptr(op, uses_exp_avg ? "exp_avg_sq" : "exp_avg_sq (the sum of squares)", s.exp_avg_sq);
  check_ptr(op, "grad", s.grad);
  check_dtype(op, "grad", s.grad_dtype);
  if (s.param != nullptr) check_dtype(op, "param", s.param_dtype);
  if (!kernels::optimizer_storage_supported(s.master_dtype, s.state_dtype)) {
    throw UsageError(
        fmt::format("{}: master of {} with state of {} is not a supported storage (master fp32, bf16 or "
                    "fp16 with fp32 state; bf16 state only with a bf16 master)",
                    op, dtype_label(s.master_dtype), dtype_label(s.state_dtype)));
  }
}

// The fixed fold of cpu_optimizer_paths.hpp's 16 lanes: halves added pairwise, 16 -> 8 -> 4 -> 2 -> 1.
// Squares are finite for finite floats and their sum cannot overflow a double, so the sum is finite
// exactly when every value was.
GradStats fold(const StatLanes& l) {
  double s[detail::kStatLanes];
  for (std::size_t j = 0; j < detail::kStatLanes; ++j) s[j] = l.lane[j];
  for (std::size_t half = detail::kStatLanes / 2; half >= 1; half /= 2) {
    for (std::size_t j = 0; j < half; ++j) s[j] = s[j] + s[j + half];
  }
  GradStats out;
  out.sum_sq = s[0];
  out.nonfinite = !std::isfinite(s[0]);
  return out;
}

}  // namespace

void adam_range(SimdPath path, const kernels::AdamArgs& args, const StepSpan& span) {
  const detail::CpuOptimizerKernels& k = kernels_for("adam_range", path);
  if (span.count == 0) return;
  check_span("adam_range", span, true, true);
  k.adam(kernels::detail::adam_coeffs(args), span);
}

void lion_range(SimdPath path, const kernels::LionArgs& args, const StepSpan& span) {
  const detail::CpuOptimizerKernels& k = kernels_for("lion_range", path);
  if (span.count == 0) return;
  check_span("lion_range", span, true, false);
  k.lion(kernels::detail::lion_coeffs(args), span);
}

void adagrad_range(SimdPath path, const kernels::AdagradArgs& args, const StepSpan& span) {
  const detail::CpuOptimizerKernels& k = kernels_for("adagrad_range", path);
  if (span.count == 0) return;
  check_span("adagrad_range", span, false, true);
  k.adagrad(kernels::detail::adagrad_coeffs(args), span);
}

GradStats accumulate_range(SimdPath path, float* acc, const void* src, DType src_dtype, float alpha, std::size_t count,
                           bool want_stats) {
  const detail::CpuOptimizerKernels& k = kernels_for("accumulate_range", path);
  check_dtype("accumulate_range", "src", src_dtype);
  if (count == 0) return {};
  check_ptr("accumulate_range", "acc", acc);
  check_ptr("accumulate_range", "src", src);
  StatLanes lanes;
  k.accumulate(acc, src, src_dtype, alpha, count, want_stats ? &lanes : nullptr);
  return want_stats ? fold(lanes) : GradStats{};
}

GradStats grad_stats_range(SimdPath path, const float* acc, std::size_t count) {
  const detail::CpuOptimizerKernels& k = kernels_for("grad_stats_range", path);
  if (count == 0) return {};
  check_ptr("grad_stats_range", "acc", acc);
  StatLanes lanes;
  k.grad_stats(acc, count, lanes);
  return fold(lanes);
}

}  // namespace zero3::offload
