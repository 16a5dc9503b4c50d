#include "device_host.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>
#include <system_error>

#include "scope_guard.hpp"
#include "zero3/core/env.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/core/trace.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3 {

// ---------------------------------------------------------------- events

void HostMarker::complete() {
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  cv_.notify_all();
}

void HostMarker::wait() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return done_; });
}

bool HostMarker::done() {
  std::lock_guard lock(mutex_);
  return done_;
}

std::shared_ptr<HostMarker> HostEvent::begin_record() {
  auto marker = std::make_shared<HostMarker>();
  std::lock_guard lock(mutex_);
  latest_ = marker;
  return marker;
}

std::shared_ptr<HostMarker> HostEvent::latest() {
  std::lock_guard lock(mutex_);
  return latest_;
}

bool HostEvent::query() {
  std::shared_ptr<HostMarker> marker = latest();
  return marker == nullptr || marker->done();
}

void HostEvent::synchronize() {
  if (std::shared_ptr<HostMarker> marker = latest()) marker->wait();
}

// ---------------------------------------------------------------- streams

namespace {
HostEvent& as_host_event(Event& event, std::string_view stream_name) {
  auto* host_event = dynamic_cast<HostEvent*>(&event);
  ZERO3_CHECK(host_event != nullptr,
              fmt::format("host stream '{}' was given an event of another backend", stream_name));
  return *host_event;
}
}  // namespace

HostStream::HostStream(Device& device, std::string name)
    : device_(device), name_(std::move(name)), worker_([this] { run(); }) {}

HostStream::~HostStream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  worker_.join();
  if (error_ && !error_reported_) {
    try {
      std::rethrow_exception(error_);
    } catch (const std::exception& e) {
      try {
        log::warn("host stream '{}' destroyed with an unreported error: {}", name_, e.what());
      } catch (...) {  // a destructor never throws
      }
    } catch (...) {
    }
  }
}

void HostStream::enqueue(Task task) {
  {
    std::lock_guard lock(mutex_);
    ZERO3_CHECK(!stopping_, "work enqueued on a stream that is being destroyed");
    queue_.push_back(std::move(task));
    ++submitted_;
  }
  work_cv_.notify_one();
}

void HostStream::run() {
  {
    std::lock_guard lock(mutex_);
    worker_id_ = std::this_thread::get_id();
  }
  for (;;) {
    Task task;
    bool skip = false;
    {
      std::unique_lock lock(mutex_);
      work_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      skip = error_ != nullptr && !task.always_run;
    }
    std::exception_ptr failure;
    if (!skip) {
      const std::int64_t began = task.trace_track.empty() ? -1 : trace::now_us();
      try {
        // Host functions may touch guarded scope memory; ordering markers touch none.
        const detail::scope_guard::StreamWork work(!task.always_run && detail::scope_guard::enabled());
        task.fn();
      } catch (...) {
        failure = std::current_exception();
      }
      if (began >= 0) trace::span(task.trace_track, std::move(task.trace_name), began, trace::now_us());
    }
    // Destroy the task's captures (possibly the last owner of a Buffer) before the task counts as
    // done, so a caller returning from synchronize() sees their effects, e.g. the memory accounting.
    task.fn = nullptr;
    {
      std::lock_guard lock(mutex_);
      if (failure && !error_) error_ = failure;
      ++completed_;
    }
    done_cv_.notify_all();
  }
}

void HostStream::record(Event& event) {
  std::shared_ptr<HostMarker> marker = as_host_event(event, name_).begin_record();
  enqueue({[marker] { marker->complete(); }, true, {}, {}});
}

void HostStream::wait(Event& event) {
  std::shared_ptr<HostMarker> marker = as_host_event(event, name_).latest();
  if (marker == nullptr || marker->done()) return;  // never recorded or already reached: nothing to wait for
  enqueue({[marker] { marker->wait(); }, true, {}, {}});
}

