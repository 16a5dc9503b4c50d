// The host backend as the test bed for ordering bugs: streams must be genuinely asynchronous, events
// must order work across streams, errors must be sticky without hanging anyone, and allocation must
// honour the capacity cap and page-lock pinned memory; the scope-memory guard must let stream work
// through and stop the host thread (in forked children) with a message naming the fix.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <latch>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/device/device.hpp"

using namespace zero3;
using namespace std::chrono_literals;
using Catch::Matchers::Contains;

namespace {

constexpr MemoryKind kAllKinds[] = {MemoryKind::device, MemoryKind::pinned_host, MemoryKind::pageable_host};
constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16};

std::uint32_t fresh_seed() {
  std::random_device rd;
  return rd();
}

void fill_random(void* p, std::size_t size_bytes, std::mt19937& rng) {
  auto* bytes = static_cast<unsigned char*>(p);
  std::uniform_int_distribution<int> dist(0, 255);
  for (std::size_t i = 0; i < size_bytes; ++i) bytes[i] = static_cast<unsigned char>(dist(rng));
}

// Locked memory of this process in kB, from /proc (what mlock really did).
long locked_kb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// The sanitizers' runtimes turn mlock/munlock into no-ops, so VmLck cannot be checked under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kMlockIsReal = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kMlockIsReal = false;
#else
constexpr bool kMlockIsReal = true;
#endif
#else
constexpr bool kMlockIsReal = true;
#endif
constexpr bool kSanitized = !kMlockIsReal;  // the same detection

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

TEST_CASE("host stream: launch_host does not block the caller and runs in order", "[device][host]") {
  auto dev = make_host_device();
  auto s = dev->create_stream("compute");
  CHECK(s->name() == "compute");
  CHECK(&s->device() == dev.get());
  CHECK(s->native_handle() == nullptr);
  CHECK(dev->kind() == DeviceKind::host);

  std::latch gate(1);
  std::atomic<bool> ran{false};
  s->launch_host([&] {
    gate.wait();
    ran = true;
  });
  // The caller got here although the task cannot have finished: it is blocked on the gate.
  std::this_thread::sleep_for(20ms);
  CHECK_FALSE(ran.load());
  gate.count_down();
  s->synchronize();
  CHECK(ran.load());

  std::vector<int> order;  // touched only by the worker until synchronize() returns
  for (int i = 0; i < 1000; ++i) s->launch_host([&order, i] { order.push_back(i); });
  s->synchronize();
  REQUIRE(order.size() == 1000);
  for (int i = 0; i < 1000; ++i) REQUIRE(order[static_cast<std::size_t>(i)] == i);
}

TEST_CASE("host stream: launch_host from many threads is serialized", "[device][host]") {
  auto dev = make_host_device();
  auto s = dev->create_stream("shared");
  long counter = 0;  // plain: only the worker increments it
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) s->launch_host([&counter] { ++counter; });
    });
  }
  for (auto& t : threads) t.join();
  s->synchronize();
  CHECK(counter == 4000);
}

TEST_CASE("host streams: unordered unless joined by an event", "[device][host]") {
  auto dev = make_host_device();
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");

  SECTION("without an event, b does not wait for a") {
    std::latch gate(1);
    std::atomic<bool> a_done{false};
    a->launch_host([&] {
      gate.wait();
      a_done = true;
    });
    std::atomic<bool> b_saw_a{true};
    b->launch_host([&] { b_saw_a = a_done.load(); });
    b->synchronize();  // returns while a is still blocked
    CHECK_FALSE(b_saw_a.load());
    gate.count_down();
    a->synchronize();
  }

  SECTION("record on a, wait on b: b observes a's write, every time") {
    auto ev = dev->create_event();
    std::mt19937 rng(fresh_seed());
    std::uniform_int_distribution<int> delay_us(0, 300);
    // A plain int: the event is the only thing ordering the write before the read (TSan checks it too).
    int value = -1;
    std::vector<int> observed;
    for (int i = 0; i < 300; ++i) {
      const int d = (i % 10 == 0) ? delay_us(rng) : 0;
      a->launch_host([&value, i, d] {
        if (d > 0) std::this_thread::sleep_for(std::chrono::microseconds(d));
        value = i;
      });
      a->record(*ev);
      b->wait(*ev);
      b->launch_host([&value, &observed] { observed.push_back(value); });
      // Keep a from overwriting value before b has read it: the reverse edge.
      b->record(*ev);
      a->wait(*ev);
    }
    b->synchronize();
    a->synchronize();
    REQUIRE(observed.size() == 300);
    for (int i = 0; i < 300; ++i) REQUIRE(observed[static_cast<std::size_t>(i)] == i);
  }
}

