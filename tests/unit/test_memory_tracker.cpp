// Memory accounting: the tracker on its own (current/peak per kind and category, peak of totals,
// reset_peaks, report, thread safety) and through Device::allocate and Buffer's ownership rules.
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/memory.hpp"
#include "zero3/device/device.hpp"

using namespace zero3;

namespace {

constexpr MemoryKind kAllKinds[] = {MemoryKind::device, MemoryKind::pinned_host, MemoryKind::pageable_host};

std::vector<MemCategory> all_categories() {
  std::vector<MemCategory> out;
  for (std::size_t c = 0; c < kNumMemCategories; ++c) out.push_back(static_cast<MemCategory>(c));
  return out;
}

HostDeviceOptions unlocked() {
  return HostDeviceOptions{.capacity_bytes = std::nullopt, .lock_pinned = false};
}

}  // namespace

TEST_CASE("memory names round-trip", "[memory]") {
  for (MemCategory c : all_categories()) {
    const auto name = mem_category_name(c);
    CHECK(name != "?");
    REQUIRE(parse_mem_category(name).has_value());
    CHECK(*parse_mem_category(name) == c);
  }
  CHECK(mem_category_name(MemCategory::param_gathered) == "param_gathered");
  CHECK_FALSE(parse_mem_category("params_gathered").has_value());
  CHECK_FALSE(parse_mem_category("").has_value());
  CHECK(memory_kind_name(MemoryKind::device) == "device");
  CHECK(memory_kind_name(MemoryKind::pinned_host) == "pinned_host");
  CHECK(memory_kind_name(MemoryKind::pageable_host) == "pageable_host");
}

TEST_CASE("tracker: current and peak per kind and category", "[memory]") {
  MemoryTracker t;
  t.on_alloc(MemoryKind::device, MemCategory::param_shard, 100);
  t.on_alloc(MemoryKind::device, MemCategory::param_shard, 50);
  t.on_alloc(MemoryKind::device, MemCategory::master, 400);
  t.on_alloc(MemoryKind::pinned_host, MemCategory::param_shard, 7);

  CHECK(t.get(MemoryKind::device, MemCategory::param_shard).current_bytes == 150);
  CHECK(t.get(MemoryKind::device, MemCategory::param_shard).peak_bytes == 150);
  CHECK(t.get(MemoryKind::device, MemCategory::master).current_bytes == 400);
  CHECK(t.get(MemoryKind::pinned_host, MemCategory::param_shard).current_bytes == 7);
  CHECK(t.get(MemoryKind::pageable_host, MemCategory::param_shard).current_bytes == 0);
  CHECK(t.total(MemoryKind::device).current_bytes == 550);
  CHECK(t.total(MemoryKind::pinned_host).current_bytes == 7);
  CHECK(t.total(MemoryKind::pageable_host).current_bytes == 0);

  t.on_free(MemoryKind::device, MemCategory::param_shard, 100);
  CHECK(t.get(MemoryKind::device, MemCategory::param_shard).current_bytes == 50);
  CHECK(t.get(MemoryKind::device, MemCategory::param_shard).peak_bytes == 150);  // peaks stay
  CHECK(t.total(MemoryKind::device).current_bytes == 450);
  CHECK(t.total(MemoryKind::device).peak_bytes == 550);
}

TEST_CASE("tracker: the peak of the total is not the sum of category peaks", "[memory]") {
  MemoryTracker t;
  t.on_alloc(MemoryKind::device, MemCategory::param_gathered, 300);
  t.on_free(MemoryKind::device, MemCategory::param_gathered, 300);
  t.on_alloc(MemoryKind::device, MemCategory::grad_buffer, 200);
  CHECK(t.get(MemoryKind::device, MemCategory::param_gathered).peak_bytes == 300);
  CHECK(t.get(MemoryKind::device, MemCategory::grad_buffer).peak_bytes == 200);
  CHECK(t.total(MemoryKind::device).peak_bytes == 300);  // they never coexisted
  t.on_alloc(MemoryKind::device, MemCategory::param_gathered, 150);
  CHECK(t.total(MemoryKind::device).peak_bytes == 350);
}