void HostStream::synchronize() {
  std::unique_lock lock(mutex_);
  ZERO3_CHECK(worker_id_ != std::this_thread::get_id(),
              fmt::format("synchronize() of host stream '{}' called from its own host function", name_));
  const std::uint64_t target = submitted_;
  done_cv_.wait(lock, [&] { return completed_ >= target; });
  if (error_) {
    error_reported_ = true;
    std::rethrow_exception(error_);
  }
}

void HostStream::launch_host(std::function<void()> fn) {
  launch_host_on_track(std::move(fn), name_);
}

void HostStream::launch_host_on_track(std::function<void()> fn, std::string_view track) {
  ZERO3_CHECK(fn != nullptr, "launch_host: empty function");
  Task task{std::move(fn), false, {}, {}};
  if (trace::enabled()) {
    task.trace_track = track;
    task.trace_name = trace::current_label();
    if (task.trace_name.empty()) task.trace_name = "work";
  }
  enqueue(std::move(task));
}

// ---------------------------------------------------------------- device

namespace {
// HostDeviceOptions::guard_scope_memory, or the environment's ZERO3_GUARD_SCOPE_MEMORY when unset.
bool guard_requested(const HostDeviceOptions& options) {
  if (options.guard_scope_memory) return *options.guard_scope_memory;
  const std::optional<std::string> value = env::get(env::kGuardScopeMemory);
  if (!value || value->empty() || *value == "0") return false;
  if (*value == "1") return true;
  throw ConfigError(fmt::format("{}: expected 1 (guard on) or 0 (off), got \"{}\"", env::kGuardScopeMemory, *value));
}
}  // namespace

HostDevice::HostDevice(const HostDeviceOptions& options) : options_(options), guard_(guard_requested(options)) {
  if (guard_) detail::scope_guard::enable();
}

std::string HostDevice::description() const {
  const std::string guard = guard_ ? ", scope memory guarded" : "";
  if (options_.capacity_bytes) {
    return fmt::format("host (simulated device, capacity {} bytes{})", *options_.capacity_bytes, guard);
  }
  return fmt::format("host (simulated device{})", guard);
}

std::unique_ptr<Stream> HostDevice::create_stream(std::string name) {
  return std::make_unique<HostStream>(*this, std::move(name));
}

std::unique_ptr<Event> HostDevice::create_event() {
  return std::make_unique<HostEvent>();
}

void HostDevice::copy_async(BufferView dst, ConstBufferView src, Stream& stream) {
  ZERO3_CHECK(&stream.device() == this,
              fmt::format("copy_async: stream '{}' belongs to another device", stream.name()));
  ZERO3_CHECK(dst.dtype == src.dtype,
              fmt::format("copy_async: dtype mismatch (dst {}, src {})", dtype_name(dst.dtype), dtype_name(src.dtype)));
  ZERO3_CHECK(dst.count == src.count,
              fmt::format("copy_async: count mismatch (dst {} elements, src {} elements)", dst.count, src.count));
  if (dst.count == 0) return;
  auto copy = [dst, src] { std::memcpy(dst.data, src.data, src.size_bytes()); };
  if (!trace::enabled()) {
    stream.launch_host(std::move(copy));
    return;
  }
  const trace::Label what(
      fmt::format("copy {} -> {}, {} bytes", memory_kind_name(src.kind), memory_kind_name(dst.kind), src.size_bytes()));
  // Copies of each stream on a track of their own: they run in that stream's order, so spans never cross.
  static_cast<HostStream&>(stream).launch_host_on_track(std::move(copy), fmt::format("copies ({})", stream.name()));
}

const kernels::KernelBackend& HostDevice::kernels() const {
  return kernels::host_backend();
}

