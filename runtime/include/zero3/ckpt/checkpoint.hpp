// The checkpoint format: a directory per tag under a root, holding one data file per rank with the rank's
// slices of every param's tensors, keyed by param name and global element offsets (so the layout does not
// depend on the world size), and a manifest written last. No rank ever holds the whole model: writers
// stream their own slices, readers fetch the byte ranges they need.
//
//   ROOT/latest                 the tag of the newest complete checkpoint ("global_step100\n"), replaced
//                               atomically (write + fsync + rename) only after that checkpoint is committed
//   ROOT/TAG/manifest.json      written last: format/version, tag, step, world size, caller's config and its
//                               hash, params (name, unit, shape, dtype), the optimizer's storage dtypes, every
//                               file (size, xxh64, index of chunks with their own xxh64), the caller's opaque
//                               "state" object
//   ROOT/TAG/rank_00003.bin     rank 3's chunks, back to back; each chunk is one run of one (param, kind)
//   ROOT/.tmp.TAG/              a save in progress: renamed to ROOT/TAG by commit() after fsync
//
// A chunk is at most kChunkBytes, so a reader that needs part of a slice reads (and verifies) at most one
// chunk more than it needs at each end; peak memory of reads and of export is bounded by it.
// Every failure throws CheckpointError naming the file (and errno's text for I/O), never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/core/dtype.hpp"

namespace zero3::ckpt {

namespace detail {
struct ReaderIndex;  // the reader's chunk index and open files (reader.cpp)
}

inline constexpr std::size_t kChunkBytes = std::size_t{4} << 20;
inline constexpr std::string_view kFormat = "zero3-checkpoint";
inline constexpr int kVersion = 1;

// A run of elements [first, first + count) of the flattened (row-major) param `param`, of tensor `kind`
// ("param": the low-precision model weights; "master", "exp_avg", "exp_avg_sq": the optimizer state, in the
// dtypes the optimizer stores them, Manifest::master_dtype and state_dtype), in `dtype`. `offset` is its byte offset in
// its file; `xxh64` the hash of its bytes (seed 0).
struct ChunkEntry {
  std::string param;
  std::string kind;
  DType dtype = DType::f32;
  std::uint64_t first = 0;
  std::uint64_t count = 0;
  std::uint64_t offset = 0;
  std::uint64_t xxh64 = 0;
};

struct FileSummary {
  std::string name;  // "rank_00003.bin", relative to the checkpoint directory
  int rank = 0;
  std::uint64_t bytes = 0;
  std::uint64_t xxh64 = 0;  // of the whole file
  std::vector<ChunkEntry> chunks;
};
nlohmann::json to_json(const FileSummary& f);
FileSummary file_summary_from_json(const nlohmann::json& j);  // CheckpointError naming the bad field

struct ParamInfo {
  std::string name;
  std::string unit;
  std::vector<std::int64_t> shape;
  DType dtype = DType::f32;  // the low-precision ("param") dtype
  bool trainable = true;     // false: no master or moments, only "param"
  std::uint64_t numel() const;
};

struct Manifest {
  std::string tag;
  std::int64_t step = 0;
  int world_size = 1;
  nlohmann::json config;    // the caller's resolved config
  std::string config_hash;  // the caller's hash of it
  std::vector<ParamInfo> params;
  // How the saving job's optimizer stored its master weights and its moments ("optimizer_storage": {"master",
  // "state"}); a manifest without the field (written before 16-bit storage existed) reads as fp32 for both.
  DType master_dtype = DType::f32;
  DType state_dtype = DType::f32;
  std::vector<FileSummary> files;
  nlohmann::json state;  // the caller's opaque state (scheduler, loss scaler, RNG, sampler, counters)
};
nlohmann::json to_json(const Manifest& m);
Manifest manifest_from_json(const nlohmann::json& j, const std::string& source);  // source: for messages
// A manifest.json's text, as read from disk: invalid JSON, nesting deeper than kMaxManifestDepth (in the
// caller's config and state too) and every bad field throw CheckpointError naming `source`.
inline constexpr int kMaxManifestDepth = 128;
Manifest manifest_from_text(std::string_view text, const std::string& source);

namespace detail {
// What CheckpointReader checks at open beyond the fields (names unique, chunks inside their param, no two
// chunks sharing bytes of a file), building its index; CheckpointError naming `source`.
std::shared_ptr<ReaderIndex> build_reader_index(const Manifest& m, const std::string& source);
}  // namespace detail

// Paths under a root.
std::filesystem::path checkpoint_dir(const std::filesystem::path& root, std::string_view tag);
std::filesystem::path staging_dir(const std::filesystem::path& root, std::string_view tag);  // ROOT/.tmp.TAG
// Throws CheckpointError for a tag that is empty, "latest", starts with '.', or holds '/' or a NUL.
void check_tag(std::string_view tag);
// The tag ROOT/latest names, or nullopt when ROOT/latest does not exist. Throws when it is unreadable/empty.
std::optional<std::string> read_latest(const std::filesystem::path& root);

// Writes one rank's data file into a staging directory (which must exist). Buffered sequential writes;
// append() splits the data into chunks of at most kChunkBytes. finish() flushes, fsyncs and closes; the
// destructor of an unfinished writer closes and removes the file. Any I/O error (ENOSPC: "no space left
// on device") throws CheckpointError naming the file; the writer is then unusable.
class RankFileWriter {
 public:
  RankFileWriter(const std::filesystem::path& staging, int rank);
  ~RankFileWriter();
  RankFileWriter(const RankFileWriter&) = delete;
  RankFileWriter& operator=(const RankFileWriter&) = delete;

