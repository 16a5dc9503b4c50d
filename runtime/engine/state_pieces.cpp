#include "state_pieces.hpp"

#include <algorithm>
#include <type_traits>

#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/kernels/kernels.hpp"

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
    copy_converting(device, dst.slice(b - offset, e - b), p.view.slice(b - p.offset, e - b), stream);
  }
}

void copy_into_pieces(Device& device, const StatePieces& pieces, std::size_t offset, ConstBufferView src,
                      Stream& stream) {
  const std::size_t end = offset + src.count;
  for (const StatePiece& p : pieces) {
    const std::size_t b = std::max(offset, p.offset);
    const std::size_t e = std::min(end, p.offset + p.view.count);
    if (b >= e) continue;
    copy_converting(device, p.view.slice(b - p.offset, e - b), src.slice(b - offset, e - b), stream);
  }
}

namespace {

template <typename To, typename From>
void convert_typed(To* dst, const From* src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if constexpr (std::is_same_v<To, float>) {
      dst[i] = to_float(src[i]);
    } else if constexpr (std::is_same_v<To, bf16_t>) {
      dst[i] = float_to_bf16(to_float(src[i]));
    } else {
      dst[i] = float_to_fp16(to_float(src[i]));
    }
  }
}

template <typename To>
void convert_to(To* dst, ConstBufferView src) {
  switch (src.dtype) {
    case DType::f32:
      convert_typed(dst, static_cast<const float*>(src.data), src.count);
      break;
    case DType::bf16:
      convert_typed(dst, static_cast<const bf16_t*>(src.data), src.count);
      break;
    case DType::f16:
      convert_typed(dst, static_cast<const fp16_t*>(src.data), src.count);
      break;
  }
}

}  // namespace

void convert_on_host(BufferView dst, ConstBufferView src) {
  ZERO3_CHECK(dst.count == src.count, "convert_on_host: counts differ");
  if (dst.count == 0) return;
  switch (dst.dtype) {
    case DType::f32:
      convert_to(static_cast<float*>(dst.data), src);
      break;
    case DType::bf16:
      convert_to(static_cast<bf16_t*>(dst.data), src);
      break;
    case DType::f16:
      convert_to(static_cast<fp16_t*>(dst.data), src);
      break;
  }
}

void copy_converting(Device& device, BufferView dst, ConstBufferView src, Stream& stream) {
  if (dst.dtype == src.dtype) {
    device.copy_async(dst, src, stream);
    return;
  }
  if (dst.count == 0) return;
  const bool on_host = device.caps().device_memory_on_host;
  const auto host_addressable = [&](MemoryKind k) { return on_host || k != MemoryKind::device; };
  if (host_addressable(dst.kind) && host_addressable(src.kind)) {
    stream.synchronize();  // earlier work on the stream may still write src or read dst
    convert_on_host(dst, src);
    return;
  }
  if (dst.kind == MemoryKind::device && src.kind == MemoryKind::device) {
    kernels::cast(stream, dst, src);  // no temporary: stays in stream order
    return;
  }
  // One side is device memory: the device's cast kernel, on a device copy of the other side.
  if (src.kind == MemoryKind::device) {
    Buffer tmp = device.allocate(src.count, dst.dtype, MemoryKind::device, MemCategory::workspace);
    kernels::cast(stream, tmp.view(), src);
    device.copy_async(dst, tmp.cview(), stream);
    stream.synchronize();
  } else {
    Buffer tmp = device.allocate(src.count, src.dtype, MemoryKind::device, MemCategory::workspace);
    device.copy_async(tmp.view(), src, stream);
    kernels::cast(stream, dst, tmp.cview());
    stream.synchronize();
  }
}

}  // namespace zero3::engine