namespace {
constexpr std::size_t kAlignment = 256;

// Pinned buffers are whole pages: mlock/munlock work on pages and do not nest, so two buffers sharing
// a page would unlock each other's memory on free.
std::size_t alignment_for(MemoryKind kind) {
  if (kind != MemoryKind::pinned_host) return kAlignment;
  static const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page > kAlignment ? page : kAlignment;
}

// Large host buffers are allocated from a 2 MiB boundary and advised for transparent huge pages: the CPU
// optimizer and the copies stream through them, and with 4 KiB pages each stream misses the TLB every
// 4 KiB. Where THP is "madvise" (Debian's default) only advised memory gets huge pages; the kernel backs
// every whole 2 MiB extent of the range with one, so the size is not rounded up (a tail keeps 4 KiB pages).
constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;
constexpr std::size_t kHugePageMinBytes = 2 * kHugePageBytes;

// They do not all start at the same offset within their 2 MiB: successive large buffers start 0, 1, ..., 6
// steps of 260 KiB past the boundary. Streams at equal offsets (a step's master, moments, gradients and params,
// indexed alike) contend for the same DRAM banks: an AdamW pass over four 2 MiB-aligned arrays measured
// 1.67-1.71 Gparam/s where staggered ones measured 2.15-2.2, and up to 3.6 (this VM, 2 threads, 100M
// params, five fresh allocations each). A multiple of the page, so pinned buffers stay whole pages; less
// than 2 MiB, so the boundary below a buffer is its allocation's start.
constexpr std::size_t kStaggerStep = (std::size_t{256} << 10) + 4096;
constexpr std::size_t kStaggerSlots = 7;
static_assert((kStaggerSlots - 1) * kStaggerStep < kHugePageBytes);

bool huge(std::size_t size_bytes) {
  return size_bytes >= kHugePageMinBytes;
}

std::size_t rounded_size(std::size_t size_bytes, std::size_t alignment) {
  return (size_bytes + alignment - 1) / alignment * alignment;
}

std::string memlock_limit_text() {
  rlimit lim{};
  if (getrlimit(RLIMIT_MEMLOCK, &lim) != 0) return "unknown";
  if (lim.rlim_cur == RLIM_INFINITY) return "unlimited";
  return fmt::format("{} bytes", static_cast<unsigned long long>(lim.rlim_cur));
}
}  // namespace

std::optional<std::uint64_t> HostDevice::free_device_bytes() const {
  if (!options_.capacity_bytes) return std::nullopt;
  return *options_.capacity_bytes - std::min<std::size_t>(device_bytes_in_use_.load(), *options_.capacity_bytes);
}

// Device-kind bytes count against the capacity cap before anything is allocated.
void HostDevice::reserve_device_bytes(std::size_t size_bytes) {
  if (!options_.capacity_bytes) {
    device_bytes_in_use_.fetch_add(size_bytes);
    return;
  }
  std::size_t in_use = device_bytes_in_use_.load();
  do {
    if (size_bytes > *options_.capacity_bytes - std::min(in_use, *options_.capacity_bytes)) {
      throw OutOfMemory(
          fmt::format("host device out of memory: cannot allocate {} bytes of device memory ({} of {} bytes in use)",
                      size_bytes, in_use, *options_.capacity_bytes));
    }
  } while (!device_bytes_in_use_.compare_exchange_weak(in_use, in_use + size_bytes));
}

