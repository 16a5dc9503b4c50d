// Stream and Event: in-order queues of device work and the points that order them, with no Device attached.
// They sit below both the device backends (runtime/device, which implement them) and the element-wise kernels
// (kernels/, which enqueue on them), so neither includes the other's headers. Streams and events may be used
// from any host thread; a Stream's methods are internally serialized.
#pragma once

#include <functional>
#include <string_view>

namespace zero3 {

namespace kernels {
class KernelBackend;
}

class Device;  // zero3/device/device.hpp

enum class DeviceKind { host, cuda };
inline constexpr std::string_view device_kind_name(DeviceKind k) {
  return k == DeviceKind::host ? "host" : "cuda";
}

// Marks a point in a stream. Like a CUDA event: wait()/query() refer to the most recent record() made
// before the call; an event never recorded counts as complete.
class Event {
 public:
  virtual ~Event() = default;
  // Non-blocking: true when the work captured by the last record() has completed.
  virtual bool query() = 0;
  // Blocks the calling host thread until the work captured by the last record() has completed.
  virtual void synchronize() = 0;
};

// An in-order queue of device work. Work enqueued on one stream runs in enqueue order; work on
// different streams is unordered unless joined through events.
class Stream {
 public:
  virtual ~Stream() = default;
  virtual Device& device() = 0;
  // The kind of device() and its element-wise kernels: what the kernels need of a stream, without Device.
  virtual DeviceKind device_kind() const = 0;
  virtual const kernels::KernelBackend& kernels() const = 0;
  virtual std::string_view name() const = 0;
  // Non-blocking: `event` completes once everything enqueued on this stream so far has completed.
  virtual void record(Event& event) = 0;
  // Non-blocking: work enqueued on this stream after this call starts only after `event` completes
  // (as recorded at the time of this call).
  virtual void wait(Event& event) = 0;
  // Blocks until all work enqueued so far has completed. Rethrows the first error raised by a host
  // function on this stream (errors are sticky: the stream stays failed, as a CUDA stream would).
  virtual void synchronize() = 0;
  // Non-blocking: runs `fn` on a host thread in stream order (host backend: the stream's worker; cuda:
  // cudaLaunchHostFunc). On cuda, `fn` must not call CUDA APIs. An exception from `fn` makes the stream
  // failed (see synchronize).
  virtual void launch_host(std::function<void()> fn) = 0;
  // cudaStream_t for cuda, nullptr for host.
  virtual void* native_handle() = 0;
};

}  // namespace zero3