TEST_CASE("host events: query and synchronize", "[device][host]") {
  auto dev = make_host_device();
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");
  auto ev = dev->create_event();

  SECTION("a never recorded event is complete") {
    CHECK(ev->query());
    ev->synchronize();  // returns at once
    b->wait(*ev);       // waits for nothing
    std::atomic<bool> ran{false};
    b->launch_host([&] { ran = true; });
    b->synchronize();
    CHECK(ran.load());
  }

  SECTION("recorded behind blocked work: not complete until the work is") {
    std::latch gate(1);
    std::atomic<bool> done{false};
    a->launch_host([&] {
      gate.wait();
      done = true;
    });
    a->record(*ev);
    std::this_thread::sleep_for(10ms);
    CHECK_FALSE(ev->query());
    gate.count_down();
    ev->synchronize();
    CHECK(done.load());  // synchronize() returned only after the recorded work
    CHECK(ev->query());
  }

  SECTION("re-record: query follows the latest record, an earlier wait keeps its own") {
    std::latch gate(1);
    std::atomic<bool> a_done{false};
    a->launch_host([&] {
      gate.wait();
      a_done = true;
    });
    a->record(*ev);  // record 1: behind the blocked task
    auto c = dev->create_stream("c");
    c->wait(*ev);  // captures record 1
    std::atomic<bool> c_saw_a{false};
    std::atomic<bool> c_ran{false};
    c->launch_host([&] {
      c_saw_a = a_done.load();
      c_ran = true;
    });
    b->record(*ev);  // record 2: on an idle stream
    b->synchronize();
    CHECK(ev->query());  // the latest record (on b) is complete although a is still blocked
    std::this_thread::sleep_for(10ms);
    CHECK_FALSE(c_ran.load());  // c still waits for record 1
    gate.count_down();
    c->synchronize();
    CHECK(c_ran.load());
    CHECK(c_saw_a.load());
    a->synchronize();
  }

  SECTION("an event recorded again after completion refers to the new work") {
    a->record(*ev);
    a->synchronize();
    CHECK(ev->query());
    std::latch gate(1);
    a->launch_host([&] { gate.wait(); });
    a->record(*ev);
    CHECK_FALSE(ev->query());
    gate.count_down();
    ev->synchronize();
    CHECK(ev->query());
  }
}

TEST_CASE("host stream: host-function errors are sticky and nobody hangs", "[device][host]") {
  auto dev = make_host_device();
  auto a = dev->create_stream("a");
  auto b = dev->create_stream("b");
  auto ev = dev->create_event();

  std::atomic<int> ran_after{0};
  a->launch_host([] { throw CommError("first failure"); });
  a->launch_host([] { throw std::runtime_error("second failure"); });
  a->launch_host([&] { ++ran_after; });  // skipped: the stream has failed
  a->record(*ev);                        // markers still run
  b->wait(*ev);
  std::atomic<bool> b_ran{false};
  b->launch_host([&] { b_ran = true; });
  b->synchronize();  // would hang if a's marker had been skipped
  CHECK(b_ran.load());
  ev->synchronize();
  CHECK(ev->query());

  CHECK_THROWS_WITH(a->synchronize(), "first failure");
  CHECK_THROWS_AS(a->synchronize(), CommError);  // still failed, same error, same type
  a->launch_host([&] { ++ran_after; });
  CHECK_THROWS_AS(a->synchronize(), CommError);
  CHECK(ran_after.load() == 0);

  // Copies are stream work too: skipped on a failed stream.
  auto src = dev->allocate(4, DType::f32, MemoryKind::pageable_host, MemCategory::workspace);
  auto dst = dev->allocate(4, DType::f32, MemoryKind::pageable_host, MemCategory::workspace);
  for (int i = 0; i < 4; ++i) src.view().as<float>()[i] = 1.0f + static_cast<float>(i);
  for (int i = 0; i < 4; ++i) dst.view().as<float>()[i] = -7.0f;
  dev->copy_async(dst.view(), src.cview(), *a);
  CHECK_THROWS_AS(a->synchronize(), CommError);
  CHECK(dst.view().as<float>()[0] == -7.0f);

  // Destroying a failed stream does not throw; one whose error nobody saw logs it (a warning).
  CHECK_NOTHROW(a.reset());
  auto unseen = dev->create_stream("unseen");
  unseen->launch_host([] { throw std::runtime_error("nobody synchronized"); });
  CHECK_NOTHROW(unseen.reset());
}

