#include "gather_schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>

#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::engine {

namespace {
constexpr std::size_t kNoNextUse = std::numeric_limits<std::size_t>::max();

std::uint64_t non_negative(std::int64_t v) {
  return static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0));
}
}  // namespace

GatherSchedule::GatherSchedule(const Layout& layout, const config::ZeroConfig& zero, bool whole_here_all,
                               EngineStats& stats, GatherActions& actions)
    : layout_(layout),
      whole_here_all_(whole_here_all),
      stats_(stats),
      actions_(actions),
      prefetch_bucket_(non_negative(zero.prefetch_bucket_size)),
      max_live_(non_negative(zero.max_live_parameters)),
      max_reuse_(non_negative(zero.max_reuse_distance)),
      units_(layout.units.size()) {}

void GatherSchedule::acquire(std::size_t unit) {
  UnitState& s = units_[unit];
  if (whole_here(unit)) {  // nothing to gather, nothing to trace
    ++s.open;
    return;
  }
  if (traced_) {
    check_trace(unit);
    s.last_pos = pos_++;
  }
  switch (s.state) {
    case State::released:
      gather(unit, /*prefetched=*/false);
      [[fallthrough]];
    case State::in_flight:
      actions_.join(unit);
      if (s.prefetched) prefetch_inflight_ -= layout_.units[unit].numel;
      s.prefetched = false;
      s.state = State::available;
      break;
    case State::available:
      break;
  }
  ++s.open;
  if (!recording_ && traced_) prefetch();
}

void GatherSchedule::check_trace(std::size_t unit) {
  if (recording_) {
    trace_.push_back(unit);
    return;
  }
  if (pos_ < trace_.size() && trace_[pos_] == unit) return;
  ++stats_.trace_rebuilds;
  const std::string expected =
      pos_ < trace_.size() ? fmt::format("unit '{}'", layout_.units[trace_[pos_]].name) : "the end of the window";
  const std::string message =
      fmt::format("gather order changed at position {}: expected {}, got unit '{}'; rebuilding the prefetch schedule",
                  pos_, expected, layout_.units[unit].name);
  // Once as a warning; a model whose order keeps changing then reports only every power-of-two rebuild.
  const std::uint64_t n = stats_.trace_rebuilds;
  if (n == 1) {
    log::warn("{}", message);
  } else if ((n & (n - 1)) == 0) {
    log::info("{} ({} rebuilds so far)", message, n);
  }
  trace_.resize(pos_);
  trace_.push_back(unit);
  recording_ = true;
}

void GatherSchedule::gather(std::size_t unit, bool prefetched) {
  actions_.gather(unit, prefetched);
  UnitState& s = units_[unit];
  const std::uint64_t numel = layout_.units[unit].numel;
  s.state = State::in_flight;
  s.prefetched = prefetched;
  if (prefetched) prefetch_inflight_ += numel;
  stats_.gathered_elems += numel;
  stats_.gathered_peak_elems = std::max(stats_.gathered_peak_elems, stats_.gathered_elems);
  stats_.all_gather_elems += numel;
}

void GatherSchedule::prefetch() {
  if (prefetch_bucket_ == 0) return;
  // Look ahead no further than the live budget could hold: nothing beyond could be prefetched anyway.
  std::uint64_t scanned = 0;
  for (std::size_t p = pos_; p < trace_.size() && scanned <= max_live_; ++p) {
    const std::size_t unit = trace_[p];
    const std::uint64_t n = layout_.units[unit].numel;
    scanned += n;
    if (units_[unit].state != State::released) continue;
    if (prefetch_inflight_ + n > prefetch_bucket_ || stats_.gathered_elems + n > max_live_) break;
    gather(unit, /*prefetched=*/true);
  }
}

std::vector<std::size_t> GatherSchedule::gathers_ahead(std::size_t count) const {
  std::vector<std::size_t> out;
  if (recording_ || !traced_) return out;
  for (std::size_t p = pos_; p < trace_.size() && out.size() < count; ++p) {
    const std::size_t unit = trace_[p];
    if (units_[unit].state != State::released || std::find(out.begin(), out.end(), unit) != out.end()) continue;
    out.push_back(unit);
  }
  return out;
}

bool GatherSchedule::keep_for_reuse(std::size_t unit) const {
  if (recording_ || !traced_ || max_reuse_ == 0) return false;
  const std::size_t k = units_[unit].last_pos;
  if (k >= next_use_.size()) return false;
  const std::size_t j = next_use_[k];
  if (j == kNoNextUse) return false;
  const std::uint64_t distance = prefix_elems_[j] - prefix_elems_[k + 1];  // elements gathered in between
  return distance < max_reuse_ && stats_.gathered_elems <= max_live_;
}

void GatherSchedule::release(std::size_t unit) {
  UnitState& s = units_[unit];
  ZERO3_CHECK(s.open > 0, "GatherSchedule::release of a unit that is not acquired");
  if (--s.open > 0 || whole_here(unit)) return;
  if (keep_for_reuse(unit)) return;
  free_unit(unit);
}

void GatherSchedule::free_unit(std::size_t unit) {
  UnitState& s = units_[unit];
  if (s.state == State::released) return;
  const std::uint64_t numel = layout_.units[unit].numel;
  if (s.prefetched) prefetch_inflight_ -= numel;
  const bool joined = s.state == State::available;
  s.prefetched = false;
  s.state = State::released;
  stats_.gathered_elems -= numel;
  actions_.free(unit, joined);
}

void GatherSchedule::finish_trace() {
  recording_ = false;
  next_use_.assign(trace_.size(), kNoNextUse);
  prefix_elems_.assign(trace_.size() + 1, 0);
  std::unordered_map<std::size_t, std::size_t> later;  // unit -> its next position, scanning backwards
  for (std::size_t k = trace_.size(); k-- > 0;) {
    const auto it = later.find(trace_[k]);
    if (it != later.end()) next_use_[k] = it->second;
    later[trace_[k]] = k;
  }
  for (std::size_t k = 0; k < trace_.size(); ++k) {
    prefix_elems_[k + 1] = prefix_elems_[k] + layout_.units[trace_[k]].numel;
  }
  log::debug("gather trace recorded: {} gathers per accumulation window; prefetch {} elements ahead, at most {} live",
             trace_.size(), prefetch_bucket_, max_live_);
}

void GatherSchedule::end_window() {
  if (!recording_ && pos_ != trace_.size()) {
    // The window ended early: what did happen is the new trace.
    ++stats_.trace_rebuilds;
    log::warn(
        "gather order changed: the accumulation window ended after {} gathers, the trace has {}; rebuilding "
        "the prefetch schedule",
        pos_, trace_.size());
    trace_.resize(pos_);
    recording_ = true;
  }
  if (recording_) finish_trace();
  for (std::size_t u = 0; u < units_.size(); ++u) {
    ZERO3_CHECK(units_[u].open == 0 || whole_here(u), "end_window with a gather scope open");
    free_unit(u);
  }
  pos_ = 0;
}

}  // namespace zero3::engine
