// Argument checks shared by the host and CUDA kernel backends (private to kernels/). Each op checks its
// views once, on the calling thread, before anything is enqueued, so a bad call throws UsageError at the
// call site instead of failing later on a stream. Code behind these checks trusts its arguments.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>
#include <vector>

#include "zero3/core/buffer_view.hpp"
#include "zero3/core/error.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::kernels::detail {

inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes != 0 && b_bytes != 0 && a0 < b0 + b_bytes && b0 < a0 + a_bytes;
}

inline void check_data(std::string_view op, std::string_view what, const void* data, std::size_t count) {
  ZERO3_CHECK(count == 0 || data != nullptr, fmt::format("{}: {} has {} elements but no data", op, what, count));
}

// cast: equal counts; src and dst must not overlap unless they are the same view of the same dtype
// (a copy onto itself), because an element-wise kernel would read elements it has already overwritten.
inline void check_cast(BufferView dst, ConstBufferView src) {
  ZERO3_CHECK(dst.count == src.count, fmt::format("cast: count mismatch (dst {} elements of {}, src {} elements of {})",
                                                  dst.count, dtype_name(dst.dtype), src.count, dtype_name(src.dtype)));
  check_data("cast", "dst", dst.data, dst.count);
  check_data("cast", "src", src.data, src.count);
  const bool same_view = dst.data == src.data && dst.dtype == src.dtype;
  ZERO3_CHECK(same_view || !overlaps(dst.data, dst.size_bytes(), src.data, src.size_bytes()),
              fmt::format("cast: dst ({} elements of {}) and src ({} elements of {}) overlap", dst.count,
                          dtype_name(dst.dtype), src.count, dtype_name(src.dtype)));
}

// The one-element fp32 outputs of sum_squares and nonfinite_check.
inline void check_scalar_out(std::string_view op, std::string_view what, BufferView out) {
  ZERO3_CHECK(out.dtype == DType::f32 && out.count == 1,
              fmt::format("{}: {} must be one fp32 element (got {} elements of {})", op, what, out.count,
                          dtype_name(out.dtype)));
  check_data(op, what, out.data, out.count);
}

// The output scalar is written while x is read: they must be distinct memory.
inline void check_scalar_apart(std::string_view op, ConstBufferView x, BufferView out) {
  ZERO3_CHECK(!overlaps(x.data, x.size_bytes(), out.data, out.size_bytes()),
              fmt::format("{}: the output element lies inside the input ({} elements of {})", op, x.count,
                          dtype_name(x.dtype)));
}

// accumulate: dst is fp32 with src's count. dst and src are distinct memory, or the very same fp32 view
// (dst += alpha * dst reads each element before writing it).
inline void check_accumulate(BufferView dst, ConstBufferView src) {
  ZERO3_CHECK(dst.dtype == DType::f32,
              fmt::format("accumulate: dst must be fp32 (got {} elements of {})", dst.count, dtype_name(dst.dtype)));
  ZERO3_CHECK(dst.count == src.count, fmt::format("accumulate: count mismatch (dst {} elements, src {} elements of {})",
                                                  dst.count, src.count, dtype_name(src.dtype)));
  check_data("accumulate", "dst", dst.data, dst.count);
  check_data("accumulate", "src", src.data, src.count);
  const bool same_view = dst.data == src.data && src.dtype == DType::f32;
  ZERO3_CHECK(same_view || !overlaps(dst.data, dst.size_bytes(), src.data, src.size_bytes()),
              fmt::format("accumulate: dst ({} elements) and src ({} elements of {}) overlap", dst.count, src.count,
                          dtype_name(src.dtype)));
}

// One view of an optimizer step, named for messages.
struct StepView {
  std::string_view name;
  const void* data;
  std::size_t count;
  DType dtype;
  MemoryKind kind;
};

inline StepView step_view(std::string_view name, ConstBufferView v) {
  return {name, v.data, v.count, v.dtype, v.kind};
}

// The storage dtypes of a fused step: master's, and one state dtype shared by every state view, form a
// pair that kernels.hpp's optimizer_storage_supported allows. A call whose states differ is a mistake in
// the caller (one optimizer keeps one state precision), so it is rejected rather than served.
inline void check_step_dtypes(std::string_view op, const StepView& master, std::span<const StepView> states) {
  const DType state = states.empty() ? DType::f32 : states.front().dtype;
  for (const StepView& v : states) {
    ZERO3_CHECK(v.dtype == state, fmt::format("{}: every state view must have one dtype ({} is {}, {} is {})", op,
                                              states.front().name, dtype_name(state), v.name, dtype_name(v.dtype)));
  }
  ZERO3_CHECK(optimizer_storage_supported(master.dtype, state),
              fmt::format("{}: {} of {} with state of {} is not a supported storage (master fp32, bf16 or fp16 with "
                          "fp32 state; bf16 state only with a bf16 master)",
                          op, master.name, dtype_name(master.dtype), dtype_name(state)));
}

