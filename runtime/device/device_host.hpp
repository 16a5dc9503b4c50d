// Host backend: a simulated device in host memory. Each stream is an in-order queue executed by its
// own worker thread, so work really runs asynchronously and a missing event shows up as a wrong
// result in tests. With guard_scope_memory, gathered params and gradient buffers are inaccessible
// outside stream work (scope_guard.hpp). Worker threads sleep on condition variables (never spin): with 4 ranks on 2
// cores a spinning thread would starve the one it waits for.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "zero3/device/device.hpp"

namespace zero3 {

// One record() of an event: done once the recording stream has run everything enqueued before it.
// Each record makes a new marker, so a wait() keeps referring to the record it saw even when the
// event is recorded again (possibly on another stream) before that record completes, as on CUDA.
class HostMarker {
 public:
  void complete();
  void wait();
  bool done();

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
};

class HostEvent final : public Event {
 public:
  bool query() override;
  void synchronize() override;
  // A fresh marker that becomes the event's latest record (HostStream::record enqueues it).
  std::shared_ptr<HostMarker> begin_record();
  // The latest record's marker; null when the event was never recorded (it counts as complete).
  std::shared_ptr<HostMarker> latest();

 private:
  std::mutex mutex_;
  std::shared_ptr<HostMarker> latest_;
};

class HostStream final : public Stream {
 public:
  HostStream(Device& device, std::string name);
  ~HostStream() override;  // drains queued work, then joins the worker

  Device& device() override { return device_; }
  DeviceKind device_kind() const override { return device_.kind(); }
  const kernels::KernelBackend& kernels() const override { return device_.kernels(); }
  std::string_view name() const override { return name_; }
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;
  void launch_host(std::function<void()> fn) override;
  void* native_handle() override { return nullptr; }
  // launch_host, shown on the trace's `track` instead of the stream's own (the device's copies).
  void launch_host_on_track(std::function<void()> fn, std::string_view track);

 private:
  struct Task {
    std::function<void()> fn;
    bool always_run = false;  // ordering markers run even after an error, so waiters never hang
    // While a trace is recorded (zero3/core/trace.hpp): the span's track and name ("" track: none).
    std::string trace_track;
    std::string trace_name;
  };
  void enqueue(Task task);
  void run();

  Device& device_;
  std::string name_;
  std::mutex mutex_;
  std::condition_variable work_cv_;  // worker waits for tasks
  std::condition_variable done_cv_;  // synchronize() waits for completion
  std::deque<Task> queue_;
  std::uint64_t submitted_ = 0;
  std::uint64_t completed_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;  // first failure of a host function; sticky
  bool error_reported_ = false;
  std::thread::id worker_id_;  // set by the worker under mutex_; synchronize() from a task would deadlock
  std::thread worker_;         // declared last: started after every member it uses exists
};

class HostDevice final : public Device {
 public:
  explicit HostDevice(const HostDeviceOptions& options);
  ~HostDevice() override;
  HostDevice(const HostDevice&) = delete;
  HostDevice& operator=(const HostDevice&) = delete;
  DeviceKind kind() const override { return DeviceKind::host; }
  std::string description() const override;
  bool guards_scope_memory() const override { return guard_; }
  std::optional<std::uint64_t> free_device_bytes() const override;
  std::unique_ptr<Stream> create_stream(std::string name) override;
  std::unique_ptr<Event> create_event() override;
  void copy_async(BufferView dst, ConstBufferView src, Stream& stream) override;
  const kernels::KernelBackend& kernels() const override;

 protected:
  void* do_allocate(std::size_t size_bytes, MemoryKind kind, MemCategory category) override;
  void do_free(void* ptr, std::size_t size_bytes, MemoryKind kind, MemCategory category) noexcept override;

 private:
  void reserve_device_bytes(std::size_t size_bytes);
  // A new block of `rounded` bytes (large ones 2 MiB-aligned plus a stagger, advised for huge pages), or
  // null; free_fresh gives one back.
  void* allocate_fresh(std::size_t rounded, MemoryKind kind);
  static void free_fresh(void* ptr, std::size_t rounded) noexcept;
  void* take_cached(std::size_t rounded);
  void release_cache() noexcept;
  HostDeviceOptions options_;
  bool guard_ = false;                               // scope memory guarded (scope_guard.hpp)
  std::atomic<std::size_t> device_bytes_in_use_{0};  // requested bytes of device kind, for the cap
  // Freed device-kind blocks by rounded size, reused by the next allocation of that size, as the CUDA
  // device's stream-ordered pool keeps its freed blocks: gathers and gradient buffers allocate and free
  // the same sizes every step, and memory fresh from the OS costs a page fault and a page clear per page
  // on first touch. An allocation the OS refuses empties the cache and retries.
  std::mutex cache_mutex_;
  std::unordered_map<std::size_t, std::vector<void*>> device_cache_;
  std::atomic<std::size_t> next_stagger_{0};  // large buffers' start offsets rotate (device_host.cpp)
};

}  // namespace zero3
