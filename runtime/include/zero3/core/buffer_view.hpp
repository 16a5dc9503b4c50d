// Non-owning views of memory that carry their element type, element count and memory kind, so a byte
// count can never be passed where an element count belongs. Owners (Buffer) live in device/.
#pragma once

#include <cstddef>

#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/memory.hpp"

namespace zero3 {

struct BufferView {
  void* data = nullptr;
  std::size_t count = 0;  // elements, not bytes
  DType dtype = DType::f32;
  MemoryKind kind = MemoryKind::device;

  std::size_t size_bytes() const { return count * size_of(dtype); }
  // Elements [offset, offset + n).
  BufferView slice(std::size_t offset, std::size_t n) const {
    ZERO3_CHECK(offset + n <= count, "BufferView::slice out of range");
    return {static_cast<char*>(data) + offset * size_of(dtype), n, dtype, kind};
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

struct ConstBufferView {
  const void* data = nullptr;
  std::size_t count = 0;
  DType dtype = DType::f32;
  MemoryKind kind = MemoryKind::device;

  ConstBufferView() = default;
  ConstBufferView(const void* d, std::size_t n, DType t, MemoryKind k) : data(d), count(n), dtype(t), kind(k) {}
  ConstBufferView(const BufferView& v)  // NOLINT(google-explicit-constructor): views narrow implicitly
      : data(v.data), count(v.count), dtype(v.dtype), kind(v.kind) {}

  std::size_t size_bytes() const { return count * size_of(dtype); }
  ConstBufferView slice(std::size_t offset, std::size_t n) const {
    ZERO3_CHECK(offset + n <= count, "ConstBufferView::slice out of range");
    return {static_cast<const char*>(data) + offset * size_of(dtype), n, dtype, kind};
  }
  template <typename T>
  const T* as() const {
    return static_cast<const T*>(data);
  }
};

}  // namespace zero3
