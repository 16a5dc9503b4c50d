#include "zero3/ckpt/save_dir_lock.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <system_error>

#include "zero3/comm/typed_collectives.hpp"
#include "zero3/core/error.hpp"

namespace zero3::ckpt {
namespace {

std::string errno_message(int err) {
  return std::generic_category().message(err);
}

// What the holder wrote, one line of printable ASCII at most 512 bytes: the file is anyone's to write.
std::string read_owner(int fd) {
  std::array<char, 512> text{};
  const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  std::string owner;
  for (ssize_t i = 0; i < n; ++i) {
    const char c = text[static_cast<std::size_t>(i)];
    if (c == '\n') break;
    owner += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return owner.empty() ? std::string("a process that wrote no owner line") : owner;
}

}  // namespace

SaveDirLock::SaveDirLock(const std::filesystem::path& dir, const std::string& owner) : dir_(dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw ConfigError(fmt::format("--save-dir {}: cannot create the directory: {}", dir.string(), ec.message()));
  const std::filesystem::path file = dir / kSaveDirLockName;
  fd_ = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw ConfigError(fmt::format("--save-dir {}: cannot open the lock file {}: {}", dir.string(), file.string(),
                                  errno_message(errno)));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? read_owner(fd_) : std::string();
    ::close(fd_);
    fd_ = -1;
    if (err == EWOULDBLOCK) {
      throw SaveDirInUse(fmt::format(
          "--save-dir {}: another job is using this checkpoint directory ({}; lock {}): two jobs saving to one "
          "directory overwrite each other's checkpoints; give this job its own --save-dir, or stop the other",
          dir.string(), holder, file.string()));
    }
    throw ConfigError(
        fmt::format("--save-dir {}: cannot lock {}: {}", dir.string(), file.string(), errno_message(err)));
  }
  const std::string line = owner + "\n";
  // The owner line is for people reading a refusal; failing to write it does not endanger the checkpoints.
  if (::ftruncate(fd_, 0) == 0) (void)::pwrite(fd_, line.data(), line.size(), 0);
}

SaveDirLock::~SaveDirLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock; the file stays, unlocked, for the next job
}

SaveDirLock::SaveDirLock(SaveDirLock&& other) noexcept : dir_(std::move(other.dir_)), fd_(other.fd_) {
  other.fd_ = -1;
}

SaveDirLock& SaveDirLock::operator=(SaveDirLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    dir_ = std::move(other.dir_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

std::string describe_owner(int world_size) {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) host = {'?'};
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::array<char, 32> when{};
  std::strftime(when.data(), when.size(), "%Y-%m-%dT%H:%M:%SZ", &utc);
  std::string owner =
      fmt::format("pid {} on host {}, rank 0 of {}, since {}", ::getpid(), host.data(), world_size, when.data());
  // Named for the person reading a refusal; zero3 itself does not depend on it.
  if (const char* job = std::getenv("SLURM_JOB_ID"); job != nullptr && *job != '\0') {
    owner += fmt::format(", Slurm job {}", job);
  }
  return owner;
}

std::optional<SaveDirLock> lock_save_dir(comm::Bootstrap& bootstrap, const std::filesystem::path& dir) {
  std::optional<SaveDirLock> lock;
  std::string refusal;  // the error's kind ('U': in use, 'C': other), then its text
  if (bootstrap.rank() == 0) {
    try {
      lock.emplace(dir, describe_owner(bootstrap.size()));
    } catch (const SaveDirInUse& e) {
      refusal = std::string("U") + e.what();
    } catch (const ConfigError& e) {
      refusal = std::string("C") + e.what();
    }
  }
  refusal = comm::broadcast_string(bootstrap, refusal, 0);
  if (refusal.empty()) return lock;
  if (refusal.front() == 'U') throw SaveDirInUse(refusal.substr(1));
  throw ConfigError(refusal.substr(1));
}

}  // namespace zero3::ckpt
