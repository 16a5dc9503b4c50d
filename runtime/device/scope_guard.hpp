// The host backend's scope-memory guard (HostDeviceOptions::guard_scope_memory, ZERO3_GUARD_SCOPE_MEMORY=1;
// docs/device.md): gathered params and gradient buffers (MemCategory::param_gathered, grad_buffer) of a
// guarded host device get pages of their own (mmap), kept PROT_NONE whenever no host-stream work runs
// anywhere in the process. The first HostStream task to start unprotects every guarded region, the last to
// finish protects them again; a SIGSEGV inside a guarded region (the host thread touched scope memory
// outside stream work) prints what happened and how to fix it, and aborts. Process-wide; private to
// device/.
//
// What it catches: an access while no stream work runs (the host thread reading a scope pointer after
// synchronize(), or before the stream reached the gather). An access made while some other stream's work
// happens to run slips through: mprotect applies to the whole process, not to one thread.
#pragma once

#include <atomic>
#include <cstddef>

#include "zero3/core/memory.hpp"

namespace zero3::detail::scope_guard {

// Whether the guard is on in this process (a guarded host device was made). Never turned off again.
bool enabled() noexcept;
// Turns the guard on (installs the SIGSEGV handler once).
void enable();

// Whether `category` is scope memory, which a guarded device allocates through allocate().
constexpr bool guards(MemoryKind kind, MemCategory category) {
  return kind == MemoryKind::device &&
         (category == MemCategory::param_gathered || category == MemCategory::grad_buffer);
}

// Page-aligned memory of its own pages, inaccessible while no stream work runs. Throws OutOfMemory.
void* allocate(std::size_t size_bytes, MemCategory category);
void release(void* ptr, std::size_t size_bytes) noexcept;

// Host-stream work: while one lives (on any thread), guarded memory is accessible. `counted` false: a
// no-op (the guard is off, or the task touches no memory: event records and waits).
class StreamWork {
 public:
  explicit StreamWork(bool counted);
  ~StreamWork();
  StreamWork(const StreamWork&) = delete;
  StreamWork& operator=(const StreamWork&) = delete;

 private:
  bool counted_;
};

}  // namespace zero3::detail::scope_guard
