// CUDA backend: one CudaDevice per GPU ordinal, non-blocking streams, timing-free events, device memory
// from a private stream-ordered pool, pinned host memory from cudaHostAlloc. Private to runtime/device:
// the only file set that includes cuda_runtime.h for the device layer. Any host thread may call in;
// entry points that need a current device make this one current for the call and restore the caller's.
#pragma once

#include <cuda_runtime.h>

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/device/device.hpp"
#include "zero3_cuda_check.hpp"  // ZERO3_CUDA_CHECK(_NOTHROW), from zero3_cuda_common

namespace zero3 {

class CudaDevice;

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(CudaDevice& device);
  ~CudaEvent() override;
  bool query() override;
  void synchronize() override;
  cudaEvent_t handle() const { return event_; }
  CudaDevice& device() const { return device_; }

 private:
  CudaDevice& device_;
  cudaEvent_t event_ = nullptr;
};

// First error raised by a host function of one stream. Shared with the host-function payloads still
// queued on the stream, so it outlives a stream destroyed with work in flight.
struct CudaHostFnState {
  std::mutex mutex;
  std::exception_ptr error;
  bool reported = false;  // synchronize() rethrew it at least once
};

class CudaStream final : public Stream {
 public:
  CudaStream(CudaDevice& device, std::string name);
  ~CudaStream() override;  // drains the stream, then destroys it

  Device& device() override;
  DeviceKind device_kind() const override { return DeviceKind::cuda; }
  const kernels::KernelBackend& kernels() const override;
  std::string_view name() const override { return name_; }
  void record(Event& event) override;
  void wait(Event& event) override;
  void synchronize() override;
  void launch_host(std::function<void()> fn) override;
  void* native_handle() override { return stream_; }
  cudaStream_t handle() const { return stream_; }

 private:
  CudaDevice& device_;
  std::string name_;
  std::shared_ptr<CudaHostFnState> host_fn_state_ = std::make_shared<CudaHostFnState>();
  cudaStream_t stream_ = nullptr;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string description() const override { return description_; }
  std::optional<std::string> pci_bus_id() const override { return pci_bus_id_; }
  // cudaMemGetInfo's free memory plus what the device's pool holds unused (it hands that out first).
  std::optional<std::uint64_t> free_device_bytes() const override;
  std::unique_ptr<Stream> create_stream(std::string name) override;
  std::unique_ptr<Event> create_event() override;
  void copy_async(BufferView dst, ConstBufferView src, Stream& stream) override;
  const kernels::KernelBackend& kernels() const override;

  int ordinal() const { return ordinal_; }
  // Returns memory released from inside host functions (where CUDA calls are forbidden) to the pool.
  void drain_deferred_frees() noexcept;

 protected:
  void* do_allocate(std::size_t size_bytes, MemoryKind kind, MemCategory category) override;
  void do_free(void* ptr, std::size_t size_bytes, MemoryKind kind, MemCategory category) noexcept override;

 private:
  void* allocate_device_memory(std::size_t size_bytes);
  void* allocate_pinned(std::size_t size_bytes);
  void release_now(void* ptr, MemoryKind kind) noexcept;
  std::string pool_usage_text();

  int ordinal_;
  std::size_t total_bytes_ = 0;  // the GPU's memory: a larger request fails without asking the driver
  std::string description_;
  std::string pci_bus_id_;
  cudaMemPool_t pool_ = nullptr;
  // Where device memory is allocated and freed (stream-ordered), and nothing else runs; see do_free.
  cudaStream_t alloc_stream_ = nullptr;
  std::mutex deferred_mutex_;
  std::vector<std::pair<void*, MemoryKind>> deferred_frees_;
};

}  // namespace zero3