TEST_CASE("host stream: synchronize from its own host function is a usage error", "[device][host]") {
  auto dev = make_host_device();
  auto s = dev->create_stream("self");
  Stream* raw = s.get();
  s->launch_host([raw] { raw->synchronize(); });
  CHECK_THROWS_AS(s->synchronize(), UsageError);
}

TEST_CASE("host stream: destruction drains queued work", "[device][host]") {
  auto dev = make_host_device();
  std::atomic<int> done{0};
  {
    auto s = dev->create_stream("drain");
    for (int i = 0; i < 50; ++i) {
      s->launch_host([&] {
        std::this_thread::sleep_for(100us);
        ++done;
      });
    }
  }  // no synchronize(): the destructor must run everything first
  CHECK(done.load() == 50);
}

TEST_CASE("host stream: a buffer owned by a host function is freed before synchronize returns", "[device][host]") {
  auto dev = make_host_device();
  auto s = dev->create_stream("owner");
  auto buf = std::make_shared<Buffer>(dev->allocate(1024, DType::f32, MemoryKind::device, MemCategory::staging));
  CHECK(dev->memory().total(MemoryKind::device).current_bytes == 4096);
  std::latch gate(1);
  s->launch_host([buf, &gate] { gate.wait(); });  // in-flight work keeps its buffer alive
  buf.reset();
  CHECK(dev->memory().total(MemoryKind::device).current_bytes == 4096);
  gate.count_down();
  s->synchronize();
  CHECK(dev->memory().total(MemoryKind::device).current_bytes == 0);
  CHECK(dev->memory().get(MemoryKind::device, MemCategory::staging).peak_bytes == 4096);
}

TEST_CASE("host device: copy_async between every pair of memory kinds", "[device][host]") {
  auto dev = make_host_device(HostDeviceOptions{.capacity_bytes = std::nullopt, .lock_pinned = false});
  auto s = dev->create_stream("copy");
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  for (DType dtype : kAllDTypes) {
    for (MemoryKind from : kAllKinds) {
      for (MemoryKind to : kAllKinds) {
        INFO(dtype_name(dtype) << " " << memory_kind_name(from) << " -> " << memory_kind_name(to));
        const std::size_t count = 1 + rng() % 5000;
        auto src = dev->allocate(count, dtype, from, MemCategory::workspace);
        auto dst = dev->allocate(count, dtype, to, MemCategory::workspace);
        fill_random(src.data(), src.size_bytes(), rng);
        std::memset(dst.data(), 0xA5, dst.size_bytes());  // poison: an unwritten byte fails
        dev->copy_async(dst.view(), src.cview(), *s);
        s->synchronize();
        REQUIRE(std::memcmp(dst.data(), src.data(), src.size_bytes()) == 0);

        // A slice lands exactly where it should and nowhere else.
        if (count >= 3) {
          const std::size_t off = 1;
          const std::size_t n = count - 2;
          std::memset(dst.data(), 0x5A, dst.size_bytes());
          dev->copy_async(dst.view().slice(off, n), src.cview().slice(off, n), *s);
          s->synchronize();
          const std::size_t es = size_of(dtype);
          const auto* d = static_cast<const unsigned char*>(dst.data());
          const auto* sp = static_cast<const unsigned char*>(src.data());
          for (std::size_t i = 0; i < es; ++i) REQUIRE(d[i] == 0x5A);
          REQUIRE(std::memcmp(d + off * es, sp + off * es, n * es) == 0);
          for (std::size_t i = (count - 1) * es; i < count * es; ++i) REQUIRE(d[i] == 0x5A);
        }
      }
    }
  }
  // Zero elements: nothing to do, and fine.
  dev->copy_async(BufferView{nullptr, 0, DType::f32, MemoryKind::device},
                  ConstBufferView{nullptr, 0, DType::f32, MemoryKind::device}, *s);
  s->synchronize();
}

