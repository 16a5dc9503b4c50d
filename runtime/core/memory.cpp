#include "zero3/core/memory.hpp"

#include <fmt/format.h>

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
  std::size_t now = c.current.fetch_add(n) + n;
  std::size_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

void MemoryTracker::on_alloc(MemoryKind kind, MemCategory cat, std::size_t size_bytes) {
  add(cells_[static_cast<std::size_t>(kind)][static_cast<std::size_t>(cat)], size_bytes);
  add(totals_[static_cast<std::size_t>(kind)], size_bytes);
}

void MemoryTracker::on_free(MemoryKind kind, MemCategory cat, std::size_t size_bytes) {
  cells_[static_cast<std::size_t>(kind)][static_cast<std::size_t>(cat)].current.fetch_sub(size_bytes);
  totals_[static_cast<std::size_t>(kind)].current.fetch_sub(size_bytes);
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
  for (auto& row : cells_)
    for (auto& c : row) c.peak.store(c.current.load());
  for (auto& c : totals_) c.peak.store(c.current.load());
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
