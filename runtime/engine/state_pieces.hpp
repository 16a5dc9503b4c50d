// A flat array of the layout's state order (layout.state_count elements) held in pieces: one device
// buffer, host chunks (CPU offload), or both (partial offload), and copies between such an array and one
// contiguous view. Engine thread only; copies are enqueued on the stream given.
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
void copy_from_pieces(Device& device, const StatePieces& pieces, std::size_t offset, BufferView dst, Stream& stream);
// Enqueues on `stream` copies of src into elements [offset, offset + src.count) of `pieces`.
void copy_into_pieces(Device& device, const StatePieces& pieces, std::size_t offset, ConstBufferView src,
                      Stream& stream);

}  // namespace zero3::engine
