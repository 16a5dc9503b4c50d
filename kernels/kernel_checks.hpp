// Argument checks shared by the host and CUDA kernel backends (private to kernels/). Each op checks its
// views once, on the calling thread, before anything is enqueued, so a bad call throws UsageError at the
// call site instead of failing later on a stream. Code behind these checks trusts its arguments.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string_view>

#include "zero3/core/buffer_view.hpp"
#include "zero3/core/error.hpp"

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

}  // namespace zero3::kernels::detail
