#include "zero3/device/device.hpp"

#include <fmt/format.h>

#include <utility>

#include "zero3/core/log.hpp"

namespace zero3 {

DeviceCaps device_caps(DeviceKind kind) {
  if (kind == DeviceKind::host) {
    return {.host_staging = MemoryKind::pageable_host, .pins_by_mlock = true, .device_memory_on_host = true};
  }
  return {.host_staging = MemoryKind::pinned_host, .pins_by_mlock = false, .device_memory_on_host = false};
}

Buffer::Buffer(Buffer&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      dtype_(other.dtype_),
      kind_(other.kind_),
      category_(other.category_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    owner_ = std::exchange(other.owner_, nullptr);
    ptr_ = std::exchange(other.ptr_, nullptr);
    count_ = std::exchange(other.count_, 0);
    dtype_ = other.dtype_;
    kind_ = other.kind_;
    category_ = other.category_;
  }
  return *this;
}

Buffer::~Buffer() {
  reset();
}

void Buffer::reset() noexcept {
  if (owner_ != nullptr && ptr_ != nullptr) owner_->release(*this);
  owner_ = nullptr;
  ptr_ = nullptr;
  count_ = 0;
}

Buffer Device::allocate(std::size_t count, DType dtype, MemoryKind kind, MemCategory category) {
  if (count == 0) return Buffer(nullptr, nullptr, 0, dtype, kind, category);
  const std::size_t size_bytes = count * size_of(dtype);
  if (size_bytes / size_of(dtype) != count) {
    throw OutOfMemory(fmt::format("cannot allocate {} elements of {} ({} memory): the size in bytes overflows", count,
                                  dtype_name(dtype), memory_kind_name(kind)));
  }
  void* p = do_allocate(size_bytes, kind, category);
  memory_.on_alloc(kind, category, size_bytes);
  return Buffer(this, p, count, dtype, kind, category);
}

void Device::release(Buffer& b) noexcept {
  // Account first, free second (allocate does the mirror image): the tracker then never reports more than
  // is really allocated, so a concurrent allocation that reuses the memory cannot push a peak past a cap.
  memory_.on_free(b.kind_, b.category_, b.size_bytes());
  do_free(b.ptr_, b.size_bytes(), b.kind_, b.category_);
}

}  // namespace zero3
