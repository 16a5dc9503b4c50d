// Direct asynchronous file I/O: aligned buffers, O_DIRECT files reserved with fallocate, and AioQueue, whose
// requests run on io_uring (one ring per queue, driven by one thread of the queue's own) or on pread/pwrite
// threads where io_uring cannot be used. The contract is zero3/offload/aio.hpp.
#include "zero3/offload/aio.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "zero3/core/error.hpp"

namespace zero3::offload {
namespace {

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

bool aligned(std::uint64_t n) {
  return n % kDirectAlign == 0;
}

// One read or write of the file is capped below Linux's 2 GiB per call (MAX_RW_COUNT) and io_uring's 32-bit
// length, so that a huge block_size still makes requests the kernel takes whole.
constexpr std::size_t kMaxRequestBytes = std::size_t{1} << 30;

// The io_uring user_data of the eventfd poll that wakes the ring thread (request slots are 0..depth-1).
constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// AlignedBuffer

AlignedBuffer::AlignedBuffer(std::size_t size) : size_(direct_align_up(size)) {
  if (size_ == 0) return;
  data_ = static_cast<std::byte*>(std::aligned_alloc(kDirectAlign, size_));
  if (data_ == nullptr) throw OutOfMemory(fmt::format("cannot allocate an aligned buffer of {} bytes", size_));
  std::memset(data_, 0, size_);
}

AlignedBuffer::~AlignedBuffer() {
  std::free(data_);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// ---------------------------------------------------------------------------------------------------------
// DirectFile

DirectFile DirectFile::create(const std::string& path, std::uint64_t size_bytes) {
  // Older tmpfs creates the file before it refuses O_DIRECT; a file that was not there is removed again.
  const bool existed = ::access(path.c_str(), F_OK) == 0;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    if (err == EINVAL) {
      if (!existed) ::unlink(path.c_str());
      throw IoError(fmt::format(
          "cannot create {}: its file system does not support O_DIRECT ({}); put the NVMe offload on a local disk",
          path, errno_text(err)));
    }
    throw IoError(fmt::format("cannot create {}: {}", path, errno_text(err)));
  }
  DirectFile file;
  file.fd_ = fd;
  file.path_ = path;
  try {
    file.reserve(size_bytes);
  } catch (const IoError&) {
    // A partial reservation would hold disk space nobody can use: the file goes (it was created or
    // truncated here, so nothing of value is lost).
    ::unlink(path.c_str());
    throw;
  }
  return file;
}

void DirectFile::reserve(std::uint64_t size_bytes) {
  if (fd_ < 0) throw UsageError("DirectFile::reserve on a file that is not open");
  const std::uint64_t want = direct_align_up(size_bytes);
  if (want <= size_) return;
  int rc = 0;
  do {
    rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(want));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) {
    size_ = want;
    return;
  }
  const int err = errno;
  if (err == EOPNOTSUPP && ::ftruncate(fd_, static_cast<off_t>(want)) == 0) {
    size_ = want;  // no reservation on this file system: the size is set, a full disk shows at a write
    return;
  }
  if (err == ENOSPC || err == EFBIG) {
    struct statvfs vfs {};
    const std::uint64_t free_bytes =
        ::fstatvfs(fd_, &vfs) == 0 ? static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize : 0;
    const char* limit =
        err == EFBIG ? " (EFBIG: past the process's file size limit, `ulimit -f`, or the file system's largest file)"
                     : "";
    throw IoError(fmt::format("cannot reserve {} bytes for {}: not enough space: {} bytes needed, {} bytes free{}",
                              want, path_, want - size_, free_bytes, limit));
  }
  throw IoError(fmt::format("cannot reserve {} bytes for {}: {}", want, path_, errno_text(err)));
}

DirectFile::~DirectFile() {
  if (fd_ >= 0) ::close(fd_);
}

DirectFile::DirectFile(DirectFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)), size_(std::exchange(other.size_, 0)) {}

