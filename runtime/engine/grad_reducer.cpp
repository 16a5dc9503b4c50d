#include "grad_reducer.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "zero3/comm/watchdog.hpp"
#include "zero3/core/trace.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::engine {

std::size_t reduce_piece_elems(int world_size, std::int64_t reduce_bucket_size) {
  // reduce_bucket_size elements per collective: W pieces of this many, rounded down to the alignment.
  const auto w = static_cast<std::size_t>(std::max(world_size, 1));
  const auto bucket = static_cast<std::size_t>(std::max<std::int64_t>(reduce_bucket_size, 0));
  return std::max(kAlignElems, bucket / w / kAlignElems * kAlignElems);
}

GradReducer::GradReducer(const Wiring& wiring, ShardOptimizer& optimizer)
    : layout_(wiring.layout),
      device_(wiring.device),
      comm_(wiring.communicator),
      compute_(wiring.compute_stream),
      comm_stream_(wiring.comm_stream),
      dtype_(wiring.compute_dtype),
      comm_dtype_(wiring.comm_dtype),
      stats_(wiring.stats),
      optimizer_(optimizer),
      compute_done_(wiring.events.acquire()),
      frees_(wiring.events),
      grad_frees_(wiring.events) {
  piece_ = reduce_piece_elems(layout_.world_size, wiring.config.zero.reduce_bucket_size);
  max_pending_ = static_cast<std::size_t>(std::max<std::int64_t>(wiring.config.zero.reduce_bucket_size, 0));
  single_rank_ = wiring.single_rank_in_place;
  in_place_grads_ = single_rank_ && dtype_ == DType::f32 && comm_dtype_ == DType::f32;
  written_.assign(layout_.units.size(), false);
}

GradBuffer GradReducer::open(std::size_t unit) {
  const UnitLayout& ul = layout_.units[unit];
  const GroupLayout& g = ul.group(Group::trainable);
  if (in_place_grads_ && !written_[unit] && g.padded > 0) {
    // Zero since the last clear_grads(), and the compute stream waited for that step: written as is, the
    // gradients are already what one rank's reduction and accumulation would leave there.
    const BufferView acc = optimizer_.device_accumulator(g.flat_offset, g.padded);
    if (acc.count == g.padded) {
      written_[unit] = true;
      return {Buffer{}, acc, true};
    }
  }
  // A backward ahead of its reductions would pile up gradient buffers. At most the previous unit's may still
  // be reducing when this one's is made: anything older is waited for (it has had a unit's compute to
  // finish, so normally nothing is), and the oldest while more than reduce_bucket_size elements wait. The
  // gradient buffers' peak is then two units' whatever the reductions' timing (the memory plan's bound).
  frees_.reclaim();
  grad_frees_.reclaim();
  while (grad_frees_.pending_count() > 1 && grad_frees_.reclaim_oldest()) {
  }
  while (grad_frees_.pending_elems() > max_pending_ && grad_frees_.reclaim_oldest()) {
  }
  Buffer grads = device_.allocate(g.padded, dtype_, MemoryKind::device, MemCategory::grad_buffer);
  if (!grads.empty()) kernels::fill(compute_, grads.view(), 0.0f);
  const BufferView view = grads.view();
  return {std::move(grads), view, false};
}

void GradReducer::accumulators_cleared() {
  written_.assign(written_.size(), false);
}

BufferView GradReducer::scratch(Buffer& buffer, std::size_t count) {
  if (buffer.count() < count) {
    frees_.release(std::move(buffer), comm_stream_);  // earlier pieces may still be reading it
    buffer = device_.allocate(count, comm_dtype_, MemoryKind::device, MemCategory::comm_buffer);
  }
  return buffer.view().slice(0, count);
}

