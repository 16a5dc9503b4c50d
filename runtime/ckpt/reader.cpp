// Reading a committed checkpoint: finding it (directory, tag or ROOT/latest), the chunk index built at
// open, ranged reads that gather the chunks of any number of files (whatever world size wrote them),
// verifying each chunk's hash and converting its dtype, and the full verification of every file.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "posix_io.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/core/error.hpp"

namespace zero3::ckpt {

namespace fs = std::filesystem;

namespace detail {

// The chunks of one (param, kind), sorted by first element. reach[i] is the largest end of runs[0..i] and
// reach_run[i] the run that has it, so the run covering element e (if any) is found by one binary search
// even when chunks overlap (a param written by several ranks).
struct Runs {
  struct Run {
    std::uint64_t first = 0;
    std::uint64_t end = 0;
    std::size_t file = 0;
    std::size_t chunk = 0;
  };
  std::vector<Run> runs;
  std::vector<std::uint64_t> reach;
  std::vector<std::size_t> reach_run;
};

struct ReaderIndex {
  std::map<std::string, std::size_t, std::less<>> params;  // name -> index in manifest.params
  std::map<std::string, std::map<std::string, Runs, std::less<>>, std::less<>> runs;

  // One descriptor per file, opened on first use; pread on it is safe from several threads.
  std::mutex mutex;
  std::vector<std::unique_ptr<FileDescriptor>> files;

  const Runs* find(std::string_view param, std::string_view kind) const {
    auto p = runs.find(param);
    if (p == runs.end()) return nullptr;
    auto k = p->second.find(kind);
    return k == p->second.end() ? nullptr : &k->second;
  }
};

}  // namespace detail

namespace {

constexpr std::string_view kManifestName = "manifest.json";

std::string range_text(std::uint64_t first, std::uint64_t count) {
  return fmt::format("[{}, {})", first, first + count);
}

std::string chunk_text(const ChunkEntry& c) {
  return fmt::format("chunk {}/{} {} ({}) at offset {}", c.param, c.kind, range_text(c.first, c.count),
                     dtype_name(c.dtype), c.offset);
}

// The checkpoint directory `path` and `tag` name, per the rules in checkpoint.hpp.
fs::path locate(const fs::path& path, std::string_view tag) {
  std::error_code ec;
  if (fs::exists(path / kManifestName, ec)) return path;
  if (!fs::exists(path, ec))
    throw CheckpointError(fmt::format("no checkpoint at {} (no such directory)", path.string()));
  if (!fs::is_directory(path, ec))
    throw CheckpointError(fmt::format("no checkpoint at {} (not a directory)", path.string()));
  fs::path dir;
  if (!tag.empty()) {
    check_tag(tag);
    dir = path / std::string(tag);
    if (!fs::exists(dir, ec)) throw CheckpointError(fmt::format("tag {} does not exist in {}", tag, path.string()));
  } else {
    const std::optional<std::string> latest = read_latest(path);
    if (!latest) {
      throw CheckpointError(fmt::format("no checkpoint at {} (no manifest.json and no latest)", path.string()));
    }
    dir = path / *latest;
    if (!fs::exists(dir, ec)) {
      throw CheckpointError(
          fmt::format("{} names tag {}, but {} does not exist", (path / "latest").string(), *latest, dir.string()));
    }
  }
  if (!fs::exists(dir / kManifestName, ec)) {
    throw CheckpointError(
        fmt::format("no checkpoint at {} (no manifest.json: not a checkpoint, or an unfinished save)", dir.string()));
  }
  return dir;
}

Manifest load_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifestName;
  return manifest_from_text(detail::read_small_file(path), path.string());
}

}  // namespace