TEST_CASE("host device: copy_async rejects mismatched views and foreign streams", "[device][host]") {
  auto dev = make_host_device();
  auto other = make_host_device();
  auto s = dev->create_stream("copy");
  auto other_stream = other->create_stream("other");
  auto f32 = dev->allocate(8, DType::f32, MemoryKind::device, MemCategory::workspace);
  auto f32_short = dev->allocate(7, DType::f32, MemoryKind::device, MemCategory::workspace);
  auto bf16 = dev->allocate(16, DType::bf16, MemoryKind::device, MemCategory::workspace);  // same bytes as f32

  CHECK_THROWS_AS(dev->copy_async(bf16.view(), f32.cview(), *s), UsageError);
  CHECK_THROWS_WITH(dev->copy_async(bf16.view(), f32.cview(), *s), Catch::Contains("dtype mismatch"));
  CHECK_THROWS_AS(dev->copy_async(f32_short.view(), f32.cview(), *s), UsageError);
  CHECK_THROWS_WITH(dev->copy_async(f32_short.view(), f32.cview(), *s), Catch::Contains("count mismatch"));
  CHECK_THROWS_AS(dev->copy_async(f32.view(), f32.cview(), *other_stream), UsageError);
  CHECK_NOTHROW(s->synchronize());  // rejected calls enqueued nothing
}

TEST_CASE("host device: capacity cap", "[device][host]") {
  constexpr std::size_t kCap = 1 << 20;
  auto dev = make_host_device(HostDeviceOptions{.capacity_bytes = kCap, .lock_pinned = false});
  CHECK_THAT(dev->description(), Catch::Contains("1048576"));

  auto first = dev->allocate(150 * 1024, DType::f32, MemoryKind::device, MemCategory::param_shard);  // 600 KiB
  try {
    auto second = dev->allocate(150 * 1024, DType::f32, MemoryKind::device, MemCategory::param_shard);
    FAIL("allocation beyond the cap succeeded");
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("614400"));   // requested bytes
    CHECK_THAT(msg, Catch::Contains("1048576"));  // the cap
    CHECK_THAT(msg, Catch::Contains("device"));
  }
  // A failed allocation accounts nothing.
  CHECK(dev->memory().total(MemoryKind::device).current_bytes == 614400);

  // Host kinds are not capped.
  auto host = dev->allocate(kCap, DType::f32, MemoryKind::pageable_host, MemCategory::staging);
  auto pinned = dev->allocate(kCap / 4, DType::f32, MemoryKind::pinned_host, MemCategory::staging);

  // Exactly up to the cap is fine; one element more is not.
  auto rest = dev->allocate((kCap - 614400) / 2, DType::bf16, MemoryKind::device, MemCategory::workspace);
  CHECK_THROWS_AS(dev->allocate(1, DType::bf16, MemoryKind::device, MemCategory::workspace), OutOfMemory);

  // Freeing makes room again.
  first.reset();
  rest.reset();
  auto again = dev->allocate(kCap / 4, DType::f32, MemoryKind::device, MemCategory::param_shard);
  CHECK(again.size_bytes() == kCap);
}