DirectFile& DirectFile::operator=(DirectFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

// ---------------------------------------------------------------------------------------------------------
// AioQueue
//
// The owner's read()/write() append block-sized requests to `pending` and wake the backend; the backend (one
// ring thread, or the pread/pwrite threads) takes them while fewer than queue_depth are in flight, and
// reports each completion under the mutex. A short transfer goes back to the front of `pending` for its
// remainder. wait() sleeps on `done_cv` until every ticket up to its own has no request outstanding.

struct AioQueue::Impl {
  enum class Op : std::uint8_t { kRead, kWrite };

  // A block of a ticket's transfer; `done` bytes of it have moved (a short transfer resumes from there).
  struct Request {
    Ticket ticket = 0;
    int fd = -1;
    Op op = Op::kRead;
    std::uint64_t offset = 0;  // of the request's first byte in the file
    std::byte* buf = nullptr;
    std::size_t bytes = 0;
    std::size_t done = 0;
  };

  struct TicketState {
    std::string path;  // a copy, for messages
    std::size_t outstanding = 0;
    std::optional<std::uint64_t> failed_offset;  // the lowest offset of a failed request, and its message
    std::string failure;
  };

  explicit Impl(const AioOptions& opts);
  ~Impl();

  Ticket enqueue(Op op, const DirectFile& file, std::uint64_t offset, std::byte* buf, std::size_t bytes);
  // Waits for tickets up to `ticket`, forgets them, and returns the first failure among them.
  std::optional<std::string> wait_through(Ticket ticket);
  void start_uring();
  void start_threads(const std::string& why);
  void wake();

  // Under mu: the result of one transfer of `r` (bytes moved, or -errno).
  void finish_locked(Request r, long result);
  void fail_locked(const Request& r, const std::string& reason);
  TicketState& state_locked(Ticket t) { return states[t - base]; }

  void thread_loop();
  long transfer(const Request& r) const;

  void ring_loop();
  void prepare_locked();
  void arm_wake_poll();
  void handle_cqe_locked(std::uint64_t tag, int result);
  void submit_ring();

  AioOptions options;
  std::size_t request_bytes;
  std::string backend_name;

  std::mutex mu;
  std::condition_variable done_cv;  // a ticket finished
  std::condition_variable work_cv;  // pread/pwrite threads: a request is pending, or stop
  std::deque<Request> pending;
  std::deque<TicketState> states;  // tickets base, base + 1, ..., last
  Ticket base = 1;
  Ticket last = 0;
  int inflight = 0;
  bool stop = false;
  Counters counters;  // under mu

  // io_uring: the ring, the eventfd the owner writes to wake the ring thread, and the in-flight requests by
  // slot (the slot is the SQE's user_data).
  bool uring = false;
  io_uring ring{};
  int wake_fd = -1;
  std::vector<Request> slots;
  std::vector<std::uint64_t> free_slots;

  std::vector<std::thread> threads;
};

AioQueue::Impl::Impl(const AioOptions& opts) : options(opts) {
  if (options.block_size == 0 || !aligned(options.block_size)) {
    throw UsageError(
        fmt::format("AioOptions::block_size {} is not a positive multiple of {}", options.block_size, kDirectAlign));
  }
  if (options.queue_depth < 1) throw UsageError(fmt::format("AioOptions::queue_depth {} < 1", options.queue_depth));
  if (options.intra_op_parallelism < 1) {
    throw UsageError(fmt::format("AioOptions::intra_op_parallelism {} < 1", options.intra_op_parallelism));
  }
  request_bytes = std::min(options.block_size, kMaxRequestBytes);
  if (options.force_threads) {
    start_threads("not used (AioOptions::force_threads)");
  } else {
    start_uring();
  }
}

void AioQueue::Impl::start_threads(const std::string& why) {
  backend_name = fmt::format("pread/pwrite threads (io_uring: {})", why);
  for (int i = 0; i < options.intra_op_parallelism; ++i) threads.emplace_back([this] { thread_loop(); });
}

void AioQueue::Impl::start_uring() {
  // One entry per request in flight and one for the wake-up poll: the ring thread submits everything it
  // prepares before it waits, so the submission queue never holds more.
  const int rc = io_uring_queue_init(static_cast<unsigned>(options.queue_depth) + 1, &ring, 0);
  if (rc == -ENOSYS || rc == -EPERM) {
    start_threads(fmt::format("io_uring_queue_init: {}", errno_text(-rc)));
    return;
  }
  if (rc < 0) throw IoError(fmt::format("cannot set up io_uring (io_uring_queue_init): {}", errno_text(-rc)));
  io_uring_probe* probe = io_uring_get_probe_ring(&ring);
  const bool ops = probe != nullptr && io_uring_opcode_supported(probe, IORING_OP_READ) &&
                   io_uring_opcode_supported(probe, IORING_OP_WRITE) &&
                   io_uring_opcode_supported(probe, IORING_OP_POLL_ADD);
  if (probe != nullptr) io_uring_free_probe(probe);
  if (!ops) {
    io_uring_queue_exit(&ring);
    start_threads("no IORING_OP_READ/WRITE/POLL_ADD (kernel before 5.6)");
    return;
  }
  wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) {
    const int err = errno;
    io_uring_queue_exit(&ring);
    throw IoError(fmt::format("cannot set up io_uring (eventfd): {}", errno_text(err)));
  }
  uring = true;
  backend_name = "io_uring";
  slots.resize(static_cast<std::size_t>(options.queue_depth));
  for (std::size_t i = slots.size(); i-- > 0;) free_slots.push_back(i);
  threads.emplace_back([this] { ring_loop(); });
}