std::shared_ptr<detail::ReaderIndex> detail::build_reader_index(const Manifest& m, const std::string& source) {
  auto index = std::make_shared<detail::ReaderIndex>();
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    if (!index->params.emplace(m.params[i].name, i).second) {
      throw CheckpointError(fmt::format("{}: param \"{}\" is listed twice", source, m.params[i].name));
    }
  }
  std::set<std::string, std::less<>> names;
  for (std::size_t f = 0; f < m.files.size(); ++f) {
    const FileSummary& file = m.files[f];
    if (!names.insert(file.name).second) {
      throw CheckpointError(fmt::format("{}: file {} is listed twice", source, file.name));
    }
    std::vector<std::pair<std::uint64_t, std::uint64_t>> extents;  // [offset, end) in the file
    for (std::size_t c = 0; c < file.chunks.size(); ++c) {
      const ChunkEntry& chunk = file.chunks[c];
      auto p = index->params.find(chunk.param);
      if (p == index->params.end()) {
        throw CheckpointError(fmt::format("{}: {} holds a {}, but the manifest lists no such param", source, file.name,
                                          chunk_text(chunk)));
      }
      const std::uint64_t numel = m.params[p->second].numel();
      if (chunk.first > numel || chunk.count > numel - chunk.first) {
        throw CheckpointError(fmt::format("{}: {} holds a {}, past the param's {} elements", source, file.name,
                                          chunk_text(chunk), numel));
      }
      extents.emplace_back(chunk.offset, chunk.offset + chunk.count * size_of(chunk.dtype));
      index->runs[chunk.param][chunk.kind].runs.push_back({chunk.first, chunk.first + chunk.count, f, c});
    }
    std::sort(extents.begin(), extents.end());
    for (std::size_t i = 1; i < extents.size(); ++i) {
      if (extents[i].first < extents[i - 1].second) {
        throw CheckpointError(
            fmt::format("{}: {}: two chunks share the bytes at offset {}", source, file.name, extents[i].first));
      }
    }
  }
  for (auto& [param, kinds] : index->runs) {
    for (auto& [kind, r] : kinds) {
      std::sort(r.runs.begin(), r.runs.end(),
                [](const auto& a, const auto& b) { return a.first != b.first ? a.first < b.first : a.end > b.end; });
      r.reach.resize(r.runs.size());
      r.reach_run.resize(r.runs.size());
      for (std::size_t i = 0; i < r.runs.size(); ++i) {
        const bool extends = i == 0 || r.runs[i].end > r.reach[i - 1];
        r.reach[i] = extends ? r.runs[i].end : r.reach[i - 1];
        r.reach_run[i] = extends ? i : r.reach_run[i - 1];
      }
    }
  }
  index->files.resize(m.files.size());
  return index;
}

namespace {

const detail::FileDescriptor& file_fd(detail::ReaderIndex& index, const fs::path& dir, const Manifest& m,
                                      std::size_t f) {
  const std::lock_guard lock(index.mutex);
  auto& slot = index.files[f];
  if (!slot) slot = std::make_unique<detail::FileDescriptor>(detail::open_read(dir / m.files[f].name));
  return *slot;
}

// Reads chunk `c` of `fd` whole into `buf` and checks its hash.
void read_chunk(const detail::FileDescriptor& fd, const ChunkEntry& c, std::vector<std::byte>& buf) {
  const std::size_t bytes = c.count * size_of(c.dtype);
  buf.resize(bytes);
  const std::size_t got = detail::pread_full(fd, c.offset, buf);
  if (got != bytes) {
    throw CheckpointError(fmt::format("{}: short read: {} needs {} bytes, the file ends after {} (truncated?)",
                                      fd.path().string(), chunk_text(c), bytes, c.offset + got));
  }
  const std::uint64_t h = XXH64(buf.data(), buf.size(), 0);
  if (h != c.xxh64) {
    throw CheckpointError(fmt::format("{}: checksum mismatch in {} (xxh64 {:016x}, manifest says {:016x})",
                                      fd.path().string(), chunk_text(c), h, c.xxh64));
  }
}

// Converts n elements from `src` (dtype s) to `dst` (dtype d).
void convert(const std::byte* src, DType s, std::byte* dst, DType d, std::size_t n) {
  if (s == d) {
    std::memcpy(dst, src, n * size_of(s));
    return;
  }
  for (std::size_t i = 0; i < n; ++i) store_from_float(dst, d, i, load_as_float(src, s, i));
}

}  // namespace