TEST_CASE("host device: concurrent allocation never exceeds the cap", "[device][host]") {
  constexpr std::size_t kCap = 5 * 4096;  // each thread wants 8 x 4 KiB at once: always at the cap
  auto dev = make_host_device(HostDeviceOptions{.capacity_bytes = kCap, .lock_pinned = false});
  std::atomic<int> failures{0};
  std::atomic<bool> over_cap{false};  // Catch assertions are not thread-safe: collect, check after join
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 200; ++round) {
        std::vector<Buffer> held;
        for (int i = 0; i < 8; ++i) {
          try {
            held.push_back(dev->allocate(1024, DType::f32, MemoryKind::device, MemCategory::workspace));
          } catch (const OutOfMemory&) {
            ++failures;
          }
          if (dev->memory().total(MemoryKind::device).current_bytes > kCap) over_cap = true;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK_FALSE(over_cap.load());
  CHECK(failures.load() > 0);
  CHECK(dev->memory().total(MemoryKind::device).current_bytes == 0);
  CHECK(dev->memory().total(MemoryKind::device).peak_bytes <= kCap);
}

TEST_CASE("host device: alignment of every kind", "[device][host]") {
  auto dev = make_host_device(HostDeviceOptions{.capacity_bytes = std::nullopt, .lock_pinned = false});
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  for (MemoryKind kind : kAllKinds) {
    for (std::size_t count : {1, 3, 255, 1000, 4097}) {
      auto b = dev->allocate(count, DType::bf16, kind, MemCategory::workspace);
      const auto addr = reinterpret_cast<std::uintptr_t>(b.data());
      CHECK(addr % 256 == 0);
      if (kind == MemoryKind::pinned_host) CHECK(addr % page == 0);
    }
  }
}

TEST_CASE("host device: pinned memory is page-locked", "[device][host]") {
  SECTION("lock_pinned = true") {
    auto dev = make_host_device();
    rlimit lim{};
    getrlimit(RLIMIT_MEMLOCK, &lim);
    const bool can_lock = geteuid() == 0 || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= (4u << 20);
    if (!can_lock) {
      // Beyond the memlock limit: a clear OutOfMemory naming the limit.
      try {
        auto b = dev->allocate(lim.rlim_cur + (1u << 20), DType::bf16, MemoryKind::pinned_host, MemCategory::staging);
        FAIL("pinned allocation beyond the memlock limit succeeded");
      } catch (const OutOfMemory& e) {
        CHECK_THAT(std::string(e.what()), Catch::Contains("ulimit -l"));
      }
      return;
    }
    const long before = locked_kb();
    REQUIRE(before >= 0);
    // Two small buffers: with page-granular locking each keeps its own pages locked.
    auto a = dev->allocate(250, DType::f32, MemoryKind::pinned_host, MemCategory::staging);
    auto b = dev->allocate(250, DType::f32, MemoryKind::pinned_host, MemCategory::staging);
    auto big = dev->allocate(1 << 20, DType::f32, MemoryKind::pinned_host, MemCategory::staging);
    CHECK(reinterpret_cast<std::uintptr_t>(a.data()) / 4096 != reinterpret_cast<std::uintptr_t>(b.data()) / 4096);
    if (kMlockIsReal) CHECK(locked_kb() - before >= 4096 + 8);
    big.reset();
    a.reset();
    if (kMlockIsReal) CHECK(locked_kb() - before >= 4);  // b is still locked after a's pages were unlocked
    std::memset(b.data(), 1, b.size_bytes());
    b.reset();
    if (kMlockIsReal) CHECK(locked_kb() == before);
  }

  SECTION("lock_pinned = false") {
    auto dev = make_host_device(HostDeviceOptions{.capacity_bytes = std::nullopt, .lock_pinned = false});
    const long before = locked_kb();
    auto b = dev->allocate(1 << 20, DType::f32, MemoryKind::pinned_host, MemCategory::staging);
    std::memset(b.data(), 1, b.size_bytes());
    CHECK(locked_kb() == before);
    CHECK(b.kind() == MemoryKind::pinned_host);
    CHECK(dev->memory().total(MemoryKind::pinned_host).current_bytes == (4u << 20));
  }
}

TEST_CASE("host device: many streams and many tiny tasks, no spinning", "[device][host]") {
  auto dev = make_host_device();
  constexpr int kStreams = 16;
  constexpr int kTasks = 10000;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Event>> events;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(dev->create_stream("s" + std::to_string(i)));
    events.push_back(dev->create_event());
  }
  std::vector<long> counters(kStreams, 0);  // each touched by one stream's worker only

  const auto start = std::chrono::steady_clock::now();
  for (int t = 0; t < kTasks; ++t) {
    const int i = t % kStreams;
    streams[static_cast<std::size_t>(i)]->launch_host([&counters, i] { ++counters[static_cast<std::size_t>(i)]; });
    if (t % 97 == 0) {  // sprinkle cross-stream edges
      const int j = (i + 1) % kStreams;
      streams[static_cast<std::size_t>(i)]->record(*events[static_cast<std::size_t>(i)]);
      streams[static_cast<std::size_t>(j)]->wait(*events[static_cast<std::size_t>(i)]);
    }
  }
  for (auto& s : streams) s->synchronize();
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  long total = 0;
  for (long c : counters) total += c;
  CHECK(total == kTasks);
  CHECK(wall_s < 20.0);  // generous for sanitizer builds on 2 shared cores; typically milliseconds

  // Idle workers and workers blocked on an event sleep: over 300 ms the process burns little CPU.
  std::latch gate(1);
  streams[0]->launch_host([&] { gate.wait(); });
  streams[0]->record(*events[0]);
  for (int i = 1; i < kStreams; i += 2) streams[static_cast<std::size_t>(i)]->wait(*events[0]);
  const double cpu_before = process_cpu_seconds();
  std::this_thread::sleep_for(300ms);
  const double cpu_used = process_cpu_seconds() - cpu_before;
  gate.count_down();
  for (auto& s : streams) s->synchronize();
  INFO("CPU seconds used while idle: " << cpu_used);
  CHECK(cpu_used < 0.15);
}

