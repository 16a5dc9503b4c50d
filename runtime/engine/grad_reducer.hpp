// Gradient buffers and their reduction. open() hands out a zero-filled full-size buffer for a unit's
// trainable group (compute dtype); reduce() takes it back when the GradScope closes and, on the comm stream
// after the compute work enqueued so far: casts to the communication dtype if it differs, reduce-scatters
// (avg) this rank's slice, and hands it to the optimizer's fp32 gradient accumulators (on the device, or copied to host
// memory for CPU offload). Persistent units are all-reduced (avg) whole instead. Large units go in pieces of at most
// reduce_bucket_size elements per collective, packed rank-major into a reusable comm buffer. Gradient buffers waiting
// for their reduction are bounded by reduce_bucket_size elements (open() waits for the oldest beyond that). Engine
// thread only.
#pragma once

#include <cstddef>

#include "deferred_free.hpp"
#include "layout.hpp"
#include "optimizer_step.hpp"
#include "wiring.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/config/config.hpp"
#include "zero3/engine/stats.hpp"

namespace zero3::engine {

class GradReducer {
 public:
  // Gradients arrive in wiring.compute_dtype (what the trainer writes) and are reduced in wiring.comm_dtype;
  // reduced pieces go to `optimizer`'s accumulators (ShardOptimizer::accumulate).
  GradReducer(const Wiring& wiring, ShardOptimizer& optimizer);

  // Blocking allocation; the zero fill is enqueued on the compute stream. Empty for a unit without
  // trainable params.
  Buffer open(std::size_t unit);
  // Non-blocking: the comm stream waits for the compute stream, then reduces `grads` into the accumulators.
  // The buffer is freed once the reduction has consumed it.
  void reduce(std::size_t unit, Buffer grads);
  // Frees consumed gradient buffers (non-blocking).
  void reclaim() { frees_.reclaim(); }
  // Elements per rank in one reduce-scatter piece.
  std::size_t piece_elems() const { return piece_; }

 private:
  void reduce_sharded(const GroupLayout& g, BufferView grads);
  void reduce_persistent(const GroupLayout& g, BufferView grads);
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
  Buffer send_;  // packed / cast send buffer
  Buffer recv_;  // this rank's reduced piece
  DeferredFrees frees_;
};

}  // namespace zero3::engine
