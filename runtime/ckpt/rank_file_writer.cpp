// One rank's data file: chunks appended back to back through a write buffer, each hashed on the way in,
// the whole file hashed as a stream. The file only becomes part of a checkpoint through commit().
#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <system_error>
#include <vector>

#include "posix_io.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::ckpt {
namespace {

// Small appends (biases, norms) are gathered into writes of this size; larger ones go straight through.
constexpr std::size_t kWriteBufferBytes = std::size_t{1} << 20;

struct XxhStateDeleter {
  void operator()(XXH64_state_t* s) const noexcept { XXH64_freeState(s); }
};
using XxhState = std::unique_ptr<XXH64_state_t, XxhStateDeleter>;

}  // namespace

struct RankFileWriter::Impl {
  std::filesystem::path path;
  FileSummary summary;
  detail::FileDescriptor fd;
  XxhState file_hash;
  std::vector<std::byte> buffer;  // capacity kWriteBufferBytes; size() is what is pending
  bool failed = false;
  bool finished = false;

  void check_usable() const {
    if (finished) throw UsageError(fmt::format("{}: RankFileWriter used after finish()", path.string()));
    if (failed)
      throw CheckpointError(fmt::format("{}: an earlier write failed; the writer is unusable", path.string()));
  }

  void flush() {
    if (buffer.empty()) return;
    detail::write_all(fd, buffer);
    buffer.clear();
  }

  void put(std::span<const std::byte> bytes) {
    if (buffer.size() + bytes.size() > kWriteBufferBytes) flush();
    if (bytes.size() >= kWriteBufferBytes) {
      detail::write_all(fd, bytes);
    } else {
      buffer.insert(buffer.end(), bytes.begin(), bytes.end());
    }
  }

  // Runs `body`; any exception marks the writer failed (it may have written part of a chunk).
  template <typename F>
  auto guarded(F&& body) {
    check_usable();
    try {
      return body();
    } catch (...) {
      failed = true;
      throw;
    }
  }
};

RankFileWriter::RankFileWriter(const std::filesystem::path& staging, int rank) : impl_(std::make_unique<Impl>()) {
  ZERO3_CHECK(rank >= 0, "a rank is non-negative");
  impl_->summary.name = fmt::format("rank_{:05d}.bin", rank);
  impl_->summary.rank = rank;
  impl_->path = staging / impl_->summary.name;
  impl_->file_hash.reset(XXH64_createState());
  if (!impl_->file_hash || XXH64_reset(impl_->file_hash.get(), 0) != XXH_OK) {
    throw CheckpointError(fmt::format("{}: cannot create an xxh64 state", impl_->path.string()));
  }
  impl_->buffer.reserve(kWriteBufferBytes);
  impl_->fd = detail::create_file(impl_->path);
}

RankFileWriter::~RankFileWriter() {
  if (!impl_ || impl_->finished) return;
  impl_->fd.close_nothrow();
  std::error_code ec;
  std::filesystem::remove(impl_->path, ec);
  if (ec) log::warn("{}: cannot remove an unfinished checkpoint file: {}", impl_->path.string(), ec.message());
}

void RankFileWriter::append(std::string_view param, std::string_view kind, DType dtype, std::uint64_t first,
                            std::uint64_t count, std::span<const std::byte> data) {
  Impl& s = *impl_;
  const std::size_t elem = size_of(dtype);
  ZERO3_CHECK(!param.empty() && !kind.empty(), "a chunk names its param and kind");
  ZERO3_CHECK(count <= data.size() && data.size() == count * elem, "append(): data holds count * size_of(dtype) bytes");
  ZERO3_CHECK(first + count >= first, "append(): first + count overflows");
  s.guarded([&] {
    const std::uint64_t per_chunk = kChunkBytes / elem;
    std::uint64_t done = 0;
    do {  // a zero-count append still records (param, kind), so has() sees an empty slice
      const std::uint64_t n = std::min(per_chunk, count - done);
      const std::span<const std::byte> bytes = data.subspan(done * elem, n * elem);
      ChunkEntry c;
      c.param = std::string(param);
      c.kind = std::string(kind);
      c.dtype = dtype;
      c.first = first + done;
      c.count = n;
      c.offset = s.summary.bytes;
      c.xxh64 = XXH64(bytes.data(), bytes.size(), 0);
      if (XXH64_update(s.file_hash.get(), bytes.data(), bytes.size()) != XXH_OK) {
        throw CheckpointError(fmt::format("{}: xxh64 update failed", s.path.string()));
      }
      s.put(bytes);
      s.summary.bytes += bytes.size();
      s.summary.chunks.push_back(std::move(c));
      done += n;
    } while (done < count);
  });
}

FileSummary RankFileWriter::finish() {
  Impl& s = *impl_;
  s.guarded([&] {
    s.flush();
    detail::fsync_fd(s.fd);
    s.fd.close();
  });
  s.summary.xxh64 = XXH64_digest(s.file_hash.get());
  s.finished = true;
  return s.summary;
}

}  // namespace zero3::ckpt
