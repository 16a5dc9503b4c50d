// Shared pieces of the host kernels (private to kernels/host): the parallel loop over element ranges,
// fp32 load/store of each storage type, dtype dispatch, and the memory-kind check. Every op built on
// for_ranges gives results independent of how the work is split.
#pragma once

#include <fmt/format.h>
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <cstddef>
#include <string_view>

#include "zero3/core/buffer_view.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/stream.hpp"

// oneTBB's own library is not built with ThreadSanitizer, so TSan cannot see the synchronization of its
// workers and reports their writes as races. Under TSan the ops run on the stream's worker alone; the
// results are the same, since no result depends on how the work is split.
#if defined(__SANITIZE_THREAD__)
#define ZERO3_KERNELS_USE_TBB 0
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZERO3_KERNELS_USE_TBB 0
#endif
#endif
#ifndef ZERO3_KERNELS_USE_TBB
#define ZERO3_KERNELS_USE_TBB 1
#endif

namespace zero3::kernels::host {

inline constexpr bool kUseTbb = ZERO3_KERNELS_USE_TBB != 0;

// Below this many elements one thread is faster than waking TBB workers (and keeps small tests and
// oversubscribed MPI runs free of extra threads).
inline constexpr std::size_t kParallelMinElems = std::size_t{1} << 18;
inline constexpr std::size_t kGrainElems = std::size_t{1} << 15;

// fn(begin, end) over [0, n), split across threads when n is large. fn must touch only its range.
template <typename Fn>
void for_ranges(std::size_t n, const Fn& fn) {
  if (!kUseTbb || n < kParallelMinElems) {
    fn(std::size_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, kGrainElems),
                    [&](const tbb::blocked_range<std::size_t>& r) { fn(r.begin(), r.end()); });
}

template <typename T>
T from_float(float v);
template <>
inline float from_float<float>(float v) {
  return v;
}
template <>
inline bf16_t from_float<bf16_t>(float v) {
  return float_to_bf16(v);
}
template <>
inline fp16_t from_float<fp16_t>(float v) {
  return float_to_fp16(v);
}

// Calls fn(T{}) with T the storage type of `t`.
template <typename Fn>
void with_type(DType t, const Fn& fn) {
  switch (t) {
    case DType::f32:
      fn(float{});
      return;
    case DType::f16:
      fn(fp16_t{});
      return;
    case DType::bf16:
      fn(bf16_t{});
      return;
  }
  throw UsageError(fmt::format("unknown dtype {}", static_cast<int>(t)));
}

// On a host device every memory kind is host memory. On a CUDA stream (a host function run through
// cudaLaunchHostFunc) only host memory can be touched.
inline void check_host_reachable(Stream& stream, std::string_view op, MemoryKind kind) {
  ZERO3_CHECK(stream.device_kind() == DeviceKind::host || kind != MemoryKind::device,
              fmt::format("{}: the host kernels cannot touch device memory of a {} stream ('{}')", op,
                          device_kind_name(stream.device_kind()), stream.name()));
}

}  // namespace zero3::kernels::host