void* HostDevice::do_allocate(std::size_t size_bytes, MemoryKind kind, MemCategory category) {
  const std::size_t alignment = alignment_for(kind);
  if (size_bytes > std::numeric_limits<std::size_t>::max() - alignment) {
    throw OutOfMemory(fmt::format("host device: cannot allocate {} bytes of {} memory (size overflows)", size_bytes,
                                  memory_kind_name(kind)));
  }
  if (kind == MemoryKind::device) reserve_device_bytes(size_bytes);
  const std::size_t rounded = rounded_size(size_bytes, alignment);
  void* p = nullptr;
  if (guard_ && detail::scope_guard::guards(kind, category)) {
    try {
      p = detail::scope_guard::allocate(size_bytes, category);
    } catch (...) {
      device_bytes_in_use_.fetch_sub(size_bytes);
      throw;
    }
  } else {
    if (kind == MemoryKind::device) p = take_cached(rounded);
    if (p == nullptr) p = allocate_fresh(rounded, kind);
  }
  if (p == nullptr) {
    if (kind == MemoryKind::device) device_bytes_in_use_.fetch_sub(size_bytes);
    throw OutOfMemory(
        fmt::format("host device: allocation of {} bytes of {} memory failed", size_bytes, memory_kind_name(kind)));
  }
  if (kind == MemoryKind::pinned_host && options_.lock_pinned && mlock(p, rounded) != 0) {
    const int err = errno;
    free_fresh(p, rounded);
    throw OutOfMemory(fmt::format(
        "host device: cannot pin {} bytes of host memory: mlock failed ({}); the memlock limit (ulimit -l) is {}; "
        "raise it or create the device with lock_pinned = false",
        size_bytes, std::generic_category().message(err), memlock_limit_text()));
  }
  return p;
}

void* HostDevice::allocate_fresh(std::size_t rounded, MemoryKind kind) {
  const bool large = huge(rounded);
  const std::size_t stagger = large ? (next_stagger_.fetch_add(1) % kStaggerSlots) * kStaggerStep : 0;
  const std::size_t total = rounded + stagger;
  const std::size_t start = large ? kHugePageBytes : alignment_for(kind);
  void* base = nullptr;
  if (posix_memalign(&base, start, total) != 0 && kind == MemoryKind::device) {
    release_cache();
    if (posix_memalign(&base, start, total) != 0) base = nullptr;
  }
  if (base == nullptr) return nullptr;
  // Before the first touch (and before mlock faults the pages in), so the faults allocate huge pages.
  // Advice only: without THP the buffer keeps 4 KiB pages.
  if (large) (void)madvise(base, total, MADV_HUGEPAGE);
  return static_cast<std::byte*>(base) + stagger;
}

// A large buffer's allocation starts at the 2 MiB boundary below it (its stagger is less than 2 MiB).
void HostDevice::free_fresh(void* ptr, std::size_t rounded) noexcept {
  if (huge(rounded)) {
    auto* p = static_cast<std::byte*>(ptr);
    ptr = p - reinterpret_cast<std::uintptr_t>(p) % kHugePageBytes;
  }
  std::free(ptr);
}

void HostDevice::do_free(void* ptr, std::size_t size_bytes, MemoryKind kind, MemCategory category) noexcept {
  if (kind == MemoryKind::pinned_host && options_.lock_pinned) {
    munlock(ptr, rounded_size(size_bytes, alignment_for(kind)));
  }
  if (kind == MemoryKind::device) device_bytes_in_use_.fetch_sub(size_bytes);
  if (guard_ && detail::scope_guard::guards(kind, category)) {
    detail::scope_guard::release(ptr, size_bytes);
    return;
  }
  if (kind == MemoryKind::device) {
    try {
      const std::lock_guard<std::mutex> lock(cache_mutex_);
      device_cache_[rounded_size(size_bytes, alignment_for(kind))].push_back(ptr);
      return;
    } catch (...) {  // no memory for the cache's own bookkeeping: give the block back instead
    }
  }
  free_fresh(ptr, rounded_size(size_bytes, alignment_for(kind)));
}

void* HostDevice::take_cached(std::size_t rounded) {
  const std::lock_guard<std::mutex> lock(cache_mutex_);
  const auto it = device_cache_.find(rounded);
  if (it == device_cache_.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  return p;
}

void HostDevice::release_cache() noexcept {
  const std::lock_guard<std::mutex> lock(cache_mutex_);
  for (auto& [rounded, blocks] : device_cache_) {
    for (void* p : blocks) free_fresh(p, rounded);
  }
  device_cache_.clear();
}

HostDevice::~HostDevice() {
  release_cache();
}

std::unique_ptr<Device> make_host_device(const HostDeviceOptions& options) {
  return std::make_unique<HostDevice>(options);
}

}  // namespace zero3
