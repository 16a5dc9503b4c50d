// One tensor of the state order in a file of its own (NVMe offload): `count` elements of one dtype, element i
// at byte i * size_of(dtype). Element-granular reads and writes go through an aligned bounce buffer (a
// partial block at either end is read, patched and written back, so a write never clobbers its neighbours);
// block-aligned ranges go straight between the file and aligned memory, asynchronously, for the step's
// pipeline. The file is created (with its whole size reserved on the disk) by the constructor and removed by
// the destructor. A SwapFile may be used from several threads only when each passes its own queue and bounce
// buffer and their element ranges do not share a block. RankDirectory: the directory of one rank's files.
#pragma once

#include <cstddef>
#include <string>

#include "zero3/core/dtype.hpp"
#include "zero3/offload/aio.hpp"

namespace zero3::engine {

// The rank's directory under an NVMe path, zero3-<host>-<pid>-<n>-rank<r>: made by the constructor (IoError
// when it cannot be), removed once empty by the destructor. Before making it, directories of this host's
// jobs whose process is gone (killed before they could remove theirs) are removed with a warning, so that a
// crashed job's files do not fill the disk for good; the ranks of a job starting on one host all look, and
// each such directory is claimed by a rename before one of them removes it.
class RankDirectory {
 public:
  RankDirectory(const std::string& root, int rank);
  ~RankDirectory();
  RankDirectory(const RankDirectory&) = delete;
  RankDirectory& operator=(const RankDirectory&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class SwapFile {
 public:
  // IoError (zero3/offload/aio.hpp's DirectFile::create) when it cannot be created or reserved.
  SwapFile(const std::string& path, std::size_t count, DType dtype);
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  std::size_t count() const { return count_; }
  DType dtype() const { return dtype_; }
  const std::string& path() const { return file_.path(); }
  std::uint64_t reserved_bytes() const { return file_.size(); }

  // Elements [first, first + n) into dst / from src (host memory, any alignment), blocking, on `queue`
  // through `bounce` (grown to at most kBounceBytes plus two blocks).
  void read(offload::AioQueue& queue, offload::AlignedBuffer& bounce, std::size_t first, std::size_t n,
            void* dst) const;
  void write(offload::AioQueue& queue, offload::AlignedBuffer& bounce, std::size_t first, std::size_t n,
             const void* src);
  // Fills elements [first, first + n) with zero bytes (blocking).
  void zero(offload::AioQueue& queue, offload::AlignedBuffer& bounce, std::size_t first, std::size_t n);

  // Asynchronous, whole blocks: element `first` must start a block (first * size a multiple of
  // offload::kDirectAlign); the transfer covers n elements rounded up to whole blocks, so `buffer` (aligned)
  // must hold that many bytes. The padding past count() is the file's own (reserved, never meaningful).
  offload::AioQueue::Ticket read_blocks(offload::AioQueue& queue, std::size_t first, std::size_t n, void* buffer) const;
  offload::AioQueue::Ticket write_blocks(offload::AioQueue& queue, std::size_t first, std::size_t n,
                                         const void* buffer);

  // Asynchronous, any elements: the whole blocks covering [first, first + n) into `buffer` (aligned, holding
  // span_bytes(first, n)); element `first` lands at byte span_skip(first) of it.
  offload::AioQueue::Ticket read_span(offload::AioQueue& queue, std::size_t first, std::size_t n, void* buffer) const;
  std::size_t span_bytes(std::size_t first, std::size_t n) const;
  std::size_t span_skip(std::size_t first) const { return first * size_of(dtype_) % offload::kDirectAlign; }

  // The bounce buffer's largest span per transfer.
  static constexpr std::size_t kBounceBytes = std::size_t{16} << 20;

 private:
  std::size_t count_ = 0;
  DType dtype_ = DType::f32;
  offload::DirectFile file_;
};

}  // namespace zero3::engine
