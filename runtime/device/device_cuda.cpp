// CUDA backend. Allocation design (docs/device.md has the long form):
// - device memory comes from a private cudaMemPool through cudaMallocFromPoolAsync on an internal
//   stream (alloc_stream_) that runs nothing else, followed by a synchronize of that stream, so
//   allocate() is host-blocking and its pointer is ready for any stream;
// - free is cudaFreeAsync on the same internal stream: stream-ordered only there, so it relies on the
//   Buffer contract (the owner keeps a buffer until the work that uses it has completed). The memory
//   may be handed to the very next allocate(), exactly as on the host backend;
// - frees that happen inside a host function (a Buffer captured by launch_host's closure), where CUDA
//   calls are forbidden, are queued and returned at the next allocate() or stream synchronize().
#include "device_cuda.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <limits>

#include "zero3/kernels/kernels.hpp"

namespace zero3 {

namespace {

constexpr std::size_t kAlignment = 256;

// True while this thread runs one of our host functions (a CUDA callback thread).
thread_local bool tls_in_host_fn = false;

// Makes `ordinal` current for the scope and restores the caller's device afterwards, so a thread that
// drives two GPUs is not silently switched.
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    int current = -1;
    ZERO3_CUDA_CHECK(cudaGetDevice(&current));
    if (current != ordinal) {
      ZERO3_CUDA_CHECK(cudaSetDevice(ordinal));
      previous_ = current;
    }
  }
  struct NoThrow {};
  DeviceScope(int ordinal, NoThrow) noexcept {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) {
      (void)cudaGetLastError();
      current = -1;
    }
    if (current != ordinal) {
      ZERO3_CUDA_CHECK_NOTHROW(cudaSetDevice(ordinal));
      previous_ = current;
    }
  }
  ~DeviceScope() {
    if (previous_ >= 0) ZERO3_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

std::string cuda_error_text(cudaError_t err) {
  return fmt::format("{} ({})", cudaGetErrorName(err), cudaGetErrorString(err));
}

// One launch_host call in flight: owned by the callback once enqueued.
struct HostCall {
  std::function<void()> fn;
  std::shared_ptr<CudaHostFnState> state;
};

void CUDART_CB run_host_call(void* user_data) {
  tls_in_host_fn = true;
  {
    std::unique_ptr<HostCall> call(static_cast<HostCall*>(user_data));
    bool failed;
    {
      std::lock_guard lock(call->state->mutex);
      failed = call->state->error != nullptr;
    }
    if (!failed) {  // sticky: once a host function failed, later ones on the stream are skipped
      try {
        call->fn();
      } catch (...) {
        std::lock_guard lock(call->state->mutex);
        if (!call->state->error) call->state->error = std::current_exception();
      }
    }
  }  // the closure's captures die here, with any Buffer frees deferred (see CudaDevice::do_free)
  tls_in_host_fn = false;
}

CudaEvent& as_cuda_event(Event& event, std::string_view stream_name) {
  auto* cuda_event = dynamic_cast<CudaEvent*>(&event);
  ZERO3_CHECK(cuda_event != nullptr,
              fmt::format("cuda stream '{}' was given an event of another backend", stream_name));
  return *cuda_event;
}

}  // namespace

// ---------------------------------------------------------------- events

CudaEvent::CudaEvent(CudaDevice& device) : device_(device) {
  DeviceScope scope(device_.ordinal());
  ZERO3_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
}

CudaEvent::~CudaEvent() {
  DeviceScope scope(device_.ordinal(), DeviceScope::NoThrow{});
  ZERO3_CUDA_CHECK_NOTHROW(cudaEventDestroy(event_));
}

bool CudaEvent::query() {
  const cudaError_t err = cudaEventQuery(event_);
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error: keep it out of later checks
    return false;
  }
  (void)cudaGetLastError();
  throw CudaError(fmt::format("cudaEventQuery on cuda:{} failed: {}", device_.ordinal(), cuda_error_text(err)));
}

void CudaEvent::synchronize() {
  ZERO3_CUDA_CHECK(cudaEventSynchronize(event_));
}

// ---------------------------------------------------------------- streams

