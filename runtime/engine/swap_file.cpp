#include "swap_file.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "zero3/core/error.hpp"

namespace zero3::engine {

namespace {

using offload::kDirectAlign;

std::uint64_t align_down(std::uint64_t n) {
  return n / kDirectAlign * kDirectAlign;
}

// Elements per bounce transfer: kBounceBytes, whole blocks.
std::size_t bounce_elems(std::size_t elem) {
  return SwapFile::kBounceBytes / elem;
}

offload::AlignedBuffer& ensure(offload::AlignedBuffer& bounce, std::size_t bytes) {
  if (bounce.size() < bytes) bounce = offload::AlignedBuffer(bytes);
  return bounce;
}

}  // namespace

SwapFile::SwapFile(const std::string& path, std::size_t count, DType dtype)
    : count_(count), dtype_(dtype), file_(offload::DirectFile::create(path, std::uint64_t{count} * size_of(dtype))) {}

SwapFile::~SwapFile() {
  if (!file_.path().empty()) ::unlink(file_.path().c_str());
}

void SwapFile::read(offload::AioQueue& queue, offload::AlignedBuffer& bounce, std::size_t first, std::size_t n,
                    void* dst) const {
  ZERO3_CHECK(first + n <= count_, fmt::format("SwapFile::read past the end of {}", path()));
  const std::size_t elem = size_of(dtype_);
  const std::size_t per = bounce_elems(elem);
  for (std::size_t done = 0; done < n;) {
    const std::size_t m = std::min(per, n - done);
    const std::uint64_t b = std::uint64_t{first + done} * elem;
    const std::uint64_t lo = align_down(b);
    const std::uint64_t hi = offload::direct_align_up(b + std::uint64_t{m} * elem);
    ensure(bounce, hi - lo);
    queue.wait(queue.read(file_, lo, bounce.data(), hi - lo));
    std::memcpy(static_cast<std::byte*>(dst) + done * elem, bounce.data() + (b - lo), m * elem);
    done += m;
  }
}

void SwapFile::write(offload::AioQueue& queue, offload::AlignedBuffer& bounce, std::size_t first, std::size_t n,
                     const void* src) {
  ZERO3_CHECK(first + n <= count_, fmt::format("SwapFile::write past the end of {}", path()));
  const std::size_t elem = size_of(dtype_);
  const std::size_t per = bounce_elems(elem);
  for (std::size_t done = 0; done < n;) {
    const std::size_t m = std::min(per, n - done);
    const std::uint64_t b = std::uint64_t{first + done} * elem;
    const std::uint64_t e = b + std::uint64_t{m} * elem;
    const std::uint64_t lo = align_down(b);
    const std::uint64_t hi = offload::direct_align_up(e);
    std::byte* buf = ensure(bounce, hi - lo).data();
    // The blocks this range shares with its neighbours: read first, so their other bytes are written back as
    // they are.
    if (b != lo) queue.wait(queue.read(file_, lo, buf, kDirectAlign));
    if (e != hi && (hi - kDirectAlign > lo || b == lo)) {
      queue.wait(queue.read(file_, hi - kDirectAlign, buf + (hi - kDirectAlign - lo), kDirectAlign));
    }
    if (src != nullptr) {
      std::memcpy(buf + (b - lo), static_cast<const std::byte*>(src) + done * elem, m * elem);
    } else {
      std::memset(buf + (b - lo), 0, m * elem);
    }
    queue.wait(queue.write(file_, lo, buf, hi - lo));
    done += m;
  }
}

void SwapFile::zero(offload::AioQueue& queue, offload::AlignedBuffer& bounce, std::size_t first, std::size_t n) {
  write(queue, bounce, first, n, nullptr);
}

offload::AioQueue::Ticket SwapFile::read_blocks(offload::AioQueue& queue, std::size_t first, std::size_t n,
                                                void* buffer) const {
  const std::uint64_t b = std::uint64_t{first} * size_of(dtype_);
  ZERO3_CHECK(b % kDirectAlign == 0 && first + n <= count_, "SwapFile::read_blocks: unaligned or past the end");
  return queue.read(file_, b, buffer, offload::direct_align_up(std::uint64_t{n} * size_of(dtype_)));
}

offload::AioQueue::Ticket SwapFile::write_blocks(offload::AioQueue& queue, std::size_t first, std::size_t n,
                                                 const void* buffer) {
  const std::uint64_t b = std::uint64_t{first} * size_of(dtype_);
  ZERO3_CHECK(b % kDirectAlign == 0 && first + n <= count_, "SwapFile::write_blocks: unaligned or past the end");
  return queue.write(file_, b, buffer, offload::direct_align_up(std::uint64_t{n} * size_of(dtype_)));
}

}  // namespace zero3::engine