// ---- the scope-memory guard (HostDeviceOptions::guard_scope_memory, ZERO3_GUARD_SCOPE_MEMORY)

namespace {

struct ChildOutcome {
  bool signaled = false;
  int signal = 0;
  int exit_code = -1;
  std::string err;  // what the child wrote to stderr
};

// Runs `fn` in a forked child (stdout discarded, stderr captured) that exits 0 when `fn` returns.
template <typename Fn>
ChildOutcome run_in_child(Fn&& fn) {
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    ::dup2(pipe_fds[1], STDERR_FILENO);
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) ::dup2(null_fd, STDOUT_FILENO);
    try {
      fn();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child threw: %s\n", e.what());
      std::fflush(stderr);
      ::_exit(3);
    }
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  ChildOutcome out;
  char chunk[4096];
  for (ssize_t n = 0; (n = ::read(pipe_fds[0], chunk, sizeof chunk)) > 0;)
    out.err.append(chunk, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  out.signaled = WIFSIGNALED(status);
  out.signal = out.signaled ? WTERMSIG(status) : 0;
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

HostDeviceOptions guarded(std::optional<bool> on) {
  HostDeviceOptions o;
  o.lock_pinned = false;
  o.guard_scope_memory = on;
  return o;
}

// A host-thread access to a scope buffer of `category` after the stream finished its work with it.
void touch_after_synchronize(Device& dev, MemCategory category) {
  Buffer b = dev.allocate(1000, DType::f32, MemoryKind::device, category);
  auto s = dev.create_stream("compute");
  s->launch_host([&b] { b.view().as<float>()[7] = 3.0f; });  // stream work: allowed
  s->synchronize();
  volatile float* p = b.view().as<float>();
  p[7] = p[7] + 1.0f;  // the host thread, outside stream work
}

}  // namespace

TEST_CASE("scope-memory guard: stream work reads and writes scope memory and gets the unguarded numbers",
          "[device][host][guard]") {
  constexpr std::size_t kN = 3000;  // not a whole number of pages
  std::vector<float> in(kN);
  for (std::size_t i = 0; i < kN; ++i) in[i] = static_cast<float>(i) * 0.25f - 100.0f;
  std::vector<std::vector<float>> results;
  for (const bool guard : {false, true}) {
    auto dev = make_host_device(guarded(guard));
    CHECK((dev->description().find("scope memory guarded") != std::string::npos) == guard);
    Buffer params = dev->allocate(kN, DType::f32, MemoryKind::device, MemCategory::param_gathered);
    Buffer grads = dev->allocate(kN, DType::f32, MemoryKind::device, MemCategory::grad_buffer);
    Buffer shard = dev->allocate(kN, DType::f32, MemoryKind::device, MemCategory::param_shard);
    if (guard)
      CHECK(reinterpret_cast<std::uintptr_t>(params.data()) % static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE)) == 0);
    std::memcpy(shard.data(), in.data(), kN * sizeof(float));  // not scope memory: the host thread may touch it
    auto compute = dev->create_stream("compute");
    auto comm = dev->create_stream("comm");
    auto gathered = dev->create_event();
    comm->launch_host([] { std::this_thread::sleep_for(5ms); });  // the gather lands late
    dev->copy_async(params.view(), shard.cview(), *comm);
    comm->record(*gathered);
    compute->wait(*gathered);
    compute->launch_host([&] {
      const float* p = params.view().as<float>();
      float* g = grads.view().as<float>();
      for (std::size_t i = 0; i < kN; ++i) g[i] = 2.0f * p[i] + 1.0f;
    });
    std::vector<float> out(kN);
    dev->copy_async(BufferView{out.data(), kN, DType::f32, MemoryKind::pageable_host}, grads.cview(), *compute);
    compute->synchronize();
    comm->synchronize();
    results.push_back(out);
  }
  REQUIRE(results.size() == 2);
  CHECK(results[0] == results[1]);
  CHECK(results[1][10] == 2.0f * in[10] + 1.0f);
}