  // `data` holds count * size_of(dtype) bytes.
  void append(std::string_view param, std::string_view kind, DType dtype, std::uint64_t first, std::uint64_t count,
              std::span<const std::byte> data);
  FileSummary finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Prepares ROOT/.tmp.TAG for a save (removing what a crashed save left there) and creates ROOT. Rank 0
// calls it before any rank writes (the caller orders this with a barrier).
void prepare_staging(const std::filesystem::path& root, std::string_view tag);

// Rank 0, after every rank's finish(): writes manifest.json into the staging directory (through a
// temporary file, fsynced), fsyncs the directory, moves it to ROOT/TAG (an existing ROOT/TAG is replaced
// unless ROOT/latest names it: then CheckpointError, since `latest` must always name a complete
// checkpoint), fsyncs ROOT, then replaces ROOT/latest atomically and fsyncs ROOT again. A crash at any
// point leaves ROOT/latest naming a complete checkpoint (or absent, before the first commit).
void commit(const std::filesystem::path& root, const Manifest& manifest);

// Reads a committed checkpoint. `path` is a checkpoint directory (holding manifest.json), or a root: then
// `tag`, or ROOT/latest when `tag` is empty. Errors name what is wrong: "no checkpoint at P (no
// manifest.json and no latest)", "P/latest names tag T, but P/T does not exist", "tag T does not exist in P",
// "P/manifest.json: not a zero3 checkpoint (format ...)".
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::filesystem::path& path, std::string_view tag = {});

  const Manifest& manifest() const { return manifest_; }
  const std::filesystem::path& dir() const { return dir_; }
  const ParamInfo* find_param(std::string_view name) const;

  // Checks that every param's values, and each optimizer kind the checkpoint holds of it, are covered by
  // its chunks whole; then reads every file whole (streaming, bounded memory) and checks its size and
  // xxh64, and every chunk's hash. Throws CheckpointError naming the param, kind and first missing element,
  // or the first bad file ("rank_00001.bin: size 1234, manifest says 5678" / "checksum mismatch").
  void verify_all() const;
  // The coverage part of verify_all() alone (reads no file).
  void verify_coverage() const;

  // Elements [first, first + count) of (param, kind), converted to `out_dtype` (f32, bf16 or f16) into
  // `out` (count * size_of(out_dtype) bytes). Reads only the chunks that overlap, with pread, verifying
  // each chunk's hash. Throws CheckpointError naming the param/kind/range when the checkpoint does not
  // cover it, or the file when a chunk is short or corrupt.
  void read(std::string_view param, std::string_view kind, std::uint64_t first, std::uint64_t count, DType out_dtype,
            std::span<std::byte> out) const;
  // True when the checkpoint holds `kind` for `param` (frozen params have only "param").
  bool has(std::string_view param, std::string_view kind) const;
  // Asks the kernel to start reading the chunks a later read() of this range will need
  // (posix_fadvise WILLNEED), so the disk works while the caller processes what it already has. Advisory:
  // never fails, reads nothing itself.
  void prefetch(std::string_view param, std::string_view kind, std::uint64_t first, std::uint64_t count) const;

 private:
  std::filesystem::path dir_;
  Manifest manifest_;
  // Built at open: params by name, (param, kind) -> chunks sorted by element; descriptors opened on first
  // use. Shared by copies of the reader (it refers to the manifest by index, never by pointer).
  std::shared_ptr<detail::ReaderIndex> index_;
};

// Streams the model's weights into a safetensors file: each param's "master" (fp32) where the checkpoint
// has it, else its "param" tensor, converted to `dtype` (f32 or bf16), under its name and shape, in the
// manifest's param order. Peak memory is bounded by kChunkBytes-sized buffers, whatever the model size.
// Writes OUT through a temporary file renamed into place.
void export_safetensors(const CheckpointReader& reader, const std::filesystem::path& out, DType dtype);
// The same as Hugging Face lays a checkpoint out in a directory: DIR/model.safetensors when the data fits
// in max_shard_bytes, else DIR/model-0000i-of-0000N.safetensors, each below the limit (a larger tensor
// alone), in the manifest's order, and DIR/model.safetensors.index.json (metadata.total_size, weight_map).
// Returns the files written.
std::vector<std::filesystem::path> export_safetensors_shards(const CheckpointReader& reader,
                                                             const std::filesystem::path& dir, DType dtype,
                                                             std::uint64_t max_shard_bytes);

}  // namespace zero3::ckpt
