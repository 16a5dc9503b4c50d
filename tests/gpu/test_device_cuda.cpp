// The CUDA device backend through the public API only (no CUDA headers), so it builds everywhere and
// runs where a GPU is (gpu_main skips with exit code 77 otherwise): allocation of every kind, copies,
// event ordering across streams, host functions and their errors, out-of-memory and accounting.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <latch>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/device/device.hpp"

using namespace zero3;
using namespace std::chrono_literals;

namespace {

constexpr MemoryKind kAllKinds[] = {MemoryKind::device, MemoryKind::pinned_host, MemoryKind::pageable_host};

std::uint32_t fresh_seed() {
  std::random_device rd;
  return rd();
}

void fill_random(void* p, std::size_t size_bytes, std::mt19937& rng) {
  auto* bytes = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < size_bytes; ++i) bytes[i] = static_cast<unsigned char>(rng());
}

bool host_accessible(MemoryKind k) {
  return k != MemoryKind::device;
}

}  // namespace

TEST_CASE("cuda device: identity and errors for devices that do not exist", "[gpu][device]") {
  REQUIRE(built_with_cuda());
  const int n = cuda_device_count();
  REQUIRE(n > 0);
  auto dev = make_cuda_device(0);
  CHECK(dev->kind() == DeviceKind::cuda);
  CHECK_THAT(dev->description(), Catch::Contains("cuda:0"));
  CHECK_THROWS_AS(make_cuda_device(n), Error);
  CHECK_THROWS_WITH(make_cuda_device(n), Catch::Contains("does not exist"));
  CHECK_THROWS_AS(make_cuda_device(-1), Error);
  auto s = dev->create_stream("compute");
  CHECK(s->native_handle() != nullptr);
  CHECK(&s->device() == dev.get());
  CHECK(s->name() == "compute");
}

TEST_CASE("cuda device: allocation of every kind is aligned and accounted", "[gpu][device]") {
  auto dev = make_cuda_device(0);
  MemoryTracker& mem = dev->memory();
  for (MemoryKind kind : kAllKinds) {
    INFO(memory_kind_name(kind));
    {
      std::vector<Buffer> held;
      std::size_t bytes = 0;
      for (std::size_t count : {1, 7, 1000, 1 << 20}) {
        held.push_back(dev->allocate(count, DType::bf16, kind, MemCategory::param_shard));
        bytes += count * 2;
        CHECK(reinterpret_cast<std::uintptr_t>(held.back().data()) % 256 == 0);
        CHECK(mem.get(kind, MemCategory::param_shard).current_bytes == bytes);
      }
      CHECK(mem.total(kind).current_bytes == bytes);
      auto empty = dev->allocate(0, DType::f32, kind, MemCategory::workspace);
      CHECK(empty.empty());
      CHECK(mem.get(kind, MemCategory::workspace).peak_bytes == 0);
    }
    CHECK(mem.total(kind).current_bytes == 0);
  }
  // Many allocate/free rounds are served by the pool quickly.
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 2000; ++i) {
    auto b = dev->allocate(4096 + static_cast<std::size_t>(i % 7) * 1024, DType::f32, MemoryKind::device,
                           MemCategory::param_gathered);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  INFO("2000 device allocate/free pairs took " << s << " s");
  CHECK(s < 2.0);
  CHECK(mem.total(MemoryKind::device).current_bytes == 0);
}

TEST_CASE("cuda device: copies round-trip through every pair of kinds", "[gpu][device]") {
  auto dev = make_cuda_device(0);
  auto s = dev->create_stream("copy");
  const std::uint32_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937 rng(seed);
  const std::size_t count = 300001;  // odd: no accidental alignment of the tail
  auto origin = dev->allocate(count, DType::f32, MemoryKind::pageable_host, MemCategory::staging);
  auto back = dev->allocate(count, DType::f32, MemoryKind::pinned_host, MemCategory::staging);
  for (MemoryKind from : kAllKinds) {
    for (MemoryKind to : kAllKinds) {
      INFO(memory_kind_name(from) << " -> " << memory_kind_name(to));
      fill_random(origin.data(), origin.size_bytes(), rng);
      auto a = dev->allocate(count, DType::f32, from, MemCategory::workspace);
      auto b = dev->allocate(count, DType::f32, to, MemCategory::workspace);
      if (host_accessible(to)) std::memset(b.data(), 0xA5, b.size_bytes());  // poison
      dev->copy_async(a.view(), origin.cview(), *s);
      dev->copy_async(b.view(), a.cview(), *s);
      std::memset(back.data(), 0x5A, back.size_bytes());
      dev->copy_async(back.view(), b.cview(), *s);
      s->synchronize();
      REQUIRE(std::memcmp(back.data(), origin.data(), origin.size_bytes()) == 0);
    }
  }
  CHECK_THROWS_AS(dev->copy_async(back.view().slice(0, 5), origin.cview().slice(0, 4), *s), UsageError);
  auto host = make_host_device();
  auto host_stream = host->create_stream("host");
  CHECK_THROWS_AS(dev->copy_async(back.view(), origin.cview(), *host_stream), UsageError);
}

