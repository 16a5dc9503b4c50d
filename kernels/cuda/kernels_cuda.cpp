// CUDA implementation of the element-wise kernels. Each op checks its arguments on the calling thread,
// then launches on the stream's cudaStream_t (non-blocking; ordered with the stream's other work).
// Results match the host backend bit for bit, except sum_squares (within 2 fp32 ulps; docs/kernels.md)
// and the sign and payload of NaN results. The optimizer steps share their per-element code and their
// coefficients with the host (optim_math.hpp, optim_coeffs.hpp). Host-side C++ (compiled by the host
// compiler); the kernels and their launchers live in the .cu files.
#include <cuda_runtime.h>
#include <fmt/format.h>

#include "accumulate.cuh"
#include "adagrad.cuh"
#include "adam.cuh"
#include "cast.cuh"
#include "fill.cuh"
#include "kernel_checks.hpp"
#include "lion.cuh"
#include "nonfinite.cuh"
#include "optim_coeffs.hpp"
#include "scale.cuh"
#include "sum_squares.cuh"
#include "zero3/core/log.hpp"
#include "zero3/kernels/kernels.hpp"
#include "zero3_cuda_check.hpp"

namespace zero3::kernels {
namespace {

// Makes the stream's device current while kernels are launched on it (a launch goes to the current
// device), then restores the caller's.
class StreamDeviceGuard {
 public:
  explicit StreamDeviceGuard(cudaStream_t stream) {
    int stream_device = 0;
    ZERO3_CUDA_CHECK(cudaStreamGetDevice(stream, &stream_device));
    ZERO3_CUDA_CHECK(cudaGetDevice(&previous_));
    if (stream_device != previous_) {
      ZERO3_CUDA_CHECK(cudaSetDevice(stream_device));
      switched_ = true;
    }
  }
  ~StreamDeviceGuard() {
    if (switched_) ZERO3_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
  }
  StreamDeviceGuard(const StreamDeviceGuard&) = delete;
  StreamDeviceGuard& operator=(const StreamDeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// A CUDA stream, and memory its kernels can reach: device memory or pinned (mapped) host memory.
cudaStream_t checked_stream(Stream& stream, std::string_view op) {
  ZERO3_CHECK(stream.device_kind() == DeviceKind::cuda,
              fmt::format("{}: CUDA kernels launched on stream '{}' of a {} device", op, stream.name(),
                          device_kind_name(stream.device_kind())));
  return static_cast<cudaStream_t>(stream.native_handle());
}

void check_reachable(std::string_view op, std::string_view what, MemoryKind kind) {
  ZERO3_CHECK(
      kind != MemoryKind::pageable_host,
      fmt::format("{}: {} is pageable host memory, which CUDA kernels cannot access; use pinned memory", op, what));
}

class CudaKernelBackend final : public KernelBackend {
 public:
  void cast(Stream& stream, BufferView dst, ConstBufferView src) const override {
    const cudaStream_t s = checked_stream(stream, "cast");
    detail::check_cast(dst, src);
    check_reachable("cast", "dst", dst.kind);
    check_reachable("cast", "src", src.kind);
    if (dst.count == 0) return;
    StreamDeviceGuard guard(s);
    gpu::launch_cast(s, dst, src);
  }

  void scale(Stream& stream, BufferView x, float alpha) const override {
    const cudaStream_t s = checked_stream(stream, "scale");
    detail::check_data("scale", "x", x.data, x.count);
    check_reachable("scale", "x", x.kind);
    if (x.count == 0) return;
    StreamDeviceGuard guard(s);
    gpu::launch_scale(s, x, alpha);
  }

  void sum_squares(Stream& stream, ConstBufferView x, BufferView out, bool accumulate) const override {
    const cudaStream_t s = checked_stream(stream, "sum_squares");
    detail::check_data("sum_squares", "x", x.data, x.count);
    detail::check_scalar_out("sum_squares", "out", out);
    detail::check_scalar_apart("sum_squares", x, out);
    check_reachable("sum_squares", "x", x.kind);
    check_reachable("sum_squares", "out", out.kind);
    StreamDeviceGuard guard(s);
    gpu::launch_sum_squares(s, x, out, accumulate);
  }

  void nonfinite_check(Stream& stream, ConstBufferView x, BufferView flag) const override {
    const cudaStream_t s = checked_stream(stream, "nonfinite_check");
    detail::check_data("nonfinite_check", "x", x.data, x.count);
    detail::check_scalar_out("nonfinite_check", "flag", flag);
    detail::check_scalar_apart("nonfinite_check", x, flag);
    check_reachable("nonfinite_check", "x", x.kind);
    check_reachable("nonfinite_check", "flag", flag.kind);
    if (x.count == 0) return;
    StreamDeviceGuard guard(s);
    gpu::launch_nonfinite_check(s, x, flag);
  }

  void fill(Stream& stream, BufferView x, float value) const override {
    const cudaStream_t s = checked_stream(stream, "fill");
    detail::check_data("fill", "x", x.data, x.count);
    check_reachable("fill", "x", x.kind);
    if (x.count == 0) return;
    StreamDeviceGuard guard(s);
    gpu::launch_fill(s, x, value);
  }

  void accumulate(Stream& stream, BufferView dst, ConstBufferView src, float alpha) const override {
    const cudaStream_t s = checked_stream(stream, "accumulate");
    detail::check_accumulate(dst, src);
    check_reachable("accumulate", "dst", dst.kind);
    check_reachable("accumulate", "src", src.kind);
    if (dst.count == 0) return;
    StreamDeviceGuard guard(s);
    gpu::launch_accumulate(s, dst, src, alpha);
  }

  void adam_step(Stream& stream, const AdamArgs& args, BufferView master, BufferView exp_avg, BufferView exp_avg_sq,
                 ConstBufferView grad, BufferView param) const override {
    const cudaStream_t s = checked_stream(stream, "adam_step");
    detail::check_adam_args(args);
    check_step("adam_step",
               {detail::step_view("master", master), detail::step_view("exp_avg", exp_avg),
                detail::step_view("exp_avg_sq", exp_avg_sq)},
               grad, param);
    if (master.count == 0) return;
    StreamDeviceGuard guard(s);
    gpu::launch_adam(s, detail::adam_coeffs(args), master, exp_avg, exp_avg_sq, grad, param);
  }

  void lion_step(Stream& stream, const LionArgs& args, BufferView master, BufferView exp_avg, ConstBufferView grad,
                 BufferView param) const override {
    const cudaStream_t s = checked_stream(stream, "lion_step");
    detail::check_lion_args(args);
    check_step("lion_step", {detail::step_view("master", master), detail::step_view("exp_avg", exp_avg)}, grad, param);
    if (master.count == 0) return;
    StreamDeviceGuard guard(s);
    gpu::launch_lion(s, detail::lion_coeffs(args), master, exp_avg, grad, param);
  }

  void adagrad_step(Stream& stream, const AdagradArgs& args, BufferView master, BufferView sum_sq, ConstBufferView grad,
                    BufferView param) const override {
    const cudaStream_t s = checked_stream(stream, "adagrad_step");
    detail::check_adagrad_args(args);
    check_step("adagrad_step", {detail::step_view("master", master), detail::step_view("sum_sq", sum_sq)}, grad, param);
    if (master.count == 0) return;
    StreamDeviceGuard guard(s);
    gpu::launch_adagrad(s, detail::adagrad_coeffs(args), master, sum_sq, grad, param);
  }

 private:
  // The views of an optimizer step: shapes and overlaps (kernel_checks.hpp), then reachability.
  static void check_step(std::string_view op, std::initializer_list<detail::StepView> fp32_views, ConstBufferView grad,
                         BufferView param) {
    detail::check_step_views(op, fp32_views, grad, param);
    for (const detail::StepView& v : fp32_views) check_reachable(op, v.name, v.kind);
    check_reachable(op, "grad", grad.kind);
    if (param.count != 0) check_reachable(op, "param", param.kind);
  }
};

}  // namespace

}  // namespace zero3::kernels

namespace zero3::kernels {

const KernelBackend& cuda_backend() {
  static const CudaKernelBackend backend;
  return backend;
}

}  // namespace zero3::kernels