TEST_CASE("tracker: reset_peaks restarts from the current values", "[memory]") {
  MemoryTracker t;
  t.on_alloc(MemoryKind::device, MemCategory::activations, 1000);
  t.on_alloc(MemoryKind::pageable_host, MemCategory::staging, 64);
  t.on_free(MemoryKind::device, MemCategory::activations, 600);
  t.reset_peaks();
  CHECK(t.get(MemoryKind::device, MemCategory::activations).peak_bytes == 400);
  CHECK(t.total(MemoryKind::device).peak_bytes == 400);
  CHECK(t.get(MemoryKind::pageable_host, MemCategory::staging).peak_bytes == 64);
  t.on_alloc(MemoryKind::device, MemCategory::activations, 100);
  CHECK(t.get(MemoryKind::device, MemCategory::activations).peak_bytes == 500);
  CHECK(t.total(MemoryKind::device).peak_bytes == 500);
  t.on_free(MemoryKind::device, MemCategory::activations, 500);
  t.reset_peaks();
  CHECK(t.get(MemoryKind::device, MemCategory::activations).peak_bytes == 0);
}

TEST_CASE("tracker: report lists the rows that were ever used", "[memory]") {
  MemoryTracker t;
  CHECK(t.report().find("param_shard") == std::string::npos);
  t.on_alloc(MemoryKind::device, MemCategory::optim_state, 123456);
  t.on_alloc(MemoryKind::pinned_host, MemCategory::comm_buffer, 42);
  t.on_free(MemoryKind::pinned_host, MemCategory::comm_buffer, 42);
  const std::string r = t.report();
  CHECK_THAT(r, Catch::Contains("optim_state"));
  CHECK_THAT(r, Catch::Contains("123456"));
  CHECK_THAT(r, Catch::Contains("comm_buffer"));  // freed, but it had a peak
  CHECK_THAT(r, Catch::Contains("(total)"));
  CHECK(r.find("param_shard") == std::string::npos);
  CHECK(r.find("pageable_host") == std::string::npos);
}

