// A flat array of the layout's state order (layout.state_count elements) held in pieces: one device
// buffer, host chunks (CPU offload), or both (partial offload), and copies between such an array and one
// contiguous view. The pieces of one tensor share a dtype, which may differ from the view's (16-bit master
// weights and moments copied out as fp32): such copies convert, rounding to nearest even when narrowing.
// Engine thread only; copies are enqueued on the stream given.
#pragma once

#include <cstddef>
#include <vector>

#include "zero3/core/buffer_view.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/state.hpp"

namespace zero3::engine {

// Sorted by offset, disjoint, covering [0, state_count) when the
// tensor exists; empty when it does not.
struct StatePiece {
  std::size_t offset = 0;
  BufferView view;
};
using StatePieces = std::vector<StatePiece>;

// The state-order tensors of a ShardOptimizer, looked up by kind (an empty set for a kind it lacks).
struct StateTensors {
  StatePieces master;
  StatePieces exp_avg;
  StatePieces exp_avg_sq;
  StatePieces grad;  // the fp32 gradient accumulators
  const StatePieces& get(TensorKind kind) const;
};

// Enqueues on `stream` copies of elements [offset, offset + dst.count) of `pieces` into dst (any memory kinds).
// Where a piece's dtype differs from dst's, that piece's copy converts and blocks until it is done.
void copy_from_pieces(Device& device, const StatePieces& pieces, std::size_t offset, BufferView dst, Stream& stream);
// Enqueues on `stream` copies of src into elements [offset, offset + src.count) of `pieces` (converting and
// blocking as copy_from_pieces does).
void copy_into_pieces(Device& device, const StatePieces& pieces, std::size_t offset, ConstBufferView src,
                      Stream& stream);

// dst = src converted (counts equal, any dtypes, any memory kinds): a plain copy_async in stream order when
// the dtypes match, and the device's cast kernel when both are device memory. Otherwise it blocks: converted
// on the host after the work on `stream` where the host can address both sides, else through a workspace
// buffer on the device. Conversions are off the training path (init, state reads and writes, checkpoints, the
// non-finite report), so they block rather than keep temporaries alive behind the stream.
void copy_converting(Device& device, BufferView dst, ConstBufferView src, Stream& stream);
// dst = src converted element by element on the calling thread (host-addressable memory, counts equal).
void convert_on_host(BufferView dst, ConstBufferView src);

}  // namespace zero3::engine
