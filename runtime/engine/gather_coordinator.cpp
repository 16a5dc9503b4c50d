#include "gather_coordinator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "zero3/comm/fault.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/log.hpp"

namespace zero3::engine {

namespace {
constexpr std::size_t kNoNextUse = std::numeric_limits<std::size_t>::max();

std::uint64_t non_negative(std::int64_t v) {
  return static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0));
}
}  // namespace

GatherCoordinator::GatherCoordinator(const Wiring& wiring, BufferView param_shards)
    : layout_(wiring.layout),
      device_(wiring.device),
      comm_(wiring.communicator),
      compute_(wiring.compute_stream),
      comm_stream_(wiring.comm_stream),
      events_(wiring.events),
      dtype_(wiring.compute_dtype),
      stats_(wiring.stats),
      timeline_(wiring.timeline),
      param_shards_(param_shards),
      prefetch_bucket_(non_negative(wiring.config.zero.prefetch_bucket_size)),
      max_live_(non_negative(wiring.config.zero.max_live_parameters)),
      max_reuse_(non_negative(wiring.config.zero.max_reuse_distance)),
      units_(wiring.layout.units.size()),
      frees_(wiring.events) {
  offloaded_ = param_shards_.kind != MemoryKind::device;
  in_place_ = wiring.single_rank_in_place && !offloaded_;
  if (!offloaded_) return;
  // Offloaded params: persistent units keep a device copy (their compute reads it every micro-step),
  // refreshed after each step; everything else is copied to the device as part of its gather.
  persistent_copies_.resize(layout_.units.size());
  for (std::size_t u = 0; u < layout_.units.size(); ++u) {
    const UnitLayout& ul = layout_.units[u];
    if (!ul.persistent || ul.gathered_count() == 0) continue;
    persistent_copies_[u] = device_.allocate(ul.gathered_count(), dtype_, MemoryKind::device, MemCategory::param_shard);
    for (const Group g : {Group::trainable, Group::frozen}) copy_persistent_group(u, g);
  }
}

void GatherCoordinator::copy_persistent_group(std::size_t unit, Group g) {
  const UnitLayout& ul = layout_.units[unit];
  const GroupLayout& gl = ul.group(g);
  if (gl.shard == 0) return;
  const std::uint64_t copy = timeline_.begin(comm_stream_, Timeline::Lane::h2d);
  device_.copy_async(persistent_copies_[unit].view().slice(ul.gathered_offset(g), gl.shard),
                     param_shards_.slice(gl.flat_offset, gl.shard), comm_stream_);
  timeline_.end(comm_stream_, copy);
  timeline_.add_bytes(Timeline::Lane::h2d, gl.shard * size_of(dtype_));
}

void GatherCoordinator::refresh_persistent(bool frozen_too) {
  if (!offloaded_) return;
  for (std::size_t u = 0; u < layout_.units.size(); ++u) {
    if (persistent_copies_[u].empty()) continue;
    copy_persistent_group(u, Group::trainable);
    if (frozen_too) copy_persistent_group(u, Group::frozen);
  }
}

void GatherCoordinator::add_gathered(std::size_t elems) {
  stats_.gathered_elems += elems;
  stats_.gathered_peak_elems = std::max(stats_.gathered_peak_elems, stats_.gathered_elems);
}

void GatherCoordinator::acquire(std::size_t unit) {
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
    case State::in_flight: {
      // An untraced pass (held-out evaluation) is no part of a training step: its stalls would otherwise
      // land in the next step's split.
      const std::uint64_t stall = traced_ ? timeline_.begin(compute_, Timeline::Lane::gather_wait) : 0;
      compute_.wait(*s.ready);
      timeline_.end(compute_, stall);
      if (s.prefetched) prefetch_inflight_ -= layout_.units[unit].numel;
      s.prefetched = false;
      s.state = State::available;
      break;
    }
    case State::available:
      break;
  }
  ++s.open;
  if (!recording_ && traced_) prefetch();
}