TEST_CASE("tracker: concurrent updates stay exact", "[memory]") {
  MemoryTracker t;
  constexpr int kThreads = 8;
  constexpr int kOps = 20000;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&t, i] {
      std::mt19937 rng(static_cast<std::uint32_t>(i) * 7919u + 1u);
      const auto cat = static_cast<MemCategory>(static_cast<std::size_t>(i) % kNumMemCategories);
      for (int op = 0; op < kOps; ++op) {
        const std::size_t n = 1 + rng() % 4096;
        t.on_alloc(MemoryKind::device, cat, n);
        t.on_alloc(MemoryKind::device, MemCategory::workspace, n);
        t.on_free(MemoryKind::device, cat, n);
        t.on_free(MemoryKind::device, MemCategory::workspace, n);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (MemCategory c : all_categories()) CHECK(t.get(MemoryKind::device, c).current_bytes == 0);
  CHECK(t.total(MemoryKind::device).current_bytes == 0);
  const std::size_t peak = t.total(MemoryKind::device).peak_bytes;
  CHECK(peak >= 2);
  CHECK(peak <= std::size_t{kThreads} * 2 * 4096);  // at most two live requests per thread
}

TEST_CASE("device allocation is accounted by kind and category", "[memory][device]") {
  auto dev = make_host_device(unlocked());
  MemoryTracker& mem = dev->memory();
  std::vector<Buffer> held;
  std::size_t expected_total[kNumMemoryKinds] = {};
  std::size_t n = 3;
  for (MemoryKind kind : kAllKinds) {
    for (MemCategory cat : all_categories()) {
      const DType dtype = (n % 3 == 0) ? DType::f32 : (n % 3 == 1 ? DType::f16 : DType::bf16);
      held.push_back(dev->allocate(n, dtype, kind, cat));
      const std::size_t bytes = n * size_of(dtype);
      CHECK(held.back().size_bytes() == bytes);
      CHECK(held.back().count() == n);
      CHECK(held.back().dtype() == dtype);
      CHECK(held.back().kind() == kind);
      CHECK(held.back().category() == cat);
      CHECK(mem.get(kind, cat).current_bytes == bytes);
      CHECK(mem.get(kind, cat).peak_bytes == bytes);
      expected_total[static_cast<std::size_t>(kind)] += bytes;
      ++n;
    }
  }
  for (MemoryKind kind : kAllKinds) {
    CHECK(mem.total(kind).current_bytes == expected_total[static_cast<std::size_t>(kind)]);
  }
  // Freeing updates current and keeps the peaks.
  const Buffer& first = held.front();
  const std::size_t first_bytes = first.size_bytes();
  const MemoryKind first_kind = first.kind();
  const MemCategory first_cat = first.category();
  held.erase(held.begin());
  CHECK(mem.get(first_kind, first_cat).current_bytes == 0);
  CHECK(mem.get(first_kind, first_cat).peak_bytes == first_bytes);
  CHECK(mem.total(first_kind).current_bytes == expected_total[static_cast<std::size_t>(first_kind)] - first_bytes);
  held.clear();
  for (MemoryKind kind : kAllKinds) {
    CHECK(mem.total(kind).current_bytes == 0);
    CHECK(mem.total(kind).peak_bytes == expected_total[static_cast<std::size_t>(kind)]);
  }
  mem.reset_peaks();
  for (MemoryKind kind : kAllKinds) CHECK(mem.total(kind).peak_bytes == 0);
}

TEST_CASE("buffer: views carry count, dtype and kind", "[memory][device]") {
  auto dev = make_host_device(unlocked());
  auto b = dev->allocate(10, DType::bf16, MemoryKind::pinned_host, MemCategory::grad_shard);
  BufferView v = b.view();
  CHECK(v.data == b.data());
  CHECK(v.count == 10);
  CHECK(v.dtype == DType::bf16);
  CHECK(v.kind == MemoryKind::pinned_host);
  CHECK(v.size_bytes() == 20);
  ConstBufferView cv = b.cview();
  CHECK(cv.data == b.data());
  CHECK(cv.count == 10);
}

TEST_CASE("buffer: move semantics make a double free impossible", "[memory][device]") {
  auto dev = make_host_device(unlocked());
  MemoryTracker& mem = dev->memory();
  auto a = dev->allocate(256, DType::f32, MemoryKind::device, MemCategory::param_gathered);
  void* const p = a.data();
  REQUIRE(p != nullptr);
  CHECK(mem.total(MemoryKind::device).current_bytes == 1024);

  SECTION("move construction") {
    Buffer b(std::move(a));
    CHECK(a.empty());  // NOLINT(bugprone-use-after-move): the moved-from state is the contract
    CHECK(a.data() == nullptr);
    CHECK(a.count() == 0);
    CHECK(a.size_bytes() == 0);
    CHECK(b.data() == p);
    CHECK(b.count() == 256);
    CHECK(b.category() == MemCategory::param_gathered);
    CHECK(mem.total(MemoryKind::device).current_bytes == 1024);  // nothing freed or double-counted
    a.reset();                                                   // a no-op on an empty buffer
    CHECK(mem.total(MemoryKind::device).current_bytes == 1024);
    b.reset();
    CHECK(b.empty());
    CHECK(mem.total(MemoryKind::device).current_bytes == 0);
    b.reset();  // twice is fine
    CHECK(mem.total(MemoryKind::device).current_bytes == 0);
  }

  SECTION("move assignment frees the target's old allocation") {
    auto c = dev->allocate(100, DType::f16, MemoryKind::device, MemCategory::grad_buffer);
    CHECK(mem.get(MemoryKind::device, MemCategory::grad_buffer).current_bytes == 200);
    c = std::move(a);
    CHECK(mem.get(MemoryKind::device, MemCategory::grad_buffer).current_bytes == 0);
    CHECK(mem.get(MemoryKind::device, MemCategory::param_gathered).current_bytes == 1024);
    CHECK(c.data() == p);
    CHECK(c.dtype() == DType::f32);
    CHECK(a.empty());  // NOLINT(bugprone-use-after-move)
  }

  SECTION("self move assignment keeps the buffer") {
    Buffer& alias = a;
    a = std::move(alias);
    CHECK(a.data() == p);
    CHECK(mem.total(MemoryKind::device).current_bytes == 1024);
  }

  SECTION("moving into a vector and out again") {
    std::vector<Buffer> v;
    v.push_back(std::move(a));
    for (int i = 0; i < 20; ++i) v.push_back(dev->allocate(8, DType::f32, MemoryKind::device, MemCategory::workspace));
    CHECK(v.front().data() == p);
    CHECK(mem.total(MemoryKind::device).current_bytes == 1024 + 20 * 32);
    Buffer out = std::move(v.front());
    v.clear();
    CHECK(mem.total(MemoryKind::device).current_bytes == 1024);
  }
}

TEST_CASE("buffer: zero-count and failed allocations account nothing", "[memory][device]") {
  auto dev = make_host_device(HostDeviceOptions{.capacity_bytes = 4096, .lock_pinned = false});
  MemoryTracker& mem = dev->memory();
  for (MemoryKind kind : kAllKinds) {
    Buffer z = dev->allocate(0, DType::bf16, kind, MemCategory::activations);
    CHECK(z.empty());
    CHECK(z.count() == 0);
    CHECK(z.size_bytes() == 0);
    CHECK(z.dtype() == DType::bf16);
    CHECK(z.kind() == kind);
    CHECK(z.category() == MemCategory::activations);
    CHECK(z.view().count == 0);
    CHECK(mem.total(kind).current_bytes == 0);
    CHECK(mem.total(kind).peak_bytes == 0);
  }
  CHECK_THROWS_AS(dev->allocate(2000, DType::f32, MemoryKind::device, MemCategory::workspace), OutOfMemory);
  CHECK(mem.total(MemoryKind::device).peak_bytes == 0);
  // A count whose byte size overflows size_t is refused before anything is allocated.
  const std::size_t huge = std::numeric_limits<std::size_t>::max() / 2 + 1;
  CHECK_THROWS_AS(dev->allocate(huge, DType::f32, MemoryKind::pageable_host, MemCategory::workspace), OutOfMemory);
  CHECK_THROWS_AS(dev->allocate(huge, DType::bf16, MemoryKind::device, MemCategory::workspace), OutOfMemory);
  CHECK(mem.total(MemoryKind::pageable_host).peak_bytes == 0);
  CHECK(mem.report().find("workspace") == std::string::npos);
}

TEST_CASE("device accounting under concurrent allocate and free", "[memory][device]") {
  auto dev = make_host_device(unlocked());
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&dev, i] {
      std::mt19937 rng(static_cast<std::uint32_t>(i) + 11u);
      std::vector<Buffer> live;
      for (int op = 0; op < 2000; ++op) {
        if (live.size() < 8 && rng() % 2 == 0) {
          const auto kind = static_cast<MemoryKind>(rng() % kNumMemoryKinds);
          const auto cat = static_cast<MemCategory>(rng() % kNumMemCategories);
          live.push_back(dev->allocate(1 + rng() % 1000, DType::f16, kind, cat));
        } else if (!live.empty()) {
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(rng() % live.size()));
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (MemoryKind kind : kAllKinds) {
    CHECK(dev->memory().total(kind).current_bytes == 0);
    for (MemCategory c : all_categories()) CHECK(dev->memory().get(kind, c).current_bytes == 0);
  }
}
