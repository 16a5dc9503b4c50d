// Memory kinds, allocation categories and the tracker that accounts every allocation.
// One set of categories serves the planner (`zero3 mem plan`) and the measurement, so a predicted
// table and a measured one can be compared row by row. The tracker is thread-safe (atomics).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zero3 {

enum class MemoryKind : std::uint8_t { device = 0, pinned_host = 1, pageable_host = 2 };
inline constexpr std::size_t kNumMemoryKinds = 3;

enum class MemCategory : std::uint8_t {
  param_shard = 0,
  param_gathered,
  grad_buffer,
  grad_shard,
  master,
  optim_state,
  comm_buffer,
  staging,
  activations,
  workspace,
};
inline constexpr std::size_t kNumMemCategories = 10;

std::string_view memory_kind_name(MemoryKind k);
std::string_view mem_category_name(MemCategory c);
std::optional<MemCategory> parse_mem_category(std::string_view name);

// Current and peak bytes per (kind, category), plus the peak of each kind's total (which is not the
// sum of the per-category peaks: those need not coincide in time).
class MemoryTracker {
 public:
  struct Counter {
    std::size_t current_bytes = 0;
    std::size_t peak_bytes = 0;
  };

  void on_alloc(MemoryKind kind, MemCategory cat, std::size_t size_bytes);
  void on_free(MemoryKind kind, MemCategory cat, std::size_t size_bytes);

  Counter get(MemoryKind kind, MemCategory cat) const;
  Counter total(MemoryKind kind) const;
  // Restarts peak tracking from the current values (e.g. at the start of a phase).
  void reset_peaks();
  // A human-readable table of the non-zero rows.
  std::string report() const;

 private:
  struct AtomicCounter {
    std::atomic<std::size_t> current{0};
    std::atomic<std::size_t> peak{0};
  };
  static void add(AtomicCounter& c, std::size_t n);
  std::array<std::array<AtomicCounter, kNumMemCategories>, kNumMemoryKinds> cells_{};
  std::array<AtomicCounter, kNumMemoryKinds> totals_{};
};

}  // namespace zero3