void GatherCoordinator::check_trace(std::size_t unit) {
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

void GatherCoordinator::gather(std::size_t unit, bool prefetched) {
  const UnitLayout& ul = layout_.units[unit];
  UnitState& s = units_[unit];
  const std::size_t count = ul.gathered_count();
  // Memory: released buffers stay allocated until the compute stream is done with them. Wait for the
  // oldest ones when keeping them would take the gathered memory past the live budget.
  frees_.reclaim();
  while (live_padded_ + frees_.pending_elems() + count > max_live_ && frees_.reclaim_oldest()) {
  }
  s.buffer = device_.allocate(count, dtype_, MemoryKind::device, MemCategory::param_gathered);
  live_padded_ += count;
  if (!s.ready) s.ready = events_.acquire();
  // Named at the issue site: a prefetch issued while unit k computes is unit k+1's gather.
  const comm::ScopedOpAnnotation note("gather", ul.name);
  const bool skip = comm::fault::fire(comm::fault::Kind::skip_gather, comm_.rank(), comm::progress_steps_done(),
                                      static_cast<std::int64_t>(unit));
  for (const Group g : {Group::trainable, Group::frozen}) {
    if (skip) break;  // a test's fault: this rank never issues the unit's gather
    const GroupLayout& gl = ul.group(g);
    if (gl.padded == 0) continue;
    const BufferView full = s.buffer.view().slice(ul.gathered_offset(g), gl.padded);
    if (offloaded_) {
      // The shard lives in host memory: copy it into this rank's block and gather in place, so the
      // host-to-device copy is part of the (prefetched) gather and never a separate blocking step.
      const BufferView own = full.slice(static_cast<std::size_t>(comm_.rank()) * gl.shard, gl.shard);
      const std::uint64_t copy = timeline_.begin(comm_stream_, Timeline::Lane::h2d);
      device_.copy_async(own, param_shards_.slice(gl.flat_offset, gl.shard), comm_stream_);
      timeline_.end(comm_stream_, copy);
      timeline_.add_bytes(Timeline::Lane::h2d, own.size_bytes());
      comm_.all_gather(own, full, comm_stream_);
    } else {
      comm_.all_gather(param_shards_.slice(gl.flat_offset, gl.shard), full, comm_stream_);
    }
  }
  comm_stream_.record(*s.ready);
  s.state = State::in_flight;
  s.prefetched = prefetched;
  if (prefetched) prefetch_inflight_ += ul.numel;
  add_gathered(ul.numel);
  stats_.all_gather_elems += ul.numel;
}

void GatherCoordinator::prefetch() {
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

bool GatherCoordinator::keep_for_reuse(std::size_t unit) const {
  if (recording_ || !traced_ || max_reuse_ == 0) return false;
  const std::size_t k = units_[unit].last_pos;
  if (k >= next_use_.size()) return false;
  const std::size_t j = next_use_[k];
  if (j == kNoNextUse) return false;
  const std::uint64_t distance = prefix_elems_[j] - prefix_elems_[k + 1];  // elements gathered in between
  return distance < max_reuse_ && stats_.gathered_elems <= max_live_;
}

void GatherCoordinator::release(std::size_t unit) {
  UnitState& s = units_[unit];
  ZERO3_CHECK(s.open > 0, "GatherCoordinator::release of a unit that is not acquired");
  if (--s.open > 0 || whole_here(unit)) return;
  if (keep_for_reuse(unit)) return;
  free_unit(unit, compute_);
}

void GatherCoordinator::free_unit(std::size_t unit, Stream& last_user) {
  UnitState& s = units_[unit];
  const UnitLayout& ul = layout_.units[unit];
  if (s.state == State::released) return;
  if (s.prefetched) prefetch_inflight_ -= ul.numel;
  s.prefetched = false;
  live_padded_ -= s.buffer.count();
  frees_.release(std::move(s.buffer), last_user);
  s.state = State::released;
  stats_.gathered_elems -= ul.numel;
}

BufferView GatherCoordinator::param(std::size_t param_index) const {
  const ParamLayout& p = layout_.params[param_index];
  const UnitLayout& ul = layout_.units[p.unit];
  if (whole_here(p.unit)) {
    if (offloaded_) return persistent_copies_[p.unit].view().slice(ul.gathered_offset(p.group) + p.offset, p.numel);
    return param_shards_.slice(ul.group(p.group).flat_offset + p.offset, p.numel);
  }
  const UnitState& s = units_[p.unit];
  ZERO3_CHECK(s.state == State::available, "GatherCoordinator::param of a unit that is not acquired");
  return s.buffer.view().slice(ul.gathered_offset(p.group) + p.offset, p.numel);
}

void GatherCoordinator::finish_trace() {
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

void GatherCoordinator::end_window() {
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
    UnitState& s = units_[u];
    ZERO3_CHECK(s.open == 0 || layout_.units[u].persistent, "end_window with a gather scope open");
    // A prefetch never joined is still in use by the comm stream; anything else by the compute stream.
    if (s.state == State::in_flight) {
      free_unit(u, comm_stream_);
    } else if (s.state == State::available) {
      free_unit(u, compute_);
    }
  }
  pos_ = 0;
  frees_.reclaim();
}

}  // namespace zero3::engine