AioQueue::Impl::~Impl() {
  (void)wait_through(last);  // the owner is unwinding or done: errors are dropped
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  work_cv.notify_all();
  wake();
  for (std::thread& t : threads) t.join();
  if (uring) {
    io_uring_queue_exit(&ring);  // cancels the wake-up poll still armed
    ::close(wake_fd);
  }
}

void AioQueue::Impl::wake() {
  if (!uring) {
    work_cv.notify_all();
    return;
  }
  const std::uint64_t one = 1;
  // The counter only saturates after 2^64 - 2 unread writes: a failed write cannot lose a wake-up.
  [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof(one));
}

AioQueue::Ticket AioQueue::Impl::enqueue(Op op, const DirectFile& file, std::uint64_t offset, std::byte* buf,
                                         std::size_t bytes) {
  const char* what = op == Op::kRead ? "read" : "write";
  if (file.fd() < 0) throw UsageError(fmt::format("AioQueue::{} of a DirectFile that is not open", what));
  if (!aligned(offset) || !aligned(bytes) || !aligned(reinterpret_cast<std::uintptr_t>(buf))) {
    throw UsageError(
        fmt::format("AioQueue::{} of {}: offset {}, length {} and buffer address {} must be multiples of {}", what,
                    file.path(), offset, bytes, static_cast<const void*>(buf), kDirectAlign));
  }
  if (op == Op::kRead && (offset > file.size() || bytes > file.size() - offset)) {
    throw UsageError(fmt::format("AioQueue::read of {}: bytes [{}, {}) past the {} bytes reserved", file.path(), offset,
                                 offset + bytes, file.size()));
  }
  Ticket ticket = 0;
  {
    std::lock_guard lock(mu);
    ticket = ++last;
    (op == Op::kRead ? counters.read_bytes : counters.write_bytes) += bytes;
    TicketState& state = states.emplace_back();
    state.path = file.path();
    for (std::size_t at = 0; at < bytes; at += request_bytes) {
      const std::size_t n = std::min(request_bytes, bytes - at);
      pending.push_back(Request{ticket, file.fd(), op, offset + at, buf + at, n, 0});
      ++state.outstanding;
    }
  }
  wake();
  return ticket;
}

