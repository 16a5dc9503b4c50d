// Gradient buffers and their reduction. open() hands out a zero-filled full-size buffer for a unit's
// trainable group (compute dtype); reduce() takes it back when the GradScope closes and, on the comm stream
// after the compute work enqueued so far: casts to the communication dtype if it differs, reduce-scatters
// (avg) this rank's slice, and hands it to the optimizer's fp32 gradient accumulators (on the device, or copied to host
// memory for CPU offload). Persistent units are all-reduced (avg) whole instead. Large units go in pieces of at most
// reduce_bucket_size elements per collective, packed rank-major into a reusable comm buffer. Gradient buffers waiting
// for their reduction are bounded: the previous unit's at most, and reduce_bucket_size elements (open() waits
// for the oldest beyond that).
// At world size 1 (Wiring::single_rank_in_place) no collective runs: the average over one rank is the gradient, so
// it goes to the accumulators as it is (cast to the communication dtype first when that differs); with fp32
// gradients and accumulators in device memory, a unit's first GradScope of a window is the accumulator range
// itself, which is zero there, so nothing is filled, copied or added. Engine thread only.
#pragma once

#include <cstddef>
#include <vector>

#include "deferred_free.hpp"
#include "layout.hpp"
#include "optimizer_step.hpp"
#include "wiring.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/stats.hpp"

namespace zero3::engine {

// Elements per rank in one reduce-scatter piece: reduce_bucket_size over the ranks, rounded down to the
// alignment (at least one alignment unit).
std::size_t reduce_piece_elems(int world_size, std::int64_t reduce_bucket_size);

// A GradScope's gradients: a buffer of its own, or (in place) the unit's accumulator range.
struct GradBuffer {
  Buffer owned;     // empty in place
  BufferView view;  // what the trainer writes: the unit's trainable group, padded
  bool in_place = false;
};

class GradReducer {
 public:
  // Gradients arrive in wiring.compute_dtype (what the trainer writes) and are reduced in wiring.comm_dtype;
  // reduced pieces go to `optimizer`'s accumulators (ShardOptimizer::accumulate).
  GradReducer(const Wiring& wiring, ShardOptimizer& optimizer);

  // Blocking allocation; the zero fill is enqueued on the compute stream (in place: neither). Empty for a
  // unit without trainable params.
  GradBuffer open(std::size_t unit);
  // Non-blocking: the comm stream waits for the compute stream, then reduces `grads` into the accumulators.
  // The buffer is freed once the reduction has consumed it. In place: nothing to do (the step's join with
  // the compute stream orders what was written before the accumulators are read).
  void reduce(std::size_t unit, GradBuffer grads);
  // The accumulators were zeroed (the boundary's step, applied or not): the next window's first GradScope
  // of each unit may be in place again.
  void accumulators_cleared();
  // Frees consumed gradient buffers (non-blocking).
  void reclaim() {
    frees_.reclaim();
    grad_frees_.reclaim();
  }
  // Elements per rank in one reduce-scatter piece.
  std::size_t piece_elems() const { return piece_; }

 private:
  void reduce_sharded(const GroupLayout& g, BufferView grads);
  void reduce_persistent(const GroupLayout& g, BufferView grads);
  // World size 1: this rank's gradients are the average; into the accumulators in comm-dtype pieces.
  void accumulate_single_rank(const GroupLayout& g, BufferView grads);
  // A comm-dtype scratch of at least `count` elements (grown on demand; stream order protects reuse).
  BufferView scratch(Buffer& buffer, std::size_t count);

  const Layout& layout_;
  Device& device_;
  comm::Communicator& comm_;
  Stream& compute_;
  Stream& comm_stream_;
  DType dtype_;
  DType comm_dtype_;
  EngineStats& stats_;
  ShardOptimizer& optimizer_;
  std::size_t piece_ = 0;        // per-rank elements of one reduce-scatter
  std::size_t max_pending_ = 0;  // gradient elements allowed to wait for their reduction
  std::unique_ptr<Event> compute_done_;
  Buffer send_;                  // packed / cast send buffer
  Buffer recv_;                  // this rank's reduced piece
  DeferredFrees frees_;          // outgrown scratch
  DeferredFrees grad_frees_;     // gradient buffers, once their reduction has read them
  bool single_rank_ = false;     // world size 1: no collectives
  bool in_place_grads_ = false;  // single rank, fp32 gradients and communication
  std::vector<bool> written_;    // per unit: its accumulator range was written this window
};

}  // namespace zero3::engine