TEST_CASE("cuda streams: an event orders a copy on one stream after a copy on another", "[gpu][device]") {
  auto dev = make_cuda_device(0);
  auto a = dev->create_stream("h2d");
  auto b = dev->create_stream("d2h");
  auto ev = dev->create_event();
  const std::size_t count = 16 << 20;  // 64 MiB: long enough that a missing wait shows
  auto src = dev->allocate(count, DType::f32, MemoryKind::pinned_host, MemCategory::staging);
  auto mid = dev->allocate(count, DType::f32, MemoryKind::device, MemCategory::staging);
  auto dst = dev->allocate(count, DType::f32, MemoryKind::pinned_host, MemCategory::staging);
  for (int iter = 0; iter < 20; ++iter) {
    float* p = src.view().as<float>();
    for (std::size_t i = 0; i < count; ++i) p[i] = static_cast<float>(iter) + static_cast<float>(i % 1000);
    std::memset(dst.data(), 0, dst.size_bytes());
    dev->copy_async(mid.view(), src.cview(), *a);
    a->record(*ev);
    b->wait(*ev);
    dev->copy_async(dst.view(), mid.cview(), *b);
    b->synchronize();
    REQUIRE(std::memcmp(dst.data(), src.data(), src.size_bytes()) == 0);
    a->synchronize();  // src is rewritten next iteration
  }
}

TEST_CASE("cuda events: query and synchronize", "[gpu][device]") {
  auto dev = make_cuda_device(0);
  auto s = dev->create_stream("s");
  auto ev = dev->create_event();
  CHECK(ev->query());  // never recorded
  ev->synchronize();

  std::latch gate(1);
  s->launch_host([&] { gate.wait(); });
  s->record(*ev);
  std::this_thread::sleep_for(10ms);
  CHECK_FALSE(ev->query());
  gate.count_down();
  ev->synchronize();
  CHECK(ev->query());
}

TEST_CASE("cuda streams: host functions run in order, errors are sticky", "[gpu][device]") {
  auto dev = make_cuda_device(0);
  auto s = dev->create_stream("host-fn");
  std::vector<int> order;
  for (int i = 0; i < 200; ++i) s->launch_host([&order, i] { order.push_back(i); });
  s->synchronize();
  REQUIRE(order.size() == 200);
  for (int i = 0; i < 200; ++i) REQUIRE(order[static_cast<std::size_t>(i)] == i);

  auto ev = dev->create_event();
  auto other = dev->create_stream("other");
  std::atomic<int> ran_after{0};
  s->launch_host([] { throw CommError("first failure"); });
  s->launch_host([] { throw std::runtime_error("second failure"); });
  s->launch_host([&] { ++ran_after; });
  s->record(*ev);
  other->wait(*ev);
  other->synchronize();  // the event still completes
  CHECK_THROWS_WITH(s->synchronize(), "first failure");
  CHECK_THROWS_AS(s->synchronize(), CommError);
  CHECK(ran_after.load() == 0);
  CHECK_NOTHROW(s.reset());
}

TEST_CASE("cuda device: a buffer released inside a host function", "[gpu][device]") {
  auto dev = make_cuda_device(0);
  auto s = dev->create_stream("owner");
  auto buf = std::make_shared<Buffer>(dev->allocate(1 << 20, DType::f32, MemoryKind::device, MemCategory::staging));
  auto pinned =
      std::make_shared<Buffer>(dev->allocate(1 << 10, DType::f32, MemoryKind::pinned_host, MemCategory::staging));
  s->launch_host([buf, pinned] {});
  buf.reset();
  pinned.reset();
  s->synchronize();
  CHECK(dev->memory().total(MemoryKind::device).current_bytes == 0);
  CHECK(dev->memory().total(MemoryKind::pinned_host).current_bytes == 0);
  auto again = dev->allocate(1 << 20, DType::f32, MemoryKind::device, MemCategory::staging);
  CHECK_FALSE(again.empty());
}

TEST_CASE("cuda device: out of memory names the request and what is free", "[gpu][device]") {
  auto dev = make_cuda_device(0);
  auto keep = dev->allocate(1 << 20, DType::f32, MemoryKind::device, MemCategory::master);
  for (std::size_t bytes : {std::size_t{1} << 50, std::size_t{1} << 40}) {
    try {
      auto b = dev->allocate(bytes, DType::bf16, MemoryKind::device, MemCategory::param_gathered);
      FAIL("absurd allocation succeeded");
    } catch (const OutOfMemory& e) {
      const std::string msg = e.what();
      INFO(msg);
      CHECK_THAT(msg, Catch::Contains(std::to_string(bytes * 2)));
      CHECK_THAT(msg, Catch::Contains("free"));
      CHECK_THAT(msg, Catch::Contains("4194304"));  // what zero3 holds
    }
  }
  CHECK(dev->memory().get(MemoryKind::device, MemCategory::param_gathered).peak_bytes == 0);
  // Still usable afterwards: the failure left no sticky error behind.
  auto s = dev->create_stream("after");
  auto b = dev->allocate(1024, DType::f32, MemoryKind::device, MemCategory::workspace);
  auto h = dev->allocate(1024, DType::f32, MemoryKind::pinned_host, MemCategory::workspace);
  dev->copy_async(b.view(), h.cview(), *s);
  s->synchronize();
}