void AioQueue::Impl::fail_locked(const Request& r, const std::string& reason) {
  TicketState& state = state_locked(r.ticket);
  if (!state.failed_offset || r.offset < *state.failed_offset) {
    state.failed_offset = r.offset;
    state.failure = fmt::format("cannot {} {} at byte offset {} (a request of {} bytes): {}",
                                r.op == Op::kRead ? "read" : "write", state.path, r.offset, r.bytes, reason);
  }
}

void AioQueue::Impl::finish_locked(Request r, long result) {
  if (result == -EINTR || result == -EAGAIN) {
    pending.push_front(r);  // nothing moved: the same transfer again
    return;
  }
  if (result > 0) {
    r.done += static_cast<std::size_t>(result);
    if (r.done < r.bytes) {
      pending.push_front(r);  // the kernel moved part of it: the remainder next, before anything else
      return;
    }
  } else if (result < 0) {
    fail_locked(r, errno_text(static_cast<int>(-result)));
  } else if (r.op == Op::kRead) {
    fail_locked(r, fmt::format("short read: got {} of {} bytes (end of file)", r.done, r.bytes));
  } else {
    fail_locked(r, fmt::format("short write: wrote {} of {} bytes", r.done, r.bytes));
  }
  if (--state_locked(r.ticket).outstanding == 0) done_cv.notify_all();
}

std::optional<std::string> AioQueue::Impl::wait_through(Ticket ticket) {
  std::unique_lock lock(mu);
  if (ticket < base) return std::nullopt;  // waited for already
  const std::size_t count = ticket - base + 1;
  const auto finished = [&] {
    for (std::size_t i = 0; i < count; ++i) {
      if (states[i].outstanding != 0) return false;
    }
    return true;
  };
  if (!finished()) {
    const auto start = std::chrono::steady_clock::now();
    done_cv.wait(lock, finished);
    counters.wait_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  std::optional<std::string> failure;
  for (std::size_t i = 0; i < count; ++i) {
    if (!failure && states.front().failed_offset) failure = std::move(states.front().failure);
    states.pop_front();
  }
  base = ticket + 1;
  return failure;
}

// --- pread/pwrite threads

long AioQueue::Impl::transfer(const Request& r) const {
  const auto offset = static_cast<off_t>(r.offset + r.done);
  const ssize_t n = r.op == Op::kRead ? ::pread(r.fd, r.buf + r.done, r.bytes - r.done, offset)
                                      : ::pwrite(r.fd, r.buf + r.done, r.bytes - r.done, offset);
  return n < 0 ? -static_cast<long>(errno) : static_cast<long>(n);
}

void AioQueue::Impl::thread_loop() {
  std::unique_lock lock(mu);
  for (;;) {
    work_cv.wait(lock, [&] { return stop || (!pending.empty() && inflight < options.queue_depth); });
    if (pending.empty()) return;  // stop: the destructor waited for every request first
    Request r = pending.front();
    pending.pop_front();
    ++inflight;
    lock.unlock();
    const long result = transfer(r);
    lock.lock();
    --inflight;
    finish_locked(r, result);
    if (!pending.empty()) work_cv.notify_one();  // a thread held back by queue_depth may go
  }
}

// --- io_uring: one thread owns the ring (every SQE and CQE), so liburing needs no locking of its own.

void AioQueue::Impl::arm_wake_poll() {
  io_uring_sqe* sqe = io_uring_get_sqe(&ring);  // never null: see start_uring
  io_uring_prep_poll_add(sqe, wake_fd, POLLIN);
  io_uring_sqe_set_data64(sqe, kWakeTag);
}

void AioQueue::Impl::prepare_locked() {
  // overlap_events false: DeepSpeed's batch mode, the next batch only once the last one is complete.
  if (!options.overlap_events && inflight > 0) return;
  while (inflight < options.queue_depth && !pending.empty()) {
    io_uring_sqe* sqe = io_uring_get_sqe(&ring);
    if (sqe == nullptr) break;
    const std::uint64_t slot = free_slots.back();
    free_slots.pop_back();
    Request& r = slots[slot] = pending.front();
    pending.pop_front();
    const auto len = static_cast<unsigned>(r.bytes - r.done);
    if (r.op == Op::kRead) {
      io_uring_prep_read(sqe, r.fd, r.buf + r.done, len, r.offset + r.done);
    } else {
      io_uring_prep_write(sqe, r.fd, r.buf + r.done, len, r.offset + r.done);
    }
    io_uring_sqe_set_data64(sqe, slot);
    ++inflight;
    if (options.single_submit) submit_ring();
  }
}

void AioQueue::Impl::submit_ring() {
  // EINTR, EAGAIN (no kernel memory for requests just now) and EBUSY are passing states; the SQEs stay queued
  // and the next io_uring_submit takes them.
  while (io_uring_sq_ready(&ring) > 0) {
    const int rc = io_uring_submit(&ring);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      std::fprintf(stderr, "zero3 offload: io_uring_submit failed: %s\n", errno_text(-rc).c_str());
      std::abort();  // the ring is unusable with buffers still in the kernel's hands: nothing safe to return
    }
    if (rc <= 0) std::this_thread::yield();
  }
}

