// One job at a time per checkpoint root. Two jobs given the same --save-dir would each remove the other's
// staging directories, fail each other's saves, and could commit a checkpoint holding the other job's rank
// files; so a job owns its save directory for its lifetime: rank 0 holds flock(2) on SAVE_DIR/.zero3-lock,
// which the kernel releases when the process ends in any way (exit, crash, kill -9), so a lock never
// outlives its job. The file holds a line naming the owner (host, pid, world size, start time, Slurm job),
// which a refused job quotes.
//
// flock works on local file systems and on NFS (Linux emulates it with byte-range locks there); Lustre
// must be mounted with -o flock for it to reach other nodes.
//
//   std::optional<zero3::ckpt::SaveDirLock> lock = zero3::ckpt::lock_save_dir(bootstrap, "ckpt");
//   // ConfigError on every rank if another job owns ckpt/; held (rank 0) until `lock` goes away
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "zero3/comm/communicator.hpp"
#include "zero3/core/error.hpp"

namespace zero3::ckpt {

inline constexpr std::string_view kSaveDirLockName = ".zero3-lock";

// Another job holds the save directory. A ConfigError (exit status 2 in `zero3 train`), of its own type so
// that a refused job reports it without writing into the owner's run directory (its events.jsonl).
class SaveDirInUse : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

class SaveDirLock {
 public:
  // Creates `dir` when missing and takes the lock of DIR/.zero3-lock for this process (not blocking), then
  // writes `owner` into the file. SaveDirInUse naming the directory when another process holds it (quoting
  // the owner line it wrote); ConfigError when the directory or the file cannot be made.
  SaveDirLock(const std::filesystem::path& dir, const std::string& owner);
  ~SaveDirLock();
  SaveDirLock(SaveDirLock&& other) noexcept;
  SaveDirLock& operator=(SaveDirLock&& other) noexcept;
  SaveDirLock(const SaveDirLock&) = delete;
  SaveDirLock& operator=(const SaveDirLock&) = delete;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  int fd_ = -1;
};

// This process as a save directory's owner: "pid P on host H, rank 0 of N, since 2026-12-07T13:40:01Z"
// (and ", Slurm job J" under Slurm).
std::string describe_owner(int world_size);

// Collective over `bootstrap`: rank 0 takes the lock of `dir` for the job, and every rank throws the same
// error (SaveDirInUse or ConfigError) when it could not. The lock on rank 0, nullopt on the other ranks.
std::optional<SaveDirLock> lock_save_dir(comm::Bootstrap& bootstrap, const std::filesystem::path& dir);

}  // namespace zero3::ckpt