TEST_CASE("scope-memory guard: the host thread touching scope memory outside stream work aborts with the fix",
          "[device][host][guard]") {
  if (kSanitized) {  // sanitizer runtimes own SIGSEGV and forked children; the plain builds check this
    WARN("skipped under a sanitizer");
    return;
  }
  const std::string what = "zero3: the host thread touched device memory of the host backend outside stream work";
  {
    const ChildOutcome c = run_in_child([] {
      auto dev = make_host_device(guarded(true));
      touch_after_synchronize(*dev, MemCategory::param_gathered);
    });
    INFO(c.err);
    CHECK(c.signaled);
    CHECK(c.signal == SIGABRT);
    CHECK_THAT(c.err, Contains(what) && Contains("is in a gathered param (Engine::GatherScope::param) of 4000 bytes") &&
                          Contains("enqueue host compute with Stream::launch_host; see docs/engine.md"));
  }
  {
    const ChildOutcome c = run_in_child([] {
      auto dev = make_host_device(guarded(true));
      touch_after_synchronize(*dev, MemCategory::grad_buffer);
    });
    INFO(c.err);
    CHECK(c.signal == SIGABRT);
    CHECK_THAT(c.err, Contains(what) && Contains("is in a gradient buffer (Engine::GradScope::grad)"));
  }
  {  // the environment variable turns it on when the options leave it unset
    const ChildOutcome c = run_in_child([] {
      ::setenv("ZERO3_GUARD_SCOPE_MEMORY", "1", 1);  // NOLINT(concurrency-mt-unsafe): a single-threaded child
      auto dev = make_host_device(guarded(std::nullopt));
      touch_after_synchronize(*dev, MemCategory::param_gathered);
    });
    INFO(c.err);
    CHECK(c.signal == SIGABRT);
    CHECK_THAT(c.err, Contains(what));
  }
  {  // off: the same access goes unnoticed (what the guard exists for); other memory is never guarded
    const ChildOutcome c = run_in_child([] {
      ::setenv("ZERO3_GUARD_SCOPE_MEMORY", "1", 1);  // NOLINT(concurrency-mt-unsafe): a single-threaded child
      auto off = make_host_device(guarded(false));
      touch_after_synchronize(*off, MemCategory::param_gathered);
      auto on = make_host_device(guarded(true));
      touch_after_synchronize(*on, MemCategory::param_shard);
      touch_after_synchronize(*on, MemCategory::activations);
    });
    INFO(c.err);
    CHECK(!c.signaled);
    CHECK(c.exit_code == 0);
  }
  {  // a fault elsewhere is still an ordinary SIGSEGV, without the guard's message
    const ChildOutcome c = run_in_child([] {
      auto dev = make_host_device(guarded(true));
      void* page = ::mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      volatile int* p = static_cast<int*>(page);
      *p = 1;
    });
    INFO(c.err);
    CHECK(c.signal == SIGSEGV);
    CHECK(c.err.find(what) == std::string::npos);
  }
}

// NOLINTBEGIN(concurrency-mt-unsafe): no other thread runs between test cases
TEST_CASE("scope-memory guard: ZERO3_GUARD_SCOPE_MEMORY accepts 1 and 0 only", "[device][host][guard]") {
  ::setenv("ZERO3_GUARD_SCOPE_MEMORY", "yes", 1);
  CHECK_THROWS_WITH(make_host_device(),
                    Contains("ZERO3_GUARD_SCOPE_MEMORY: expected 1 (guard on) or 0 (off), got \"yes\""));
  ::setenv("ZERO3_GUARD_SCOPE_MEMORY", "0", 1);
  CHECK(make_host_device()->description().find("guarded") == std::string::npos);
  ::unsetenv("ZERO3_GUARD_SCOPE_MEMORY");
  CHECK(make_host_device()->description().find("guarded") == std::string::npos);
}
// NOLINTEND(concurrency-mt-unsafe)