// The views of a fused optimizer step: master first, then the state views, with master's count and dtypes
// check_step_dtypes allows; grad of any dtype with the same count; param of any dtype with the same count,
// or empty (count 0: no low-precision copy is written). Every view is written or read by the same pass, so
// no two may overlap.
inline void check_step_views(std::string_view op, std::initializer_list<StepView> views, ConstBufferView grad,
                             BufferView param) {
  const StepView& master = *views.begin();
  const std::size_t n = master.count;
  check_step_dtypes(op, master, std::span<const StepView>(views.begin() + 1, views.end()));
  for (const StepView& v : views) {
    ZERO3_CHECK(v.count == n,
                fmt::format("{}: count mismatch ({} has {} elements, {} has {})", op, v.name, v.count, master.name, n));
    check_data(op, v.name, v.data, v.count);
  }
  ZERO3_CHECK(grad.count == n,
              fmt::format("{}: count mismatch (grad has {} elements, {} has {})", op, grad.count, master.name, n));
  check_data(op, "grad", grad.data, grad.count);
  ZERO3_CHECK(param.count == n || param.count == 0,
              fmt::format("{}: param has {} elements; it must have {} (or none, to skip the low-precision copy)", op,
                          param.count, n));
  check_data(op, "param", param.data, param.count);

  std::vector<StepView> all(views);
  all.push_back(step_view("grad", grad));
  all.push_back(step_view("param", param));
  for (std::size_t i = 0; i < all.size(); ++i) {
    for (std::size_t j = i + 1; j < all.size(); ++j) {
      ZERO3_CHECK(!overlaps(all[i].data, all[i].count * size_of(all[i].dtype), all[j].data,
                            all[j].count * size_of(all[j].dtype)),
                  fmt::format("{}: {} and {} overlap", op, all[i].name, all[j].name));
    }
  }
}

inline void check_arg(std::string_view op, std::string_view name, float value, bool ok, std::string_view range) {
  ZERO3_CHECK(ok && std::isfinite(value), fmt::format("{}: {} = {} is out of range ({})", op, name, value, range));
}

inline void check_adam_args(const AdamArgs& a) {
  check_arg("adam_step", "lr", a.lr, a.lr >= 0.0f, "finite, >= 0");
  check_arg("adam_step", "beta1", a.beta1, a.beta1 >= 0.0f && a.beta1 < 1.0f, "[0, 1)");
  check_arg("adam_step", "beta2", a.beta2, a.beta2 >= 0.0f && a.beta2 < 1.0f, "[0, 1)");
  check_arg("adam_step", "eps", a.eps, a.eps >= 0.0f, "finite, >= 0");
  check_arg("adam_step", "weight_decay", a.weight_decay, a.weight_decay >= 0.0f, "finite, >= 0");
  check_arg("adam_step", "grad_scale", a.grad_scale, true, "finite");
  ZERO3_CHECK(a.step >= 1, fmt::format("adam_step: step = {}; steps count from 1", a.step));
}

inline void check_lion_args(const LionArgs& a) {
  check_arg("lion_step", "lr", a.lr, a.lr >= 0.0f, "finite, >= 0");
  check_arg("lion_step", "beta1", a.beta1, a.beta1 >= 0.0f && a.beta1 <= 1.0f, "[0, 1]");
  check_arg("lion_step", "beta2", a.beta2, a.beta2 >= 0.0f && a.beta2 <= 1.0f, "[0, 1]");
  check_arg("lion_step", "weight_decay", a.weight_decay, a.weight_decay >= 0.0f, "finite, >= 0");
  check_arg("lion_step", "grad_scale", a.grad_scale, true, "finite");
}

inline void check_adagrad_args(const AdagradArgs& a) {
  check_arg("adagrad_step", "lr", a.lr, a.lr >= 0.0f, "finite, >= 0");
  check_arg("adagrad_step", "eps", a.eps, a.eps >= 0.0f, "finite, >= 0");
  check_arg("adagrad_step", "weight_decay", a.weight_decay, a.weight_decay >= 0.0f, "finite, >= 0");
  check_arg("adagrad_step", "grad_scale", a.grad_scale, true, "finite");
}

}  // namespace zero3::kernels::detail
