// Memory kinds, allocation categories and the tracker that accounts every allocation.
// One set of categories serves the planner (`zero3 mem plan`) and the measurement, so a predicted
// table and a measured one can be compared row by row. The tracker is thread-safe (atomics).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
  // The peak of `kind`'s total since the previous call (since the tracker was made, the first time), and a
  // new window from the current value: per-step peaks for a consumer that must not disturb peak and
  // reset_peaks() (zero3.accumulation's memory policy).
  std::size_t take_window_peak(MemoryKind kind);
  // A human-readable table of the non-zero rows.
  std::string report() const;

  // Phases of a step (memory_breakdown): enter_phase() says which phase allocations from now on belong to
  // ("forward blocks.3", "optimizer step"). Each (kind, category) remembers the phase its peak was reached
  // in; and per phase, the bytes current when it ended and its peak are kept until take_phase_stats().
  using Snapshot = std::array<std::array<Counter, kNumMemCategories>, kNumMemoryKinds>;
  struct PhaseStats {
    std::string name;
    Snapshot bytes{};  // current_bytes: when the phase last ended; peak_bytes: the most while it ran
  };
  void enter_phase(std::string_view name);
  // The phases entered since the previous call, in the order first entered, the one running included
  // (its figures so far); then they start afresh.
  std::vector<PhaseStats> take_phase_stats();
  // The phase the peak of (kind, category) was reached in, "" when it was reached outside any.
  std::string peak_phase(MemoryKind kind, MemCategory cat) const;

 private:
  struct AtomicCounter {
    std::atomic<std::size_t> current{0};
    std::atomic<std::size_t> peak{0};
    std::atomic<std::size_t> interval_peak{0};  // cells: since the last phase fold; totals: take_window_peak
    std::atomic<std::uint32_t> peak_phase{0};
  };
  void add(AtomicCounter& c, std::size_t n);
  std::array<std::array<AtomicCounter, kNumMemCategories>, kNumMemoryKinds> cells_{};
  std::array<AtomicCounter, kNumMemoryKinds> totals_{};
  // Folds the interval since the last fold into the running phase's stats (phases_mutex_ held).
  void fold_interval();
  // A trace counter sample of `kind`'s categories (zero3/core/trace.hpp), while a trace is recorded.
  void trace_counter(MemoryKind kind) const;
  std::atomic<std::uint32_t> phase_{0};  // the running phase: 1 + its index in phase_names_; 0 none
  mutable std::mutex phases_mutex_;
  std::vector<std::string> phase_names_;
  std::vector<std::pair<std::uint32_t, Snapshot>> phase_stats_;  // since take_phase_stats(), first-entered order
  std::int64_t phase_began_us_ = -1;                             // the running phase's start on the trace clock
};

}  // namespace zero3