CudaStream::CudaStream(CudaDevice& device, std::string name) : device_(device), name_(std::move(name)) {
  DeviceScope scope(device_.ordinal());
  ZERO3_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

CudaStream::~CudaStream() {
  DeviceScope scope(device_.ordinal(), DeviceScope::NoThrow{});
  ZERO3_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(stream_));  // drain, as the host backend does
  ZERO3_CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream_));
  std::exception_ptr error;
  {
    std::lock_guard lock(host_fn_state_->mutex);
    if (!host_fn_state_->reported) error = host_fn_state_->error;
  }
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      try {
        log::warn("cuda stream '{}' destroyed with an unreported error: {}", name_, e.what());
      } catch (...) {
      }
    } catch (...) {
    }
  }
  device_.drain_deferred_frees();
}

Device& CudaStream::device() {
  return device_;
}

const kernels::KernelBackend& CudaStream::kernels() const {
  return device_.kernels();
}

void CudaStream::record(Event& event) {
  CudaEvent& cuda_event = as_cuda_event(event, name_);
  ZERO3_CHECK(&cuda_event.device() == &device_,
              fmt::format("cuda stream '{}' cannot record an event created on another device", name_));
  ZERO3_CUDA_CHECK(cudaEventRecord(cuda_event.handle(), stream_));
}

void CudaStream::wait(Event& event) {
  // An event of another GPU is fine here: cudaStreamWaitEvent orders across devices.
  ZERO3_CUDA_CHECK(cudaStreamWaitEvent(stream_, as_cuda_event(event, name_).handle(), 0));
}

void CudaStream::synchronize() {
  ZERO3_CHECK(!tls_in_host_fn, fmt::format("synchronize() of cuda stream '{}' called from a host function", name_));
  ZERO3_CUDA_CHECK(cudaStreamSynchronize(stream_));
  device_.drain_deferred_frees();
  std::lock_guard lock(host_fn_state_->mutex);
  if (host_fn_state_->error) {
    host_fn_state_->reported = true;
    std::rethrow_exception(host_fn_state_->error);
  }
}

void CudaStream::launch_host(std::function<void()> fn) {
  ZERO3_CHECK(fn != nullptr, "launch_host: empty function");
  auto call = std::make_unique<HostCall>(HostCall{std::move(fn), host_fn_state_});
  ZERO3_CUDA_CHECK(cudaLaunchHostFunc(stream_, run_host_call, call.get()));
  static_cast<void>(call.release());  // run_host_call owns it now
}

// ---------------------------------------------------------------- device

CudaDevice::CudaDevice(int ordinal) : ordinal_(ordinal) {
  DeviceScope scope(ordinal_);
  cudaDeviceProp prop{};
  ZERO3_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal_));
  total_bytes_ = prop.totalGlobalMem;
  int pools_supported = 0;
  ZERO3_CUDA_CHECK(cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported, ordinal_));
  if (pools_supported == 0) {
    throw CudaError(
        fmt::format("cuda:{} ({}) does not support stream-ordered memory pools, which zero3 allocates "
                    "device memory from; a newer driver may enable them",
                    ordinal_, prop.name));
  }
  description_ = fmt::format("cuda:{} {} (sm_{}{}, {} bytes, PCI bus {:02x})", ordinal_, prop.name, prop.major,
                             prop.minor, prop.totalGlobalMem, prop.pciBusID);
  pci_bus_id_ = fmt::format("{:04x}:{:02x}:{:02x}.0", prop.pciDomainID, prop.pciBusID, prop.pciDeviceID);

  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = ordinal_;
  ZERO3_CUDA_CHECK(cudaMemPoolCreate(&pool_, &props));
  try {
    // Keep freed blocks cached in the pool instead of unmapping them at every synchronization:
    // gathers allocate and free the same sizes every step. An allocation that fails trims and retries.
    std::uint64_t keep_all = std::numeric_limits<std::uint64_t>::max();
    ZERO3_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_all));
    ZERO3_CUDA_CHECK(cudaStreamCreateWithFlags(&alloc_stream_, cudaStreamNonBlocking));
  } catch (...) {
    ZERO3_CUDA_CHECK_NOTHROW(cudaMemPoolDestroy(pool_));
    throw;
  }
}

CudaDevice::~CudaDevice() {
  DeviceScope scope(ordinal_, DeviceScope::NoThrow{});
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    if (const std::size_t left = memory().total(kind).current_bytes; left != 0) {
      try {
        log::warn("cuda:{} destroyed while {} bytes of {} memory are still allocated; those Buffers now dangle",
                  ordinal_, left, memory_kind_name(kind));
      } catch (...) {
      }
    }
  }
  drain_deferred_frees();
  ZERO3_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(alloc_stream_));
  ZERO3_CUDA_CHECK_NOTHROW(cudaStreamDestroy(alloc_stream_));
  // With allocations still outstanding the driver releases the pool once they are freed.
  ZERO3_CUDA_CHECK_NOTHROW(cudaMemPoolDestroy(pool_));
}