void GradReducer::reduce(std::size_t unit, GradBuffer grads) {
  if (grads.in_place || grads.owned.empty()) return;
  written_[unit] = true;
  const UnitLayout& ul = layout_.units[unit];
  const GroupLayout& g = ul.group(Group::trainable);
  // The reduction reads what the compute stream wrote: everything enqueued there so far.
  compute_.record(*compute_done_);
  comm_stream_.wait(*compute_done_);
  const comm::ScopedOpAnnotation note("reduce", ul.name);
  const trace::Label label(fmt::format("reduce {}", ul.name));
  if (single_rank_) {
    accumulate_single_rank(g, grads.view);
  } else if (ul.persistent) {
    reduce_persistent(g, grads.view);
    stats_.all_reduce_elems += g.numel;
  } else {
    reduce_sharded(g, grads.view);
    stats_.reduce_scatter_elems += g.numel;
  }
  grad_frees_.release(std::move(grads.owned), comm_stream_);
  grad_frees_.reclaim();
  frees_.reclaim();
}

void GradReducer::accumulate_single_rank(const GroupLayout& g, BufferView grads) {
  if (comm_dtype_ == dtype_) {
    optimizer_.accumulate(g.flat_offset, grads.slice(0, g.shard), comm_stream_);
    return;
  }
  // The collective would round to the communication dtype: so does this, a piece at a time.
  for (std::size_t a = 0; a < g.shard; a += piece_) {
    const std::size_t n = std::min(piece_, g.shard - a);
    const BufferView cast = scratch(send_, n);
    kernels::cast(comm_stream_, cast, grads.slice(a, n));
    optimizer_.accumulate(g.flat_offset + a, cast, comm_stream_);
  }
}

void GradReducer::reduce_sharded(const GroupLayout& g, BufferView grads) {
  const auto w = static_cast<std::size_t>(layout_.world_size);
  const std::size_t s = g.shard;
  if (s <= piece_) {
    // The whole group in one collective: the grad buffer is already rank-major.
    ConstBufferView send = grads;
    if (comm_dtype_ != dtype_) {
      const BufferView cast = scratch(send_, w * s);
      kernels::cast(comm_stream_, cast, grads);
      send = cast;
    }
    const BufferView recv = scratch(recv_, s);
    comm_.reduce_scatter(send, recv, comm::ReduceOp::avg, comm_stream_);
    optimizer_.accumulate(g.flat_offset, recv, comm_stream_);
    return;
  }
  // Pieces [a, a + n) of every rank's slice, packed rank-major so one reduce-scatter hands rank q its part.
  for (std::size_t a = 0; a < s; a += piece_) {
    const std::size_t n = std::min(piece_, s - a);
    const BufferView send = scratch(send_, w * n);
    for (std::size_t q = 0; q < w; ++q) {
      const ConstBufferView src = grads.slice(q * s + a, n);
      if (comm_dtype_ == dtype_) {
        device_.copy_async(send.slice(q * n, n), src, comm_stream_);
      } else {
        kernels::cast(comm_stream_, send.slice(q * n, n), src);
      }
    }
    const BufferView recv = scratch(recv_, n);
    comm_.reduce_scatter(send, recv, comm::ReduceOp::avg, comm_stream_);
    optimizer_.accumulate(g.flat_offset + a, recv, comm_stream_);
  }
}

void GradReducer::reduce_persistent(const GroupLayout& g, BufferView grads) {
  const std::size_t limit = piece_ * static_cast<std::size_t>(layout_.world_size);
  for (std::size_t a = 0; a < g.numel; a += limit) {
    const std::size_t n = std::min(limit, g.numel - a);
    BufferView data = grads.slice(a, n);
    if (comm_dtype_ != dtype_) {
      const BufferView cast = scratch(send_, n);
      kernels::cast(comm_stream_, cast, data);
      data = cast;
    }
    comm_.all_reduce(data, comm::ReduceOp::avg, comm_stream_);
    optimizer_.accumulate(g.flat_offset + a, data, comm_stream_);
  }
}

}  // namespace zero3::engine
