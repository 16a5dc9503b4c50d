// Making a save durable and visible: the staging directory, the commit (manifest last, then fsync and
// atomic renames, so ROOT/latest always names a complete checkpoint), and reading ROOT/latest.
#include <fmt/format.h>
#include <sys/stat.h>

#include <cerrno>
#include <system_error>

#include "posix_io.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kLatest = "latest";
constexpr std::string_view kManifest = "manifest.json";

// Where a replaced ROOT/TAG waits while its successor is renamed in; hidden like the staging directory.
fs::path retired_dir(const fs::path& root, std::string_view tag) {
  return root / (".old." + std::string(tag));
}

void remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot remove: {}", path.string(), ec.message()));
}

bool exists_no_follow(const fs::path& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT) return false;
  detail::throw_io_error(path, "cannot stat", errno);
}

// Every data file the manifest lists is in the staging directory with the size it records: a rank whose
// writer failed must not end up in a committed checkpoint.
void check_staged_files(const fs::path& staging, const Manifest& manifest) {
  for (const FileSummary& f : manifest.files) {
    const fs::path path = staging / f.name;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) detail::throw_io_error(path, "cannot commit", errno);
    if (static_cast<std::uint64_t>(st.st_size) != f.bytes) {
      throw CheckpointError(
          fmt::format("{}: cannot commit: size {}, manifest says {}", path.string(), st.st_size, f.bytes));
    }
  }
}

}  // namespace

std::optional<std::string> read_latest(const fs::path& root) {
  const fs::path path = root / kLatest;
  if (!exists_no_follow(path)) return std::nullopt;
  std::string text = detail::read_small_file(path);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  if (text.empty()) throw CheckpointError(fmt::format("{}: empty (it should name a checkpoint tag)", path.string()));
  try {
    check_tag(text);
  } catch (const CheckpointError& e) {
    throw CheckpointError(fmt::format("{}: {}", path.string(), e.what()));
  }
  return text;
}

void prepare_staging(const fs::path& root, std::string_view tag) {
  const fs::path staging = staging_dir(root, tag);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot create the checkpoint root: {}", root.string(), ec.message()));
  // What a crashed save left: its staging directory, or a replaced checkpoint not yet removed (never the
  // one ROOT/latest names, which commit() refuses to replace).
  if (exists_no_follow(staging)) {
    log::info("{}: removing what an unfinished save left", staging.string());
    remove_tree(staging);
  }
  remove_tree(retired_dir(root, tag));
  fs::create_directory(staging, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot create: {}", staging.string(), ec.message()));
}

void commit(const fs::path& root, const Manifest& manifest) {
  const std::string& tag = manifest.tag;
  const fs::path staging = staging_dir(root, tag);
  const fs::path final_dir = checkpoint_dir(root, tag);
  if (!exists_no_follow(staging)) {
    throw CheckpointError(fmt::format(
        "{}: no staging directory to commit (prepare_staging() was not called, or it was removed)", staging.string()));
  }
  check_staged_files(staging, manifest);
  // Refused before anything is written: ROOT/latest must always name a complete checkpoint.
  const bool replacing = exists_no_follow(final_dir);
  if (replacing) {
    const std::optional<std::string> latest = read_latest(root);
    if (latest && *latest == tag) {
      throw CheckpointError(fmt::format("{}: cannot replace the checkpoint {}/latest names; save under a new tag",
                                        final_dir.string(), root.string()));
    }
  }

  // 1. The manifest, last of the directory's files, durable before the directory is.
  detail::write_file_atomic(staging / kManifest, staging / ".manifest.json.tmp", to_json(manifest).dump(1) + "\n",
                            /*sync_parent=*/true);

  // 2. The directory becomes ROOT/TAG. An existing ROOT/TAG is moved aside first (rename cannot replace a
  // non-empty directory), and only when ROOT/latest does not need it.
  const fs::path retired = retired_dir(root, tag);
  if (replacing) {
    remove_tree(retired);
    detail::rename_path(final_dir, retired);
  }
  detail::rename_path(staging, final_dir);
  detail::fsync_dir(root);
  if (replacing) remove_tree(retired);

  // 3. Only now does ROOT/latest name it.
  detail::write_file_atomic(root / kLatest, root / ".latest.tmp", tag + "\n", /*sync_parent=*/true);
}

}  // namespace zero3::ckpt
