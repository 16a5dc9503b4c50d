#include "posix_io.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>
#include <utility>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::ckpt::detail {

std::string errno_text(int err) {
  return std::generic_category().message(err);  // strerror's text, but thread-safe
}

void throw_io_error(const std::filesystem::path& path, std::string_view what, int err) {
  throw CheckpointError(fmt::format("{}: {}: {}", path.string(), what, errno_text(err)));
}

FileDescriptor::~FileDescriptor() {
  close_nothrow();
}

FileDescriptor::FileDescriptor(FileDescriptor&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    close_nothrow();
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

void FileDescriptor::close() {
  if (fd_ < 0) return;
  const int fd = std::exchange(fd_, -1);
  // Linux releases the descriptor even when close fails, so it is never retried.
  if (::close(fd) != 0 && errno != EINTR) throw_io_error(path_, "close failed", errno);
}

void FileDescriptor::close_nothrow() noexcept {
  if (fd_ < 0) return;
  if (::close(std::exchange(fd_, -1)) != 0 && errno != EINTR) {
    log::warn("{}: close failed: {}", path_.string(), errno_text(errno));
  }
}

namespace {

FileDescriptor open_with(const std::filesystem::path& path, int flags, std::string_view what) {
  int fd = -1;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw_io_error(path, what, errno);
  return {fd, path};
}

}  // namespace

FileDescriptor open_read(const std::filesystem::path& path) {
  return open_with(path, O_RDONLY, "cannot open");
}

FileDescriptor create_file(const std::filesystem::path& path) {
  return open_with(path, O_WRONLY | O_CREAT | O_TRUNC, "cannot create");
}

FileDescriptor open_dir(const std::filesystem::path& path) {
  return open_with(path, O_RDONLY | O_DIRECTORY, "cannot open directory");
}

void write_all(const FileDescriptor& fd, std::span<const std::byte> data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd.get(), data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io_error(fd.path(), "write failed", errno);
    }
    if (n == 0) throw_io_error(fd.path(), "write failed", EIO);  // never for regular files; no endless loop
    data = data.subspan(static_cast<std::size_t>(n));
  }
}

std::size_t pread_full(const FileDescriptor& fd, std::uint64_t offset, std::span<std::byte> data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pread(fd.get(), data.data() + done, data.size() - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_io_error(fd.path(), fmt::format("read of {} bytes at offset {} failed", data.size(), offset), errno);
    }
    if (n == 0) break;  // end of file
    done += static_cast<std::size_t>(n);
  }
  return done;
}

void fsync_fd(const FileDescriptor& fd) {
  if (::fsync(fd.get()) != 0) throw_io_error(fd.path(), "fsync failed", errno);
}

void fsync_dir(const std::filesystem::path& dir) {
  FileDescriptor fd = open_dir(dir);
  fsync_fd(fd);
  fd.close();
}

std::uint64_t file_size(const FileDescriptor& fd) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_io_error(fd.path(), "stat failed", errno);
  return static_cast<std::uint64_t>(st.st_size);
}

void rename_path(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    const int err = errno;
    throw CheckpointError(fmt::format("{}: cannot rename to {}: {}", from.string(), to.string(), errno_text(err)));
  }
}

void write_file_atomic(const std::filesystem::path& path, const std::filesystem::path& tmp, std::string_view text,
                       bool sync_parent) {
  try {
    FileDescriptor fd = create_file(tmp);
    write_all(fd, std::as_bytes(std::span(text.data(), text.size())));
    fsync_fd(fd);
    fd.close();
    rename_path(tmp, path);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  if (sync_parent) fsync_dir(path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path());
}

std::string read_small_file(const std::filesystem::path& path) {
  FileDescriptor fd = open_read(path);
  std::string text;
  std::vector<std::byte> buf(std::size_t{1} << 16);
  std::uint64_t offset = 0;
  for (;;) {
    const std::size_t n = pread_full(fd, offset, buf);
    text.append(reinterpret_cast<const char*>(buf.data()), n);
    offset += n;
    if (n < buf.size()) break;
  }
  return text;
}

}  // namespace zero3::ckpt::detail
