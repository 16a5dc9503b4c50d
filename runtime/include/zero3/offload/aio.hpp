// Direct, asynchronous file I/O for NVMe offload: files opened with O_DIRECT (no page cache: the state is
// written once per step and read once per step, so caching it would only evict the rest of the machine's
// memory) and a queue that keeps up to queue_depth block-sized requests in flight, on io_uring (liburing).
// Knows nothing of the engine.
//
//   zero3::offload::DirectFile f = zero3::offload::DirectFile::create("/nvme/job/rank0/master.f32", bytes);
//   zero3::offload::AioQueue q({.block_size = 1 << 20, .queue_depth = 8});
//   zero3::offload::AlignedBuffer buf(64 << 20);
//   const auto t = q.read(f, 0, buf.data(), buf.size());   // returns at once
//   ...                                                     // CPU work overlaps the read
//   q.wait(t);                                              // IoError naming file and offset on failure
//
// Alignment: every offset, length and buffer address handed to a queue is a multiple of kDirectAlign.
// Errors are IoError (zero3/core/error.hpp) whose message names the file, the byte offset of the request
// that failed and the system's reason (strerror) or "short read: got X of Y bytes"; a request that ends
// short is retried for its remainder before it counts as failed (the kernel may split O_DIRECT transfers),
// and a read that returns 0 bytes (end of file) is a short read. Where io_uring cannot be used (an old
// kernel, or a container whose seccomp profile forbids it: io_uring_queue_init fails with ENOSYS or EPERM;
// or a kernel before 5.6 without the read/write opcodes), the queue runs the same requests with
// pread/pwrite on intra_op_parallelism threads instead and says so in backend(); io_uring_queue_init failing
// otherwise (ENOMEM: the memlock limit of kernels before 5.12) is an IoError. One thread drives a queue (its
// owner); queues on different threads are independent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace zero3::offload {

// The alignment O_DIRECT needs here: offsets, lengths and addresses (the largest logical block size of
// common NVMe and SATA devices; 512-byte devices accept it too).
inline constexpr std::size_t kDirectAlign = 4096;

// Rounds n up to a multiple of kDirectAlign.
constexpr std::uint64_t direct_align_up(std::uint64_t n) {
  return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
}

// Host memory aligned to kDirectAlign (pageable; move-only; zero-filled). size is rounded up to kDirectAlign.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t size);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

// One file opened O_RDWR | O_DIRECT | O_CLOEXEC, owned (closed by the destructor; move-only). The path is
// kept for messages.
class DirectFile {
 public:
  // Creates the file (truncating one that exists) and reserves size_bytes (rounded up to kDirectAlign) on
  // the disk with fallocate, so that a full disk is found here and not in the middle of a step. IoError,
  // naming the path: cannot create (strerror), "does not support O_DIRECT" (open fails with EINVAL: tmpfs
  // before Linux 6.6 and some network file systems), "not enough space: N bytes needed, M bytes free"
  // (ENOSPC or EFBIG, with the free bytes from statvfs; EFBIG also names the file size limit). When the
  // reservation fails the file is removed (it was created or emptied here). Where the file system has no
  // fallocate (EOPNOTSUPP) the file is only sized (ftruncate): a full disk then shows at the first write.
  static DirectFile create(const std::string& path, std::uint64_t size_bytes);
  // Grows the reservation to at least size_bytes (rounded up); never shrinks. Same errors as create.
  void reserve(std::uint64_t size_bytes);

  DirectFile() = default;
  ~DirectFile();
  DirectFile(DirectFile&& other) noexcept;
  DirectFile& operator=(DirectFile&& other) noexcept;
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  std::uint64_t size() const { return size_; }  // bytes reserved

 private:
  int fd_ = -1;
  std::string path_;
  std::uint64_t size_ = 0;
};

// The aio block's settings (DeepSpeed's meaning). single_submit: submit each request as it is queued
// instead of in batches; overlap_events: keep submitting while completions are outstanding (false: submit a
// batch, wait for all of it, then the next). Both apply to io_uring only; the pread/pwrite threads take
// one request each as they come free.
struct AioOptions {
  std::size_t block_size = std::size_t{1} << 20;  // bytes per request (a multiple of kDirectAlign)
  int queue_depth = 8;                            // requests in flight
  int intra_op_parallelism = 1;                   // threads of the pread/pwrite fallback
  bool single_submit = false;
  bool overlap_events = true;
  bool force_threads = false;  // use the pread/pwrite threads even where io_uring works (tests)
};

class AioQueue {
 public:
  using Ticket = std::uint64_t;

  // UsageError for block_size not a positive multiple of kDirectAlign, queue_depth < 1 or
  // intra_op_parallelism < 1.
  explicit AioQueue(const AioOptions& options);
  ~AioQueue();  // waits for every request still in flight (errors are dropped: the owner is unwinding)
  AioQueue(const AioQueue&) = delete;
  AioQueue& operator=(const AioQueue&) = delete;

  // Queue a transfer of bytes between [offset, offset + bytes) of file and buf, split into block_size
  // requests; returns at once, whatever the size: the requests beyond the queue_depth in flight wait in the
  // queue's list, and its own I/O thread (io_uring) or threads (fallback) submit them as earlier ones
  // complete, so the transfer goes on while the owner computes. The buffer must stay alive and untouched
  // until the ticket is waited for, and the file open (the queue keeps its descriptor and a copy of its
  // path, so moving the DirectFile is fine). UsageError for misalignment, and for a read past the reserved
  // size (a write past it extends the file without a reservation: reserve first).
  Ticket read(const DirectFile& file, std::uint64_t offset, void* buf, std::size_t bytes);
  Ticket write(const DirectFile& file, std::uint64_t offset, const void* buf, std::size_t bytes);
  // Blocks until every request of the ticket (and of earlier tickets) has completed. Throws IoError for
  // the first request that failed among them (earliest ticket, then lowest offset; the other failures of
  // those tickets are dropped); the queue stays usable. A ticket already waited for returns at once;
  // UsageError for a ticket this queue never returned.
  void wait(Ticket ticket);
  void wait_all();

  // Since the queue was made: bytes queued for reading and for writing, and the time callers spent
  // blocked in wait() and wait_all() (the part of the transfers the owner's own work did not hide).
  struct Counters {
    std::uint64_t read_bytes = 0;
    std::uint64_t write_bytes = 0;
    double wait_s = 0.0;
  };
  Counters counters() const;

  // "io_uring" or "pread/pwrite threads (io_uring: <reason>)"; the reason is the failed call's strerror,
  // "no IORING_OP_READ/WRITE/POLL_ADD (kernel before 5.6)" or "not used (AioOptions::force_threads)".
  std::string backend() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Checks a directory for NVMe offload before training, throwing ConfigError naming `key` (the config key
// path, e.g. "zero_optimization.offload_optimizer.nvme_path") and the path: it does not exist, is not a
// directory, is not writable, does not support O_DIRECT (probed by writing and reading back one aligned
// block in a temporary file, which is removed), or has fewer than need_bytes free (statvfs f_bavail).
void check_nvme_path(const std::string& path, std::uint64_t need_bytes, const std::string& key);

}  // namespace zero3::offload
