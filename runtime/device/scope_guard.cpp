#include "scope_guard.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <system_error>

#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::detail::scope_guard {
namespace {

// One guarded region. The SIGSEGV handler reads the slots without a lock (async-signal-safe): `begin` is
// written last when a region is registered and cleared first when it goes.
struct Slot {
  std::atomic<std::uintptr_t> begin{0};
  std::atomic<std::size_t> mapped{0};  // bytes mapped: whole pages
  std::atomic<std::size_t> bytes{0};   // bytes asked for
  std::atomic<MemCategory> category{MemCategory::param_gathered};
};

constexpr std::size_t kSlots = std::size_t{1} << 14;  // live guarded buffers at once
Slot g_slots[kSlots];
std::atomic<std::size_t> g_slot_end{0};  // slots [0, end) may be in use
std::atomic<bool> g_enabled{false};

std::mutex g_mutex;              // registration, g_running and every protection change
int g_running = 0;               // host-stream tasks running now, on all streams
struct sigaction g_previous {};  // the SIGSEGV action before ours (faults outside guarded memory go there)

std::size_t page_size() {
  static const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

std::size_t mapped_size(std::size_t size_bytes) {
  const std::size_t page = page_size();
  return (size_bytes + page - 1) / page * page;
}

// Every registered region to `prot`. Requires g_mutex. 0, or the first failure's errno.
int protect_all(int prot) {
  int failure = 0;
  const std::size_t end = g_slot_end.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < end; ++i) {
    const std::uintptr_t begin = g_slots[i].begin.load(std::memory_order_relaxed);
    if (begin == 0) continue;
    // NOLINTNEXTLINE(performance-no-int-to-ptr): the slot holds the address mmap returned
    if (mprotect(reinterpret_cast<void*>(begin), g_slots[i].mapped.load(std::memory_order_relaxed), prot) != 0 &&
        failure == 0) {
      failure = errno;
    }
  }
  return failure;
}

// ---- the fault report: async-signal-safe (no allocation, no locks, no stdio)

class Message {
 public:
  void add(const char* text) {
    for (; *text != '\0' && used_ < sizeof(text_); ++text) text_[used_++] = *text;
  }
  void add_hex(std::uintptr_t v) {
    char digits[2 * sizeof v];
    std::size_t n = 0;
    do {
      digits[n++] = "0123456789abcdef"[v & 0xf];
      v >>= 4;
    } while (v != 0);
    add("0x");
    while (n > 0 && used_ < sizeof(text_)) text_[used_++] = digits[--n];
  }
  void add_dec(std::size_t v) {
    char digits[24];
    std::size_t n = 0;
    do {
      digits[n++] = static_cast<char>('0' + v % 10);
      v /= 10;
    } while (v != 0);
    while (n > 0 && used_ < sizeof(text_)) text_[used_++] = digits[--n];
  }
  void write_to(int fd) const {
    std::size_t done = 0;
    while (done < used_) {
      const ssize_t n = ::write(fd, text_ + done, used_ - done);
      if (n <= 0) return;
      done += static_cast<std::size_t>(n);
    }
  }

 private:
  char text_[1024] = {};
  std::size_t used_ = 0;
};

[[noreturn]] void report_and_abort(std::uintptr_t address, const Slot& slot) {
  const bool grad = slot.category.load(std::memory_order_relaxed) == MemCategory::grad_buffer;
  Message m;
  m.add("zero3: the host thread touched device memory of the host backend outside stream work: address ");
  m.add_hex(address);
  m.add(grad ? " is in a gradient buffer (Engine::GradScope::grad) of "
             : " is in a gathered param (Engine::GatherScope::param) of ");
  m.add_dec(slot.bytes.load(std::memory_order_relaxed));
  m.add(" bytes at ");
  m.add_hex(slot.begin.load(std::memory_order_relaxed));
  m.add(
      ". Scope pointers are device memory, valid only for work enqueued on compute_stream() (on CUDA the host "
      "cannot read them at all): enqueue host compute with Stream::launch_host; see docs/engine.md. (Found by the "
      "scope-memory guard, ZERO3_GUARD_SCOPE_MEMORY=1; docs/device.md.)\n");
  m.write_to(STDERR_FILENO);
  std::signal(SIGABRT, SIG_DFL);  // a test framework's SIGABRT handler must not mask what happened
  std::abort();
}

void on_fault(int sig, siginfo_t* info, void* context) {
  const auto address = reinterpret_cast<std::uintptr_t>(info->si_addr);
  const std::size_t end = g_slot_end.load(std::memory_order_acquire);
  for (std::size_t i = 0; i < end; ++i) {
    const std::uintptr_t begin = g_slots[i].begin.load(std::memory_order_acquire);
    if (begin != 0 && address >= begin && address - begin < g_slots[i].mapped.load(std::memory_order_relaxed)) {
      report_and_abort(address, g_slots[i]);
    }
  }
  // Not guarded memory: what would have happened without the guard.
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
    return;
  }
  if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != nullptr) {
    g_previous.sa_handler(sig);
    return;
  }
  std::signal(SIGSEGV, SIG_DFL);  // returning re-executes the access, which now kills the process as usual
}