CheckpointReader::CheckpointReader(const fs::path& path, std::string_view tag) : dir_(locate(path, tag)) {
  manifest_ = load_manifest(dir_);
  if (!tag.empty() && manifest_.tag != tag) {
    throw CheckpointError(fmt::format("{} holds the checkpoint of tag {}, not {}", dir_.string(), manifest_.tag, tag));
  }
  index_ = detail::build_reader_index(manifest_, (dir_ / kManifestName).string());
}

const ParamInfo* CheckpointReader::find_param(std::string_view name) const {
  auto it = index_->params.find(name);
  return it == index_->params.end() ? nullptr : &manifest_.params[it->second];
}

bool CheckpointReader::has(std::string_view param, std::string_view kind) const {
  return index_->find(param, kind) != nullptr;
}

void CheckpointReader::prefetch(std::string_view param, std::string_view kind, std::uint64_t first,
                                std::uint64_t count) const {
  const detail::Runs* runs = index_->find(param, kind);
  if (runs == nullptr) return;
  const std::uint64_t end = first + count;
  for (std::uint64_t at = first; at < end;) {
    auto next = std::upper_bound(runs->runs.begin(), runs->runs.end(), at,
                                 [](std::uint64_t e, const detail::Runs::Run& r) { return e < r.first; });
    const auto j = static_cast<std::size_t>(next - runs->runs.begin());
    if (j == 0 || runs->reach[j - 1] <= at) return;  // a gap: read() reports it
    const detail::Runs::Run& run = runs->runs[runs->reach_run[j - 1]];
    const ChunkEntry& chunk = manifest_.files[run.file].chunks[run.chunk];
    try {
      ::posix_fadvise(file_fd(*index_, dir_, manifest_, run.file).get(), static_cast<off_t>(chunk.offset),
                      static_cast<off_t>(chunk.count * size_of(chunk.dtype)), POSIX_FADV_WILLNEED);
    } catch (const CheckpointError&) {
      return;  // a file that cannot be opened: read() reports it
    }
    at = std::min(end, run.end);
  }
}

void CheckpointReader::read(std::string_view param, std::string_view kind, std::uint64_t first, std::uint64_t count,
                            DType out_dtype, std::span<std::byte> out) const {
  ZERO3_CHECK(count <= out.size() && out.size() == count * size_of(out_dtype),
              "CheckpointReader::read(): out holds count * size_of(out_dtype) bytes");
  const ParamInfo* info = find_param(param);
  if (info == nullptr)
    throw CheckpointError(fmt::format("{}: no param \"{}\" in the checkpoint", dir_.string(), param));
  const std::uint64_t numel = info->numel();
  if (first > numel || count > numel - first) {
    throw CheckpointError(fmt::format("{}: {}/{} elements {} are out of range: the param has {} elements",
                                      dir_.string(), param, kind, range_text(first, count), numel));
  }
  if (count == 0) return;
  const detail::Runs* runs = index_->find(param, kind);
  if (runs == nullptr) {
    throw CheckpointError(fmt::format("{}: the checkpoint holds no \"{}\" of param \"{}\"{}", dir_.string(), kind,
                                      param, info->trainable ? "" : " (a frozen param: only \"param\")"));
  }

  // Greedy cover of [first, end): at each uncovered element, the chunk starting at or before it that
  // reaches furthest. Each chunk is read whole (to check its hash) and the needed part converted.
  const std::uint64_t end = first + count;
  prefetch(param, kind, first, count);  // the disk reads ahead while each chunk is hashed and converted
  std::uint64_t pos = first;
  std::vector<std::byte> buf;
  while (pos < end) {
    auto after = std::upper_bound(runs->runs.begin(), runs->runs.end(), pos,
                                  [](std::uint64_t e, const detail::Runs::Run& r) { return e < r.first; });
    const auto j = static_cast<std::size_t>(after - runs->runs.begin());
    if (j == 0 || runs->reach[j - 1] <= pos) {
      throw CheckpointError(
          fmt::format("{}: {}/{} elements {} are not all in the checkpoint (no chunk holds element {})", dir_.string(),
                      param, kind, range_text(first, count), pos));
    }
    const detail::Runs::Run& run = runs->runs[runs->reach_run[j - 1]];
    const ChunkEntry& chunk = manifest_.files[run.file].chunks[run.chunk];
    read_chunk(file_fd(*index_, dir_, manifest_, run.file), chunk, buf);
    const std::uint64_t stop = std::min(end, run.end);
    convert(buf.data() + (pos - run.first) * size_of(chunk.dtype), chunk.dtype,
            out.data() + (pos - first) * size_of(out_dtype), out_dtype, stop - pos);
    pos = stop;
  }
}

