#include "state_pieces.hpp"

#include <algorithm>

namespace zero3::engine {

const StatePieces& StateTensors::get(TensorKind kind) const {
  static const StatePieces kNone;
  switch (kind) {
    case TensorKind::master:
      return master;
    case TensorKind::exp_avg:
      return exp_avg;
    case TensorKind::exp_avg_sq:
      return exp_avg_sq;
    case TensorKind::grad:
      return grad;
    case TensorKind::param:
      break;
  }
  return kNone;
}

void copy_from_pieces(Device& device, const StatePieces& pieces, std::size_t offset, BufferView dst, Stream& stream) {
  const std::size_t end = offset + dst.count;
  for (const StatePiece& p : pieces) {
    const std::size_t b = std::max(offset, p.offset);
    const std::size_t e = std::min(end, p.offset + p.view.count);
    if (b >= e) continue;
    device.copy_async(dst.slice(b - offset, e - b), p.view.slice(b - p.offset, e - b), stream);
  }
}

void copy_into_pieces(Device& device, const StatePieces& pieces, std::size_t offset, ConstBufferView src,
                      Stream& stream) {
  const std::size_t end = offset + src.count;
  for (const StatePiece& p : pieces) {
    const std::size_t b = std::max(offset, p.offset);
    const std::size_t e = std::min(end, p.offset + p.view.count);
    if (b >= e) continue;
    device.copy_async(p.view.slice(b - p.offset, e - b), src.slice(b - offset, e - b), stream);
  }
}

}  // namespace zero3::engine