// Requires g_mutex. Installs on_fault unless it is the SIGSEGV action already (a test framework may have
// replaced it since).
void install_handler() {
  struct sigaction current {};
  sigaction(SIGSEGV, nullptr, &current);
  if ((current.sa_flags & SA_SIGINFO) != 0 && current.sa_sigaction == on_fault) return;
  struct sigaction action {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGSEGV, &action, &g_previous) != 0) {
    throw Error(fmt::format("scope-memory guard: cannot install the SIGSEGV handler: {}",
                            std::generic_category().message(errno)));
  }
}

Slot& free_slot() {  // requires g_mutex
  const std::size_t end = g_slot_end.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < end; ++i) {
    if (g_slots[i].begin.load(std::memory_order_relaxed) == 0) return g_slots[i];
  }
  if (end == kSlots) {
    throw OutOfMemory(fmt::format("scope-memory guard: more than {} guarded buffers at once", kSlots));
  }
  g_slot_end.store(end + 1, std::memory_order_release);
  return g_slots[end];
}

}  // namespace

bool enabled() noexcept {
  return g_enabled.load(std::memory_order_relaxed);
}

void enable() {
  std::lock_guard lock(g_mutex);
  install_handler();
  g_enabled.store(true);
}

void* allocate(std::size_t size_bytes, MemCategory category) {
  const std::size_t mapped = mapped_size(size_bytes);
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    throw OutOfMemory(fmt::format("host device: cannot map {} bytes of guarded device memory: {}", size_bytes,
                                  std::generic_category().message(errno)));
  }
  std::lock_guard lock(g_mutex);
  try {
    install_handler();
    Slot& slot = free_slot();
    if (g_running == 0 && mprotect(p, mapped, PROT_NONE) != 0) {
      throw Error(fmt::format("scope-memory guard: mprotect failed: {}", std::generic_category().message(errno)));
    }
    slot.mapped.store(mapped, std::memory_order_relaxed);
    slot.bytes.store(size_bytes, std::memory_order_relaxed);
    slot.category.store(category, std::memory_order_relaxed);
    slot.begin.store(reinterpret_cast<std::uintptr_t>(p), std::memory_order_release);
  } catch (...) {
    munmap(p, mapped);
    throw;
  }
  return p;
}

void release(void* ptr, std::size_t size_bytes) noexcept {
  std::lock_guard lock(g_mutex);
  const auto begin = reinterpret_cast<std::uintptr_t>(ptr);
  const std::size_t end = g_slot_end.load(std::memory_order_relaxed);
  for (std::size_t i = 0; i < end; ++i) {
    if (g_slots[i].begin.load(std::memory_order_relaxed) == begin) {
      g_slots[i].begin.store(0, std::memory_order_release);
      break;
    }
  }
  munmap(ptr, mapped_size(size_bytes));
}

StreamWork::StreamWork(bool counted) : counted_(counted) {
  if (!counted_) return;
  std::lock_guard lock(g_mutex);
  if (g_running++ == 0) {
    if (const int err = protect_all(PROT_READ | PROT_WRITE); err != 0) {
      --g_running;
      counted_ = false;
      throw Error(
          fmt::format("scope-memory guard: cannot unprotect guarded memory: {}", std::generic_category().message(err)));
    }
  }
}

StreamWork::~StreamWork() {
  if (!counted_) return;
  std::lock_guard lock(g_mutex);
  if (--g_running == 0) {
    if (const int err = protect_all(PROT_NONE); err != 0) {
      try {
        log::error("scope-memory guard: cannot protect guarded memory: {}", std::generic_category().message(err));
      } catch (...) {  // a destructor never throws
      }
    }
  }
}

}  // namespace zero3::detail::scope_guard
