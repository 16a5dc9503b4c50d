// Host implementation of the element-wise kernels: the host device's backend and the oracle every other
// backend is tested against. Each op checks its arguments on the calling thread, then runs on the
// stream's worker (stream.launch_host), so it is ordered with the rest of the stream's work.
// Large ops split across oneTBB workers; every result is independent of how the work is split.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernel_checks.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/kernels/kernels.hpp"

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

namespace zero3::kernels {
namespace {

constexpr bool kUseTbb = ZERO3_KERNELS_USE_TBB != 0;

// Below this many elements one thread is faster than waking TBB workers (and keeps small tests and
// oversubscribed MPI runs free of extra threads).
constexpr std::size_t kParallelMinElems = std::size_t{1} << 18;
constexpr std::size_t kGrainElems = std::size_t{1} << 15;
// sum_squares sums fixed chunks of this many elements, then adds the chunk sums in chunk order: the
// result depends on the input only, never on the thread count or the TBB schedule.
constexpr std::size_t kSumChunkElems = std::size_t{1} << 16;

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

inline float to_float(float v) {
  return v;
}
inline float to_float(bf16_t v) {
  return bf16_to_float(v);
}
inline float to_float(fp16_t v) {
  return fp16_to_float(v);
}

template <typename T>
T from_float(float v);
template <>
float from_float<float>(float v) {
  return v;
}
template <>
bf16_t from_float<bf16_t>(float v) {
  return float_to_bf16(v);
}
template <>
fp16_t from_float<fp16_t>(float v) {
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

// Inf and NaN are the patterns whose exponent bits are all ones, in every one of the three formats.
inline bool is_nonfinite(float v) {
  return (float_bits(v) & 0x7f800000u) == 0x7f800000u;
}
inline bool is_nonfinite(bf16_t v) {
  return (v.bits & 0x7f80u) == 0x7f80u;
}
inline bool is_nonfinite(fp16_t v) {
  return (v.bits & 0x7c00u) == 0x7c00u;
}

// On a host device every memory kind is host memory. On a CUDA stream (a host function run through
// cudaLaunchHostFunc) only host memory can be touched.
void check_host_reachable(Stream& stream, std::string_view op, MemoryKind kind) {
  ZERO3_CHECK(stream.device().kind() == DeviceKind::host || kind != MemoryKind::device,
              fmt::format("{}: the host kernels cannot touch device memory of a {} stream ('{}')", op,
                          device_kind_name(stream.device().kind()), stream.name()));
}

class HostKernelBackend final : public KernelBackend {
 public:
  void cast(Stream& stream, BufferView dst, ConstBufferView src) const override {
    detail::check_cast(dst, src);
    check_host_reachable(stream, "cast", dst.kind);
    check_host_reachable(stream, "cast", src.kind);
    if (dst.count == 0) return;
    if (dst.dtype == src.dtype) {
      // A same-dtype cast is a bit copy: NaN payloads survive, as with cudaMemcpy.
      stream.launch_host([dst, src] {
        if (dst.data != src.data) std::memcpy(dst.data, src.data, dst.size_bytes());
      });
      return;
    }
    stream.launch_host([dst, src] {
      with_type(dst.dtype, [&](auto dst_tag) {
        with_type(src.dtype, [&](auto src_tag) {
          using D = decltype(dst_tag);
          using S = decltype(src_tag);
          D* out = dst.as<D>();
          const S* in = src.as<S>();
          // bf16 <-> fp16 goes through fp32, which holds either exactly: one rounding, to the target.
          for_ranges(dst.count, [&](std::size_t b, std::size_t e) {
            for (std::size_t i = b; i < e; ++i) out[i] = from_float<D>(to_float(in[i]));
          });
        });
      });
    });
  }

  void scale(Stream& stream, BufferView x, float alpha) const override {
    detail::check_data("scale", "x", x.data, x.count);
    check_host_reachable(stream, "scale", x.kind);
    if (x.count == 0) return;
    stream.launch_host([x, alpha] {
      with_type(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* p = x.as<T>();
        for_ranges(x.count, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) p[i] = from_float<T>(to_float(p[i]) * alpha);
        });
      });
    });
  }

  void sum_squares(Stream& stream, ConstBufferView x, BufferView out, bool accumulate) const override {
    detail::check_data("sum_squares", "x", x.data, x.count);
    detail::check_scalar_out("sum_squares", "out", out);
    detail::check_scalar_apart("sum_squares", x, out);
    check_host_reachable(stream, "sum_squares", x.kind);
    check_host_reachable(stream, "sum_squares", out.kind);
    stream.launch_host([x, out, accumulate] {
      // Each square of an fp32 value is exact in double (24 + 24 bits < 53), so the only rounding is in
      // the additions: the double sum is far more accurate than the fp32 result it is rounded to.
      const std::size_t num_chunks = (x.count + kSumChunkElems - 1) / kSumChunkElems;
      std::vector<double> partial(num_chunks, 0.0);
      with_type(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* p = x.as<T>();
        auto sum_chunks = [&](std::size_t c0, std::size_t c1) {
          for (std::size_t c = c0; c < c1; ++c) {
            const std::size_t b = c * kSumChunkElems;
            const std::size_t e = std::min(b + kSumChunkElems, x.count);
            double acc = 0.0;
            for (std::size_t i = b; i < e; ++i) {
              const double v = to_float(p[i]);
              acc += v * v;
            }
            partial[c] = acc;
          }
        };
        if (!kUseTbb || x.count < kParallelMinElems) {
          sum_chunks(0, num_chunks);
        } else {
          tbb::parallel_for(tbb::blocked_range<std::size_t>(0, num_chunks, 1),
                            [&](const tbb::blocked_range<std::size_t>& r) { sum_chunks(r.begin(), r.end()); });
        }
      });
      double total = 0.0;
      for (double s : partial) total += s;
      float* o = out.as<float>();
      if (accumulate) total = static_cast<double>(*o) + total;
      *o = static_cast<float>(total);
    });
  }

  void nonfinite_check(Stream& stream, ConstBufferView x, BufferView flag) const override {
    detail::check_data("nonfinite_check", "x", x.data, x.count);
    detail::check_scalar_out("nonfinite_check", "flag", flag);
    detail::check_scalar_apart("nonfinite_check", x, flag);
    check_host_reachable(stream, "nonfinite_check", x.kind);
    check_host_reachable(stream, "nonfinite_check", flag.kind);
    if (x.count == 0) return;
    stream.launch_host([x, flag] {
      std::atomic<bool> found{false};
      with_type(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T* p = x.as<T>();
        for_ranges(x.count, [&](std::size_t b, std::size_t e) {
          bool any = false;
          for (std::size_t i = b; i < e; ++i) any |= is_nonfinite(p[i]);
          if (any) found.store(true, std::memory_order_relaxed);
        });
      });
      // Only ever set, never cleared: one flag collects the checks of many tensors.
      if (found.load(std::memory_order_relaxed)) *flag.as<float>() = 1.0f;
    });
  }

  void fill(Stream& stream, BufferView x, float value) const override {
    detail::check_data("fill", "x", x.data, x.count);
    check_host_reachable(stream, "fill", x.kind);
    if (x.count == 0) return;
    stream.launch_host([x, value] {
      with_type(x.dtype, [&](auto tag) {
        using T = decltype(tag);
        const T v = from_float<T>(value);
        T* p = x.as<T>();
        for_ranges(x.count, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) p[i] = v;
        });
      });
    });
  }
};

}  // namespace

const KernelBackend& host_backend() {
  static const HostKernelBackend backend;
  return backend;
}

}  // namespace zero3::kernels