namespace {

// The first element of [0, numel) that no run holds, or numel when they cover it all.
std::uint64_t first_gap(const detail::Runs& r, std::uint64_t numel) {
  std::uint64_t pos = 0;
  for (const detail::Runs::Run& run : r.runs) {  // sorted by first element
    if (run.first > pos) return pos;
    pos = std::max(pos, run.end);
  }
  return std::min(pos, numel);
}

}  // namespace

// Every param's values, and each optimizer kind the checkpoint has of it, cover the whole param: a load or
// an export of a checkpoint with a gap would fail (or, worse, be told nothing), so the check that promises
// a usable checkpoint refuses it too.
void CheckpointReader::verify_coverage() const {
  for (const ParamInfo& p : manifest_.params) {
    const std::uint64_t numel = p.numel();
    if (numel == 0) continue;
    if (index_->find(p.name, "param") == nullptr) {
      throw CheckpointError(fmt::format("{}: no chunk holds the values of param \"{}\" (shape [{}])", dir_.string(),
                                        p.name, fmt::join(p.shape, ", ")));
    }
    const auto it = index_->runs.find(p.name);
    for (const auto& [kind, runs] : it->second) {
      const std::uint64_t gap = first_gap(runs, numel);
      if (gap < numel) {
        throw CheckpointError(
            fmt::format("{}: the chunks of {}/{} do not cover its shape [{}] ({} elements): no chunk "
                        "holds element {}",
                        dir_.string(), p.name, kind, fmt::join(p.shape, ", "), numel, gap));
      }
    }
  }
}

void CheckpointReader::verify_all() const {
  verify_coverage();
  std::vector<std::byte> buf;
  for (const FileSummary& file : manifest_.files) {
    const fs::path path = dir_ / file.name;
    detail::FileDescriptor fd = detail::open_read(path);
    const std::uint64_t size = detail::file_size(fd);
    if (size != file.bytes) {
      throw CheckpointError(fmt::format("{}: size {}, manifest says {}", path.string(), size, file.bytes));
    }
    // The file is read once, in offset order: chunks whole (their own hash), any bytes between them in
    // pieces; everything feeds the whole-file hash.
    std::vector<const ChunkEntry*> chunks;
    chunks.reserve(file.chunks.size());
    for (const ChunkEntry& c : file.chunks) chunks.push_back(&c);
    // Empty chunks first at a shared offset, so the walk below never steps back.
    std::sort(chunks.begin(), chunks.end(), [](const ChunkEntry* a, const ChunkEntry* b) {
      return a->offset != b->offset ? a->offset < b->offset : a->count < b->count;
    });
    std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(), &XXH64_freeState);
    if (!state || XXH64_reset(state.get(), 0) != XXH_OK) {
      throw CheckpointError(fmt::format("{}: cannot create an xxh64 state", path.string()));
    }
    std::uint64_t pos = 0;
    std::size_t next = 0;
    while (pos < size) {
      if (next < chunks.size() && chunks[next]->offset == pos) {
        read_chunk(fd, *chunks[next], buf);
        ++next;
      } else {
        const std::uint64_t stop = next < chunks.size() ? chunks[next]->offset : size;
        buf.resize(static_cast<std::size_t>(std::min<std::uint64_t>(stop - pos, kChunkBytes)));
        if (detail::pread_full(fd, pos, buf) != buf.size()) {
          throw CheckpointError(fmt::format("{}: the file ended while being read", path.string()));
        }
      }
      XXH64_update(state.get(), buf.data(), buf.size());
      pos += buf.size();
    }
    const std::uint64_t h = XXH64_digest(state.get());
    if (h != file.xxh64) {
      throw CheckpointError(
          fmt::format("{}: checksum mismatch (xxh64 {:016x}, manifest says {:016x})", path.string(), h, file.xxh64));
    }
  }
}

}  // namespace zero3::ckpt
