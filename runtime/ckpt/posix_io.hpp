// POSIX file helpers of the checkpoint library: an owning file descriptor, whole writes and reads that
// retry on EINTR and short transfers, fsync of files and directories, and an atomic small-file write.
// Every failure throws CheckpointError "<path>: <what>: <strerror>". Not thread-safe per descriptor
// except pread_exact, which several threads may call on one descriptor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace zero3::ckpt::detail {

// strerror's text for `err` ("No space left on device").
std::string errno_text(int err);
// Throws CheckpointError "<path>: <what>: <strerror(err)>".
[[noreturn]] void throw_io_error(const std::filesystem::path& path, std::string_view what, int err);

class FileDescriptor {
 public:
  FileDescriptor() = default;
  FileDescriptor(int fd, std::filesystem::path path) : fd_(fd), path_(std::move(path)) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept;
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  const std::filesystem::path& path() const { return path_; }
  // Closes, throwing on a failed close (a delayed write error on some file systems).
  void close();
  // Closes, ignoring errors (for cleanup paths).
  void close_nothrow() noexcept;

 private:
  int fd_ = -1;
  std::filesystem::path path_;
};

FileDescriptor open_read(const std::filesystem::path& path);
// O_WRONLY | O_CREAT | O_TRUNC, mode 0644.
FileDescriptor create_file(const std::filesystem::path& path);
// O_RDONLY | O_DIRECTORY, for fsync of a directory.
FileDescriptor open_dir(const std::filesystem::path& path);

void write_all(const FileDescriptor& fd, std::span<const std::byte> data);
// Reads data.size() bytes at `offset`; returns the number read, less only at end of file.
std::size_t pread_full(const FileDescriptor& fd, std::uint64_t offset, std::span<std::byte> data);
void fsync_fd(const FileDescriptor& fd);
void fsync_dir(const std::filesystem::path& dir);
std::uint64_t file_size(const FileDescriptor& fd);

void rename_path(const std::filesystem::path& from, const std::filesystem::path& to);
// Writes `text` to `tmp`, fsyncs and closes it, renames it to `path`, then fsyncs the parent directory
// when `sync_parent`. On failure `tmp` is removed.
void write_file_atomic(const std::filesystem::path& path, const std::filesystem::path& tmp, std::string_view text,
                       bool sync_parent);
// The whole file as text (for small files: manifest, latest).
std::string read_small_file(const std::filesystem::path& path);

}  // namespace zero3::ckpt::detail
