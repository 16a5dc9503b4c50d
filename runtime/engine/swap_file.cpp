#include "swap_file.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

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

// Whether process `pid` has ended: no such process, or a zombie (it exited and its parent has not reaped it:
// a launcher that exits right after killing its ranks leaves them so where nothing reaps orphans).
bool process_ended(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;  // EPERM: alive, someone else's
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');  // "pid (comm) S ...": comm may hold spaces and parentheses
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

// Directories of this host's jobs whose process is gone (killed before it could remove them): removed, with a
// warning, so that a crashed job's state does not fill the disk for good.
void remove_orphans(const std::string& root, const std::string& host) {
  const std::string prefix = fmt::format("zero3-{}-", host);
  std::error_code ec;
  std::vector<std::filesystem::directory_entry> entries;  // listed first: claiming renames entries
  for (const auto& entry : std::filesystem::directory_iterator(root, ec)) entries.push_back(entry);
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(prefix) || !entry.is_directory(ec)) continue;
    const std::string rest = name.substr(prefix.size());
    const auto dash = rest.find('-');
    if (dash == std::string::npos || dash == 0 || rest.find_first_not_of("0123456789") != dash) continue;
    const auto pid = static_cast<pid_t>(std::stol(rest.substr(0, dash)));
    if (!process_ended(pid)) continue;
    // Claimed by renaming it first: the ranks of a job starting on one host all look, and exactly one of
    // them may remove each directory. The new name carries this process's id, so that if it dies while
    // removing, the next job takes the rest.
    static std::atomic<int> claimed{0};
    const std::filesystem::path mine =
        std::filesystem::path(root) / fmt::format("{}{}-removing-{}", prefix, ::getpid(), claimed++);
    std::error_code moved;
    std::filesystem::rename(entry.path(), mine, moved);
    if (moved) continue;  // another rank claimed it
    std::error_code removed;
    const std::uintmax_t files = std::filesystem::remove_all(mine, removed);
    if (removed) {
      log::warn("NVMe offload: cannot remove {} (left by a job on this host whose process {} is gone): {}",
                mine.string(), pid, removed.message());
    } else {
      log::warn("NVMe offload: removed {} ({} files) of a job on this host whose process {} is gone",
                entry.path().string(), files, pid);
    }
  }
}

}  // namespace

RankDirectory::RankDirectory(const std::string& root, int rank) {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  remove_orphans(root, host);
  static std::atomic<int> made{0};  // engines of one process (a job resuming into a second engine) apart
  path_ = fmt::format("{}/zero3-{}-{}-{}-rank{}", root, host, ::getpid(), made++, rank);
  if (::mkdir(path_.c_str(), 0700) != 0) {
    throw IoError(
        fmt::format("NVMe offload: cannot create the directory {}: {}", path_, std::generic_category().message(errno)));
  }
}

RankDirectory::~RankDirectory() {
  ::rmdir(path_.c_str());
}

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

std::size_t SwapFile::span_bytes(std::size_t first, std::size_t n) const {
  const std::uint64_t b = std::uint64_t{first} * size_of(dtype_);
  return offload::direct_align_up(b + std::uint64_t{n} * size_of(dtype_)) - align_down(b);
}

offload::AioQueue::Ticket SwapFile::read_span(offload::AioQueue& queue, std::size_t first, std::size_t n,
                                              void* buffer) const {
  ZERO3_CHECK(first + n <= count_, fmt::format("SwapFile::read_span past the end of {}", path()));
  return queue.read(file_, align_down(std::uint64_t{first} * size_of(dtype_)), buffer, span_bytes(first, n));
}

}  // namespace zero3::engine
