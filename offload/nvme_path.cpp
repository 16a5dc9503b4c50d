// check_nvme_path: the start-up check of an NVMe offload directory, so that a wrong path, a read-only disk,
// a file system without O_DIRECT or a full disk is one ConfigError naming the config key before training,
// not an IoError in the middle of a step. The contract is zero3/offload/aio.hpp.
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <system_error>

#include "zero3/core/error.hpp"
#include "zero3/offload/aio.hpp"

namespace zero3::offload {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

class PathCheck {
 public:
  PathCheck(const std::string& path, const std::string& key) : path_(path), key_(key) {}

  [[noreturn]] void fail(const std::string& why) const {
    throw ConfigError(fmt::format("{}: \"{}\" {}", key_, path_, why));
  }

  void directory() const {
    struct stat st {};
    if (::stat(path_.c_str(), &st) != 0) {
      const int err = errno;
      if (err == ENOENT) fail("does not exist: create the directory (on a local NVMe disk) or name another");
      fail(fmt::format("cannot be looked up: {}", errno_text(err)));
    }
    if (!S_ISDIR(st.st_mode)) fail("is not a directory");
    // access() answers for the real user, as the probe file below will be created; root passes it always,
    // and a read-only mount then fails the probe instead (EROFS).
    if (::access(path_.c_str(), W_OK | X_OK) != 0) fail(fmt::format("is not writable: {}", errno_text(errno)));
  }

  // Writes one aligned block with O_DIRECT into a fresh file and reads it back: the file system must take
  // O_DIRECT for both (opening alone is not enough on some network file systems).
  void direct_io() const {
    std::string probe = path_ + "/.zero3-direct-probe-XXXXXX";
    const int created = ::mkostemp(probe.data(), O_CLOEXEC);
    if (created < 0) fail(fmt::format("is not writable: cannot create a file in it: {}", errno_text(errno)));
    const int fd = ::open(probe.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    const int open_err = errno;
    ::close(created);
    std::string problem;
    if (fd < 0) {
      problem = describe(open_err, "open");
    } else {
      AlignedBuffer out(kDirectAlign);
      AlignedBuffer in(kDirectAlign);
      for (std::size_t i = 0; i < out.size(); ++i) out.data()[i] = static_cast<std::byte>(i * 7 + 1);
      const auto whole = static_cast<ssize_t>(out.size());
      const ssize_t wrote = ::pwrite(fd, out.data(), out.size(), 0);
      const ssize_t got = wrote == whole ? ::pread(fd, in.data(), in.size(), 0) : 0;
      if (wrote != whole) {
        problem = describe(wrote < 0 ? errno : 0, "write");
      } else if (got != whole) {
        problem = describe(got < 0 ? errno : 0, "read");
      } else if (std::memcmp(in.data(), out.data(), out.size()) != 0) {
        problem = "does not support O_DIRECT: a block written with O_DIRECT read back different";
      }
      ::close(fd);
    }
    ::unlink(probe.c_str());
    if (!problem.empty()) fail(problem);
  }

  void free_space(std::uint64_t need_bytes) const {
    struct statvfs vfs {};
    if (::statvfs(path_.c_str(), &vfs) != 0) fail(fmt::format("cannot be looked up: {}", errno_text(errno)));
    const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes < need_bytes) {
      fail(fmt::format("has {} bytes free ({:.2f} GiB), {} bytes needed ({:.2f} GiB)", free_bytes,
                       static_cast<double>(free_bytes) / kGiB, need_bytes, static_cast<double>(need_bytes) / kGiB));
    }
  }

 private:
  // EINVAL is the kernel's answer to O_DIRECT it does not take (at open on tmpfs before Linux 6.6, at the
  // transfer elsewhere); anything else is the disk's own trouble (ENOSPC, EIO).
  static std::string describe(int err, const char* step) {
    if (err == EINVAL) {
      return fmt::format("does not support O_DIRECT ({} of a probe file: {}); put it on a local disk", step,
                         errno_text(err));
    }
    return fmt::format("cannot {} a probe file with O_DIRECT: {}", step, err == 0 ? "short transfer" : errno_text(err));
  }

  const std::string& path_;
  const std::string& key_;
};

}  // namespace

void check_nvme_path(const std::string& path, std::uint64_t need_bytes, const std::string& key) {
  const PathCheck check(path, key);
  check.directory();
  check.direct_io();
  check.free_space(need_bytes);
}

}  // namespace zero3::offload
