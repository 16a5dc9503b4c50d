#include "gather_coordinator.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "nvme_params.hpp"
#include "zero3/comm/fault.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/trace.hpp"

namespace zero3::engine {

GatherCoordinator::GatherCoordinator(const Wiring& wiring, BufferView param_shards, NvmeParams* nvme_params)
    : layout_(wiring.layout),
      device_(wiring.device),
      comm_(wiring.communicator),
      compute_(wiring.compute_stream),
      comm_stream_(wiring.comm_stream),
      events_(wiring.events),
      dtype_(wiring.compute_dtype),
      timeline_(wiring.timeline),
      progress_(wiring.progress),
      param_shards_(param_shards),
      nvme_params_(nvme_params),
      max_live_(static_cast<std::uint64_t>(std::max<std::int64_t>(wiring.config.zero.max_live_parameters, 0))),
      offloaded_(nvme_params != nullptr || param_shards.kind != MemoryKind::device),
      gathered_(wiring.layout.units.size()),
      frees_(wiring.events),
      schedule_(wiring.layout, wiring.config.zero, wiring.single_rank_in_place && !offloaded_, wiring.stats, *this) {
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
  device_.copy_async(persistent_copies_[unit].view().slice(ul.gathered_offset(g), gl.shard), host_shard(unit, g),
                     comm_stream_);
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

void GatherCoordinator::gather(std::size_t unit, bool /*prefetched*/) {
  const UnitLayout& ul = layout_.units[unit];
  Gathered& s = gathered_[unit];
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
  const trace::Label label(fmt::format("gather {}", ul.name));
  const bool skip = comm::fault::fire(comm::fault::Kind::skip_gather, comm_.rank(), progress_.steps_done(),
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
      device_.copy_async(own, host_shard(unit, g), comm_stream_);
      timeline_.end(comm_stream_, copy);
      timeline_.add_bytes(Timeline::Lane::h2d, own.size_bytes());
      comm_.all_gather(own, full, comm_stream_);
    } else {
      comm_.all_gather(param_shards_.slice(gl.flat_offset, gl.shard), full, comm_stream_);
    }
  }
  comm_stream_.record(*s.ready);
  if (nvme_params_ != nullptr) {
    // The shards' buffer is busy until the copies pass; the disk meanwhile reads the units that come next.
    nvme_params_->copied(unit, comm_stream_);
    nvme_params_->read_ahead(schedule_.gathers_ahead(nvme_params_->buffer_count()));
  }
}

ConstBufferView GatherCoordinator::host_shard(std::size_t unit, Group g) {
  if (nvme_params_ != nullptr) return nvme_params_->shard(unit, g);
  const GroupLayout& gl = layout_.units[unit].group(g);
  return param_shards_.slice(gl.flat_offset, gl.shard);
}

void GatherCoordinator::join(std::size_t unit) {
  Gathered& s = gathered_[unit];
  // An untraced pass (held-out evaluation) is no part of a training step: its stalls would otherwise
  // land in the next step's split.
  const std::uint64_t stall = schedule_.traced() ? timeline_.begin(compute_, Timeline::Lane::gather_wait) : 0;
  compute_.wait(*s.ready);
  timeline_.end(compute_, stall);
  s.joined = true;
}

void GatherCoordinator::free(std::size_t unit, bool joined) {
  Gathered& s = gathered_[unit];
  live_padded_ -= s.buffer.count();
  // A prefetch never joined is still in use by the comm stream; anything else by the compute stream.
  frees_.release(std::move(s.buffer), joined ? compute_ : comm_stream_);
  s.joined = false;
}

BufferView GatherCoordinator::param(std::size_t param_index) const {
  const ParamLayout& p = layout_.params[param_index];
  const UnitLayout& ul = layout_.units[p.unit];
  if (schedule_.whole_here(p.unit)) {
    if (offloaded_) return persistent_copies_[p.unit].view().slice(ul.gathered_offset(p.group) + p.offset, p.numel);
    return param_shards_.slice(ul.group(p.group).flat_offset + p.offset, p.numel);
  }
  const Gathered& s = gathered_[p.unit];
  ZERO3_CHECK(s.joined && !s.buffer.empty(), "GatherCoordinator::param of a unit that is not acquired");
  return s.buffer.view().slice(ul.gathered_offset(p.group) + p.offset, p.numel);
}

void GatherCoordinator::end_window() {
  schedule_.end_window();
  if (nvme_params_ != nullptr) timeline_.add_disk(nvme_params_->take_disk_times());
  frees_.reclaim();
}

}  // namespace zero3::engine
