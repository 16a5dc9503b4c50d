// Host implementation of the element-wise kernels: the host device's backend and the oracle every other
// backend is tested against. Each op checks its arguments on the calling thread, then runs on the
// stream's worker (stream.launch_host), so it is ordered with the rest of the stream's work.
// Large ops split across oneTBB workers; every result is independent of how the work is split.
// accumulate and the optimizer steps are in optim_host.cpp; the loop helpers in host_common.hpp.
#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "host_common.hpp"
#include "kernel_checks.hpp"
#include "optim_host.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::kernels {
namespace {

using host::check_host_reachable;
using host::for_ranges;
using host::from_float;
using host::kParallelMinElems;
using host::kUseTbb;
using host::with_type;

// sum_squares sums fixed chunks of this many elements, then adds the chunk sums in chunk order: the
// result depends on the input only, never on the thread count or the TBB schedule.
constexpr std::size_t kSumChunkElems = std::size_t{1} << 16;

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

  // accumulate and the optimizer steps live in optim_host.cpp.
  void accumulate(Stream& stream, BufferView dst, ConstBufferView src, float alpha) const override {
    host::accumulate(stream, dst, src, alpha);
  }
  void adam_step(Stream& stream, const AdamArgs& args, BufferView master, BufferView exp_avg, BufferView exp_avg_sq,
                 ConstBufferView grad, BufferView param) const override {
    host::adam_step(stream, args, master, exp_avg, exp_avg_sq, grad, param);
  }
  void lion_step(Stream& stream, const LionArgs& args, BufferView master, BufferView exp_avg, ConstBufferView grad,
                 BufferView param) const override {
    host::lion_step(stream, args, master, exp_avg, grad, param);
  }
  void adagrad_step(Stream& stream, const AdagradArgs& args, BufferView master, BufferView sum_sq, ConstBufferView grad,
                    BufferView param) const override {
    host::adagrad_step(stream, args, master, sum_sq, grad, param);
  }
};

}  // namespace

const KernelBackend& host_backend() {
  static const HostKernelBackend backend;
  return backend;
}

}  // namespace zero3::kernels