std::unique_ptr<Stream> CudaDevice::create_stream(std::string name) {
  return std::make_unique<CudaStream>(*this, std::move(name));
}

std::unique_ptr<Event> CudaDevice::create_event() {
  return std::make_unique<CudaEvent>(*this);
}

void CudaDevice::copy_async(BufferView dst, ConstBufferView src, Stream& stream) {
  auto* cuda_stream = dynamic_cast<CudaStream*>(&stream);
  ZERO3_CHECK(cuda_stream != nullptr && &cuda_stream->device() == this,
              fmt::format("copy_async: stream '{}' does not belong to cuda:{}", stream.name(), ordinal_));
  ZERO3_CHECK(dst.dtype == src.dtype,
              fmt::format("copy_async: dtype mismatch (dst {}, src {})", dtype_name(dst.dtype), dtype_name(src.dtype)));
  ZERO3_CHECK(dst.count == src.count,
              fmt::format("copy_async: count mismatch (dst {} elements, src {} elements)", dst.count, src.count));
  if (dst.count == 0) return;
  DeviceScope scope(ordinal_);
  // cudaMemcpyDefault infers the direction from the pointers (unified addressing). Pageable host memory
  // makes the copy partly synchronous with the host: the driver stages it through its own buffer.
  ZERO3_CUDA_CHECK(cudaMemcpyAsync(dst.data, src.data, src.size_bytes(), cudaMemcpyDefault, cuda_stream->handle()));
}

const kernels::KernelBackend& CudaDevice::kernels() const {
  return kernels::cuda_backend();
}

std::optional<std::uint64_t> CudaDevice::free_device_bytes() const {
  DeviceScope scope(ordinal_);
  std::size_t free = 0;
  std::size_t total = 0;
  ZERO3_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  std::uint64_t reserved = 0;
  std::uint64_t used = 0;
  if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
    (void)cudaGetLastError();
    reserved = used = 0;
  }
  return std::uint64_t{free} + (reserved > used ? reserved - used : 0);
}

std::string CudaDevice::pool_usage_text() {
  std::uint64_t reserved = 0;
  std::uint64_t used = 0;
  if (cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReservedMemCurrent, &reserved) != cudaSuccess ||
      cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemCurrent, &used) != cudaSuccess) {
    (void)cudaGetLastError();
    return "zero3's pool usage is unknown";
  }
  return fmt::format("zero3's pool holds {} bytes, {} of them in use", reserved, used);
}

void* CudaDevice::allocate_device_memory(std::size_t size_bytes) {
  DeviceScope scope(ordinal_);
  drain_deferred_frees();
  void* p = nullptr;
  cudaError_t err = cudaErrorMemoryAllocation;
  if (size_bytes <= total_bytes_) {  // larger than the GPU can never succeed; some drivers say "invalid value"
    err = cudaMallocFromPoolAsync(&p, size_bytes, pool_, alloc_stream_);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: keep it out of the next check
      // Give cached free blocks back to the driver (they may be fragmented or wanted elsewhere), retry once.
      ZERO3_CUDA_CHECK(cudaStreamSynchronize(alloc_stream_));
      ZERO3_CUDA_CHECK(cudaMemPoolTrimTo(pool_, 0));
      err = cudaMallocFromPoolAsync(&p, size_bytes, pool_, alloc_stream_);
    }
    if (err != cudaSuccess) (void)cudaGetLastError();
  }
  if (err == cudaErrorMemoryAllocation) {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    std::string gpu_text = "free/total unknown";
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
      gpu_text = fmt::format("{} of {} bytes free", free_bytes, total_bytes);
    } else {
      (void)cudaGetLastError();
    }
    throw OutOfMemory(fmt::format(
        "cuda:{} out of memory: cannot allocate {} bytes of device memory ({}; {}; zero3 accounts {} bytes of "
        "device memory in use)",
        ordinal_, size_bytes, gpu_text, pool_usage_text(), memory().total(MemoryKind::device).current_bytes));
  }
  if (err != cudaSuccess) {
    throw CudaError(fmt::format("cudaMallocFromPoolAsync of {} bytes on cuda:{} failed: {}", size_bytes, ordinal_,
                                cuda_error_text(err)));
  }
  // allocate() is host-blocking: once the internal stream has reached the allocation, any stream may use it.
  ZERO3_CUDA_CHECK(cudaStreamSynchronize(alloc_stream_));
  if (reinterpret_cast<std::uintptr_t>(p) % kAlignment != 0) {
    release_now(p, MemoryKind::device);
    throw CudaError(fmt::format("cudaMallocFromPoolAsync returned {} which is not {}-byte aligned", p, kAlignment));
  }
  return p;
}

