#include "zero3/core/memory.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "zero3/core/trace.hpp"

namespace zero3 {

std::string_view memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::device:
      return "device";
    case MemoryKind::pinned_host:
      return "pinned_host";
    case MemoryKind::pageable_host:
      return "pageable_host";
  }
  return "?";
}

namespace {
constexpr std::string_view kCategoryNames[kNumMemCategories] = {
    "param_shard", "param_gathered", "grad_buffer", "grad_shard",  "master",
    "optim_state", "comm_buffer",    "staging",     "activations", "workspace"};
}

std::string_view mem_category_name(MemCategory c) {
  const auto i = static_cast<std::size_t>(c);
  return i < kNumMemCategories ? kCategoryNames[i] : "?";
}

std::optional<MemCategory> parse_mem_category(std::string_view name) {
  for (std::size_t i = 0; i < kNumMemCategories; ++i) {
    if (kCategoryNames[i] == name) return static_cast<MemCategory>(i);
  }
  return std::nullopt;
}

void MemoryTracker::add(AtomicCounter& c, std::size_t n) {
  const std::size_t now = c.current.fetch_add(n) + n;
  std::size_t peak = c.peak.load();
  while (now > peak) {
    if (c.peak.compare_exchange_weak(peak, now)) {
      c.peak_phase.store(phase_.load(std::memory_order_relaxed), std::memory_order_relaxed);
      break;
    }
  }
  std::size_t interval = c.interval_peak.load();
  while (now > interval && !c.interval_peak.compare_exchange_weak(interval, now)) {
  }
}

void MemoryTracker::on_alloc(MemoryKind kind, MemCategory cat, std::size_t size_bytes) {
  add(cells_[static_cast<std::size_t>(kind)][static_cast<std::size_t>(cat)], size_bytes);
  add(totals_[static_cast<std::size_t>(kind)], size_bytes);
  if (trace::enabled()) trace_counter(kind);
}

void MemoryTracker::on_free(MemoryKind kind, MemCategory cat, std::size_t size_bytes) {
  cells_[static_cast<std::size_t>(kind)][static_cast<std::size_t>(cat)].current.fetch_sub(size_bytes);
  totals_[static_cast<std::size_t>(kind)].current.fetch_sub(size_bytes);
  if (trace::enabled()) trace_counter(kind);
}

void MemoryTracker::trace_counter(MemoryKind kind) const {
  std::vector<std::pair<std::string_view, double>> series;
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    series.emplace_back(kCategoryNames[c],
                        static_cast<double>(cells_[static_cast<std::size_t>(kind)][c].current.load()) / (1 << 20));
  }
  trace::counter(fmt::format("memory {} (MiB)", memory_kind_name(kind)), series);
}

MemoryTracker::Counter MemoryTracker::get(MemoryKind kind, MemCategory cat) const {
  const auto& c = cells_[static_cast<std::size_t>(kind)][static_cast<std::size_t>(cat)];
  return {c.current.load(), c.peak.load()};
}

MemoryTracker::Counter MemoryTracker::total(MemoryKind kind) const {
  const auto& c = totals_[static_cast<std::size_t>(kind)];
  return {c.current.load(), c.peak.load()};
}

void MemoryTracker::reset_peaks() {
  for (auto& row : cells_) {
    for (auto& c : row) {
      c.peak.store(c.current.load());
      c.interval_peak.store(c.current.load());
      c.peak_phase.store(phase_.load());
    }
  }
  for (auto& c : totals_) c.peak.store(c.current.load());
}

std::size_t MemoryTracker::take_window_peak(MemoryKind kind) {
  AtomicCounter& c = totals_[static_cast<std::size_t>(kind)];
  const std::size_t current = c.current.load();
  return std::max(c.interval_peak.exchange(current), current);
}

void MemoryTracker::fold_interval() {
  const std::uint32_t id = phase_.load();
  if (id == 0) return;
  auto it = std::find_if(phase_stats_.begin(), phase_stats_.end(), [&](const auto& p) { return p.first == id; });
  if (it == phase_stats_.end()) {
    phase_stats_.emplace_back(id, Snapshot{});
    it = std::prev(phase_stats_.end());
  }
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      AtomicCounter& a = cells_[k][c];
      const std::size_t current = a.current.load();
      const std::size_t peak = std::max(a.interval_peak.exchange(current), current);
      Counter& out = it->second[k][c];
      out.current_bytes = current;
      out.peak_bytes = std::max(out.peak_bytes, peak);
    }
  }
}

void MemoryTracker::enter_phase(std::string_view name) {
  const std::lock_guard lock(phases_mutex_);
  fold_interval();
  if (trace::enabled()) {
    const std::int64_t now = trace::now_us();
    const std::uint32_t running = phase_.load();
    if (running != 0 && phase_began_us_ >= 0) trace::span("phases", phase_names_[running - 1], phase_began_us_, now);
    phase_began_us_ = now;
  }
  auto it = std::find(phase_names_.begin(), phase_names_.end(), name);
  if (it == phase_names_.end()) {
    phase_names_.emplace_back(name);
    it = std::prev(phase_names_.end());
  }
  phase_.store(static_cast<std::uint32_t>(it - phase_names_.begin()) + 1);
}

std::vector<MemoryTracker::PhaseStats> MemoryTracker::take_phase_stats() {
  const std::lock_guard lock(phases_mutex_);
  fold_interval();
  std::vector<PhaseStats> out;
  for (const auto& [id, bytes] : phase_stats_) out.push_back({phase_names_[id - 1], bytes});
  phase_stats_.clear();
  return out;
}

std::string MemoryTracker::peak_phase(MemoryKind kind, MemCategory cat) const {
  const std::uint32_t id = cells_[static_cast<std::size_t>(kind)][static_cast<std::size_t>(cat)].peak_phase.load();
  const std::lock_guard lock(phases_mutex_);
  return id == 0 || id > phase_names_.size() ? std::string() : phase_names_[id - 1];
}

std::string MemoryTracker::report() const {
  std::string out = fmt::format("{:<14} {:<15} {:>14} {:>14}\n", "kind", "category", "current_bytes", "peak_bytes");
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      auto v = get(static_cast<MemoryKind>(k), static_cast<MemCategory>(c));
      if (v.peak_bytes == 0) continue;
      out += fmt::format("{:<14} {:<15} {:>14} {:>14}\n", memory_kind_name(static_cast<MemoryKind>(k)),
                         kCategoryNames[c], v.current_bytes, v.peak_bytes);
    }
    auto t = total(static_cast<MemoryKind>(k));
    if (t.peak_bytes != 0)
      out += fmt::format("{:<14} {:<15} {:>14} {:>14}\n", memory_kind_name(static_cast<MemoryKind>(k)), "(total)",
                         t.current_bytes, t.peak_bytes);
  }
  return out;
}

}  // namespace zero3
