// EngineState (zero3/engine/state.hpp), the engine's checkpoint support: this rank's part of the params and
// the optimizer state moved to and from host memory by param name and element range. The shards are never
// gathered: each slice maps to one run of the rank's flat buffers.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "engine_impl.hpp"
#include "zero3/core/error.hpp"

namespace zero3 {

std::string_view tensor_kind_name(TensorKind kind) {
  switch (kind) {
    case TensorKind::param:
      return "param";
    case TensorKind::master:
      return "master";
    case TensorKind::exp_avg:
      return "exp_avg";
    case TensorKind::exp_avg_sq:
      return "exp_avg_sq";
    case TensorKind::grad:
      return "grad";
  }
  return "?";
}

namespace {

// Where a slice sits in the rank's flat buffers: the element offset into the param shards, which is also
// the offset into the state-order buffers for a trainable param (trainable groups come first in both).
struct SliceLocation {
  std::size_t flat = 0;
  bool frozen = false;
};

SliceLocation locate(const engine::Layout& layout, const ParamSlice& slice, std::string_view call) {
  const auto pi = layout.find_param(slice.param);
  if (!pi) throw UsageError(fmt::format("{}: no param named '{}'", call, slice.param));
  const engine::ParamLayout& p = layout.params[*pi];
  const engine::GroupLayout& g = layout.units[p.unit].group(p.group);
  const std::size_t begin = p.offset + slice.first;  // in the group's flat buffer
  // An empty slice names no element: every rank keeps it (local_slices lists a zero-size param on every
  // rank, and on rank 0 when owned, wherever the param's offset falls).
  if (slice.count == 0 && slice.first <= p.numel) return {0, p.group == engine::Group::frozen};
  if (slice.first + slice.count > p.numel || begin < g.shard_begin || begin + slice.count > g.shard_begin + g.shard) {
    throw UsageError(fmt::format(
        "{}: elements [{}, {}) of '{}' ({} elements) are not all kept by rank {} (it keeps [{}, {}) of the flat "
        "group)",
        call, slice.first, slice.first + slice.count, slice.param, p.numel, layout.rank, g.shard_begin,
        g.shard_begin + g.shard));
  }
  return {g.flat_offset + (begin - g.shard_begin), p.group == engine::Group::frozen};
}

}  // namespace

std::vector<ParamSlice> EngineState::local_slices(bool owned) const {
  const Engine::Impl& impl = *engine_->impl_;
  if (!impl.layout) throw UsageError("local_slices() before finalize()");
  const engine::Layout& layout = *impl.layout;
  std::vector<ParamSlice> out;
  for (const engine::UnitLayout& u : layout.units) {
    if (u.persistent && owned && layout.rank != 0) continue;
    for (const std::size_t pi : u.params) {
      const engine::ParamLayout& p = layout.params[pi];
      const engine::GroupLayout& g = u.group(p.group);
      const bool trainable = p.group == engine::Group::trainable;
      if (p.numel == 0) {  // recorded once (rank 0) so that a checkpoint names every param
        if (!owned || layout.rank == 0) out.push_back({p.spec.name, 0, 0, trainable});
        continue;
      }
      const engine::SliceOverlap o = engine::overlap(p, g.shard_begin, g.shard);
      if (o.count == 0) continue;
      out.push_back({p.spec.name, o.param_first, o.count, trainable});
    }
  }
  return out;
}

std::size_t EngineState::state_bytes(TensorKind kind, std::span<const ParamSlice> slices) const {
  std::size_t elems = 0;
  for (const ParamSlice& s : slices) elems += s.count;
  return elems * (kind == TensorKind::param ? size_of(engine_->impl_->dtype) : sizeof(float));
}

void Engine::Impl::check_state_source(TensorKind kind, const ParamSlice& slice, bool frozen,
                                      std::string_view call) const {
  if (kind == TensorKind::param) return;
  if (kind == TensorKind::grad) throw UsageError(fmt::format("{}: gradients are not part of a checkpoint", call));
  if (frozen) {
    throw UsageError(fmt::format("{}('{}', {}): the param is frozen: it has no optimizer state", call, slice.param,
                                 tensor_kind_name(kind)));
  }
  if (!optimizer_step->optimizer().keeps(kind)) {
    throw UsageError(fmt::format("{}: the {} optimizer keeps no {}", call, config::to_string(config.optimizer->type),
                                 tensor_kind_name(kind)));
  }
}

void Engine::Impl::check_boundary(std::string_view call) const {
  if (!layout) throw UsageError(fmt::format("{} before finalize()", call));
  if (!scopes.empty() || micro_steps != 0) {
    throw UsageError(fmt::format(
        "{}: only at an accumulation boundary with no scope open ({} micro-step(s) into the window, {} scope(s) "
        "open)",
        call, micro_steps, scopes.size()));
  }
}

void EngineState::read_state(TensorKind kind, std::span<const ParamSlice> slices, std::span<std::byte> out) const {
  Engine::Impl& impl = *engine_->impl_;
  impl.check_call("read_state", true);
  impl.check_boundary("read_state");
  const std::size_t elem = kind == TensorKind::param ? size_of(impl.dtype) : sizeof(float);
  if (out.size() != state_bytes(kind, slices)) {
    throw UsageError(fmt::format("read_state: {} bytes given for {} bytes of {}", out.size(), state_bytes(kind, slices),
                                 tensor_kind_name(kind)));
  }
  engine::ShardOptimizer& optimizer = impl.optimizer_step->optimizer();
  impl.comm_stream->synchronize();  // every step and reduction enqueued so far
  optimizer.prepare_read();
  std::size_t at = 0;
  for (const ParamSlice& s : slices) {
    const SliceLocation loc = locate(*impl.layout, s, "read_state");
    impl.check_state_source(kind, s, loc.frozen, "read_state");
    if (s.count > 0) {
      const BufferView dst{out.data() + at, static_cast<std::size_t>(s.count),
                           kind == TensorKind::param ? impl.dtype : DType::f32, MemoryKind::pageable_host};
      if (kind == TensorKind::param) {
        impl.read_params(loc.flat, dst);
      } else {
        optimizer.copy_out(*impl.device, kind, loc.flat, dst, *impl.comm_stream);
      }
    }
    at += s.count * elem;
  }
  impl.comm_stream->synchronize();
}

void EngineState::write_state(TensorKind kind, std::span<const ParamSlice> slices,
                              std::span<const std::byte> in) const {
  Engine::Impl& impl = *engine_->impl_;
  impl.check_call("write_state", true);
  impl.check_boundary("write_state");
  const std::size_t elem = kind == TensorKind::param ? size_of(impl.dtype) : sizeof(float);
  if (in.size() != state_bytes(kind, slices)) {
    throw UsageError(fmt::format("write_state: {} bytes given for {} bytes of {}", in.size(), state_bytes(kind, slices),
                                 tensor_kind_name(kind)));
  }
  engine::ShardOptimizer& optimizer = impl.optimizer_step->optimizer();
  impl.comm_stream->synchronize();
  optimizer.prepare_read();
  std::size_t at = 0;
  for (const ParamSlice& s : slices) {
    const SliceLocation loc = locate(*impl.layout, s, "write_state");
    impl.check_state_source(kind, s, loc.frozen, "write_state");
    if (s.count > 0) {
      const ConstBufferView src{in.data() + at, static_cast<std::size_t>(s.count),
                                kind == TensorKind::param ? impl.dtype : DType::f32, MemoryKind::pageable_host};
      if (kind == TensorKind::param) {
        impl.write_params(loc.flat, src);
      } else {
        optimizer.copy_in(*impl.device, kind, loc.flat, src, *impl.comm_stream);
      }
    }
    at += s.count * elem;
  }
  if (kind == TensorKind::param) impl.coordinator->refresh_persistent(/*frozen_too=*/true);
  impl.comm_stream->synchronize();
  // Compute work after this reads what was written (persistent units are read in place).
  impl.comm_stream->record(*impl.step_done);
  impl.compute->wait(*impl.step_done);
}

bool EngineState::keeps_state(TensorKind kind) const {
  const Engine::Impl& impl = *engine_->impl_;
  if (!impl.optimizer_step) throw UsageError("keeps_state() before finalize()");
  if (kind == TensorKind::param || kind == TensorKind::master) return true;
  return impl.optimizer_step->optimizer().keeps(kind);
}

TrainingState EngineState::training_state() const {
  const Engine::Impl& impl = *engine_->impl_;
  if (!impl.optimizer_step) throw UsageError("training_state() before finalize()");
  TrainingState s;
  s.global_step = impl.global_step;
  s.skipped_steps = impl.skipped_steps;
  impl.optimizer_step->fill_state(s);
  return s;
}

void EngineState::restore_training_state(const TrainingState& state) const {
  Engine::Impl& impl = *engine_->impl_;
  impl.check_call("restore_training_state", true);
  impl.check_boundary("restore_training_state");
  if (state.global_step < 0 || state.skipped_steps < 0 || state.skipped_steps > state.global_step ||
      state.applied_steps < 0 || !(state.loss_scale > 0.0)) {
    throw UsageError(fmt::format(
        "restore_training_state: inconsistent state (global_step {}, skipped_steps {}, applied_steps {}, loss "
        "scale {})",
        state.global_step, state.skipped_steps, state.applied_steps, state.loss_scale));
  }
  impl.global_step = state.global_step;
  impl.skipped_steps = state.skipped_steps;
  impl.optimizer_step->restore_state(state);
}

}  // namespace zero3