void* CudaDevice::allocate_pinned(std::size_t size_bytes) {
  DeviceScope scope(ordinal_);
  drain_deferred_frees();
  void* p = nullptr;
  // Portable: usable from every context, so a pinned buffer is not tied to the device that made it.
  const cudaError_t err = cudaHostAlloc(&p, size_bytes, cudaHostAllocPortable);
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    throw OutOfMemory(fmt::format(
        "cuda:{}: cannot allocate {} bytes of pinned host memory (zero3 accounts {} bytes of pinned memory in use); "
        "lower the pinned budget or free host RAM",
        ordinal_, size_bytes, memory().total(MemoryKind::pinned_host).current_bytes));
  }
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw CudaError(fmt::format("cudaHostAlloc of {} bytes failed: {}", size_bytes, cuda_error_text(err)));
  }
  return p;
}

void* CudaDevice::do_allocate(std::size_t size_bytes, MemoryKind kind, MemCategory /*category*/) {
  ZERO3_CHECK(!tls_in_host_fn, "Device::allocate called from a host function (CUDA calls are not allowed there)");
  switch (kind) {
    case MemoryKind::device:
      return allocate_device_memory(size_bytes);
    case MemoryKind::pinned_host:
      return allocate_pinned(size_bytes);
    case MemoryKind::pageable_host:
      break;
  }
  void* p = nullptr;
  if (size_bytes <= std::numeric_limits<std::size_t>::max() - kAlignment) {
    p = std::aligned_alloc(kAlignment, (size_bytes + kAlignment - 1) / kAlignment * kAlignment);
  }
  if (p == nullptr) {
    throw OutOfMemory(fmt::format("cuda:{}: cannot allocate {} bytes of pageable host memory", ordinal_, size_bytes));
  }
  return p;
}

void CudaDevice::release_now(void* ptr, MemoryKind kind) noexcept {
  DeviceScope scope(ordinal_, DeviceScope::NoThrow{});
  if (kind == MemoryKind::device) {
    // Ordered on the internal stream only: by the Buffer contract no other stream still uses ptr.
    ZERO3_CUDA_CHECK_NOTHROW(cudaFreeAsync(ptr, alloc_stream_));
  } else {
    ZERO3_CUDA_CHECK_NOTHROW(cudaFreeHost(ptr));
  }
}

void CudaDevice::do_free(void* ptr, std::size_t size_bytes, MemoryKind kind, MemCategory /*category*/) noexcept {
  if (kind == MemoryKind::pageable_host) {
    std::free(ptr);
    return;
  }
  if (tls_in_host_fn) {  // no CUDA calls inside a host function: hand it back later
    try {
      std::lock_guard lock(deferred_mutex_);
      deferred_frees_.emplace_back(ptr, kind);
    } catch (...) {
      try {
        log::error("cuda:{}: leaked {} bytes of {} memory freed in a host function (out of host memory)", ordinal_,
                   size_bytes, memory_kind_name(kind));
      } catch (...) {
      }
    }
    return;
  }
  release_now(ptr, kind);
}

void CudaDevice::drain_deferred_frees() noexcept {
  if (tls_in_host_fn) return;
  std::vector<std::pair<void*, MemoryKind>> frees;
  {
    std::lock_guard lock(deferred_mutex_);
    frees.swap(deferred_frees_);
  }
  for (const auto& [ptr, kind] : frees) release_now(ptr, kind);
}

// ---------------------------------------------------------------- entry points

int cuda_device_count() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {  // no driver, no device, or a driver too old for this runtime
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    throw Error(
        fmt::format("cannot open CUDA device {}: cudaGetDeviceCount failed: {}; is the NVIDIA driver "
                    "installed and a GPU visible to this process?",
                    ordinal, cuda_error_text(err)));
  }
  if (ordinal < 0 || ordinal >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");  // NOLINT(concurrency-mt-unsafe): not written by zero3
    throw Error(fmt::format("CUDA device {} does not exist: {} device(s) visible (CUDA_VISIBLE_DEVICES={})", ordinal,
                            count, visible != nullptr ? visible : "<unset>"));
  }
  return std::make_unique<CudaDevice>(ordinal);
}

bool built_with_cuda() {
  return true;
}

}  // namespace zero3
