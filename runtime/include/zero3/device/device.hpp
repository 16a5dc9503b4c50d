// Device and Buffer (with Stream and Event, zero3/core/stream.hpp): the narrow interface the engine uses for
// memory and ordering.
// Two backends: host (a simulated device in host memory whose streams are in-order queues run by
// their own worker threads, so ordering bugs show up on a CPU) and cuda. Every allocation goes
// through Device::allocate and is accounted in the device's MemoryTracker by kind and category.
// Streams and events may be used from any host thread; a Stream's methods are internally serialized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "zero3/core/buffer_view.hpp"
#include "zero3/core/memory.hpp"
#include "zero3/core/stream.hpp"

namespace zero3 {

// What a backend can do, as data, so callers decide by capability instead of by DeviceKind.
struct DeviceCaps {
  // Where host-side staging (scalars read back, values made on the host, tensors copied out) lives: pinned
  // where the device copies to and from the host asynchronously only out of page-locked memory (cuda);
  // pageable where "device" memory is host memory already (host).
  MemoryKind host_staging = MemoryKind::pinned_host;
  // Pinned-host memory is locked with mlock, and so bound by RLIMIT_MEMLOCK (host); cuda pins with
  // cudaHostAlloc, which that limit does not bind.
  bool pins_by_mlock = false;
  // Device-kind memory is addressable by host code and host libraries (MPI): true on the host backend.
  bool device_memory_on_host = false;
};
// The capabilities of a backend, for planning before any device exists (the memory plan).
DeviceCaps device_caps(DeviceKind kind);

// Move-only owner of one typed allocation; frees it (and updates the accounting) on destruction.
// The owner must keep a buffer alive until work that uses it has completed.
class Buffer {
 public:
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  ~Buffer();

  BufferView view() const { return {ptr_, count_, dtype_, kind_}; }
  ConstBufferView cview() const { return view(); }
  void* data() const { return ptr_; }
  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  std::size_t size_bytes() const { return count_ * size_of(dtype_); }
  MemoryKind kind() const { return kind_; }
  MemCategory category() const { return category_; }
  bool empty() const { return ptr_ == nullptr; }
  void reset() noexcept;

 private:
  friend class Device;
  Buffer(Device* owner, void* ptr, std::size_t count, DType dtype, MemoryKind kind, MemCategory cat)
      : owner_(owner), ptr_(ptr), count_(count), dtype_(dtype), kind_(kind), category_(cat) {}
  Device* owner_ = nullptr;
  void* ptr_ = nullptr;
  std::size_t count_ = 0;
  DType dtype_ = DType::f32;
  MemoryKind kind_ = MemoryKind::device;
  MemCategory category_ = MemCategory::workspace;
};

class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceKind kind() const = 0;
  DeviceCaps caps() const { return device_caps(kind()); }
  virtual std::string description() const = 0;
  // PCI bus id of the accelerator ("0000:3b:00.0"), for NUMA placement of its host buffers; nullopt for the
  // host backend.
  virtual std::optional<std::string> pci_bus_id() const { return std::nullopt; }
  // Whether host-thread access to scope memory (gathered params, gradient buffers) is trapped: the host
  // backend's debugging guard (HostDeviceOptions::guard_scope_memory). Code that would hand out other
  // memory in their place (the engine at world size 1) keeps the scope buffers while it is on.
  virtual bool guards_scope_memory() const { return false; }
  // Bytes of device memory an allocation could still get now (the memory plan's start-up check), or
  // nullopt where there is no limit to speak of (the host backend without a capacity).
  virtual std::optional<std::uint64_t> free_device_bytes() const { return std::nullopt; }

  virtual std::unique_ptr<Stream> create_stream(std::string name) = 0;
  virtual std::unique_ptr<Event> create_event() = 0;

  // Blocking (host-side allocation). `count` elements of `dtype` in memory of `kind`, accounted under
  // `category`. Throws OutOfMemory naming the request, the kind and what is in use. A zero count
  // returns an empty buffer. Alignment is at least 256 bytes.
  Buffer allocate(std::size_t count, DType dtype, MemoryKind kind, MemCategory category);

  // Non-blocking: copies src into dst in stream order. Views must have the same dtype and count; any
  // combination of memory kinds is allowed.
  virtual void copy_async(BufferView dst, ConstBufferView src, Stream& stream) = 0;

  // The element-wise kernels of this backend (kernels/).
  virtual const kernels::KernelBackend& kernels() const = 0;

  MemoryTracker& memory() { return memory_; }
  const MemoryTracker& memory() const { return memory_; }

 protected:
  // Raw allocation and release of `size_bytes` (> 0) of `kind`, for `category` (the host backend's scope
  // guard places gathered params and gradient buffers apart). do_allocate throws OutOfMemory.
  virtual void* do_allocate(std::size_t size_bytes, MemoryKind kind, MemCategory category) = 0;
  virtual void do_free(void* ptr, std::size_t size_bytes, MemoryKind kind, MemCategory category) noexcept = 0;

 private:
  friend class Buffer;
  void release(Buffer& b) noexcept;
  MemoryTracker memory_;
};

struct HostDeviceOptions {
  // Caps device-kind memory, so allocation fails like a full GPU. Unset: no cap.
  std::optional<std::size_t> capacity_bytes;
  // Pinned-host memory is page-locked (mlock). When locking fails (memlock limit), allocation throws
  // OutOfMemory naming the limit.
  bool lock_pinned = true;
  // Debugging: scope memory (gathered params, gradient buffers: what GatherScope::param and GradScope::grad
  // point to) is inaccessible while no stream work runs, and a host-thread access outside stream work
  // aborts with a message naming the buffer and the fix (docs/device.md). Slow. Unset: the environment
  // variable ZERO3_GUARD_SCOPE_MEMORY decides ("1" on, "0" or unset off).
  std::optional<bool> guard_scope_memory = std::nullopt;
};

std::unique_ptr<Device> make_host_device(const HostDeviceOptions& options = {});

// CUDA device `ordinal`. Throws Error when built without CUDA or when the device does not exist.
std::unique_ptr<Device> make_cuda_device(int ordinal);
// Number of usable CUDA devices; 0 when built without CUDA or when no driver/device is present.
int cuda_device_count();
// True when this build contains the CUDA backend.
bool built_with_cuda();

}  // namespace zero3