void AioQueue::Impl::handle_cqe_locked(std::uint64_t tag, int result) {
  if (tag == kWakeTag) {
    std::uint64_t count = 0;
    [[maybe_unused]] const ssize_t n = ::read(wake_fd, &count, sizeof(count));  // reset the counter
    if (!stop) arm_wake_poll();
    return;
  }
  const Request r = slots[tag];
  free_slots.push_back(tag);
  --inflight;
  finish_locked(r, result);
}

void AioQueue::Impl::ring_loop() {
  arm_wake_poll();
  for (;;) {
    {
      std::lock_guard lock(mu);
      if (stop && inflight == 0 && pending.empty()) return;
      prepare_locked();
    }
    submit_ring();
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(&ring, &cqe);
    if (rc == -EINTR) continue;
    if (rc < 0) {
      std::fprintf(stderr, "zero3 offload: io_uring_wait_cqe failed: %s\n", errno_text(-rc).c_str());
      std::abort();  // as in submit_ring: requests are in the kernel's hands and cannot be accounted for
    }
    std::lock_guard lock(mu);
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring, head, cqe) {
      handle_cqe_locked(io_uring_cqe_get_data64(cqe), cqe->res);
      ++seen;
    }
    io_uring_cq_advance(&ring, seen);
  }
}

// --- the public face

AioQueue::AioQueue(const AioOptions& options) : impl_(std::make_unique<Impl>(options)) {}
AioQueue::~AioQueue() = default;

AioQueue::Ticket AioQueue::read(const DirectFile& file, std::uint64_t offset, void* buf, std::size_t bytes) {
  return impl_->enqueue(Impl::Op::kRead, file, offset, static_cast<std::byte*>(buf), bytes);
}

AioQueue::Ticket AioQueue::write(const DirectFile& file, std::uint64_t offset, const void* buf, std::size_t bytes) {
  // The kernel only reads the buffer of a write; the request type is shared with reads.
  return impl_->enqueue(Impl::Op::kWrite, file, offset, static_cast<std::byte*>(const_cast<void*>(buf)), bytes);
}

void AioQueue::wait(Ticket ticket) {
  {
    std::lock_guard lock(impl_->mu);
    if (ticket == 0 || ticket > impl_->last) {
      throw UsageError(
          fmt::format("AioQueue::wait: ticket {} was never returned by this queue (last: {})", ticket, impl_->last));
    }
  }
  if (std::optional<std::string> failure = impl_->wait_through(ticket)) throw IoError(*failure);
}

void AioQueue::wait_all() {
  Ticket last = 0;
  {
    std::lock_guard lock(impl_->mu);
    last = impl_->last;
  }
  if (std::optional<std::string> failure = impl_->wait_through(last)) throw IoError(*failure);
}

AioQueue::Counters AioQueue::counters() const {
  std::lock_guard lock(impl_->mu);
  return impl_->counters;
}

std::string AioQueue::backend() const {
  return impl_->backend_name;
}

}  // namespace zero3::offload
