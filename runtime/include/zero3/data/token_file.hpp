// TokenFile: a read-only, memory-mapped file of token ids, validated in full on open, serving non-overlapping
// training and held-out windows. The mapping is owned by the TokenFile (move-only) and released on
// destruction; after open every method is const and thread-safe.
//
// Three layouts, all little endian (docs/data.md):
//   zero3  32-byte header, then `token_count` ids of `bytes_per_token` bytes each.
//            offset 0  char[8] magic "ZERO3TOK" | 8 u32 version (1) | 12 u32 bytes_per_token (2 or 4)
//            offset 16 u64 vocab_size            | 24 u64 token_count  | 32 ids...  (size = 32 + count * width)
//   llmc   llm.c's shards (dev/data/data_common.py in karpathy/llm.c): 256 x int32 header (magic 20240520,
//            version 1, token count), then uint16 ids; its Llama 3 variant (magic 20240801, version 7) has
//            uint32 ids. The file names no vocabulary: vocab_size() is the largest id + 1.
//   raw16  no header, uint16 ids only (nanoGPT's train.bin / val.bin); vocab_size() is the largest id + 1.
// `open` recognises zero3 and llm.c files by their header; a headerless file is opened with `open_raw16`.
//
//   auto file = zero3::data::TokenFile::open("shard_000001.bin", 0.1);   // an llm.c shard
//   std::vector<zero3::data::TokenId> window(1025);
//   file.tokens(zero3::data::Split::train, 0, 1024, window);
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "zero3/data/token_source.hpp"

namespace zero3::data {

inline constexpr char kTokenFileMagic[8] = {'Z', 'E', 'R', 'O', '3', 'T', 'O', 'K'};
inline constexpr std::uint32_t kTokenFileVersion = 1;
inline constexpr std::size_t kTokenFileHeaderBytes = 32;
inline constexpr std::int32_t kLlmcMagicGpt2 = 20240520;    // version 1, uint16 ids
inline constexpr std::int32_t kLlmcMagicLlama3 = 20240801;  // version 7, uint32 ids
inline constexpr std::size_t kLlmcHeaderBytes = 256 * 4;

enum class TokenFileFormat { zero3, llmc, raw16 };

const char* token_file_format_name(TokenFileFormat format);

// Writes `ids` in the token format with the given width (2 or 4 bytes per token), atomically: to
// "<path>.tmp.<pid>" then renamed over `path`, so a reader never sees a half-written file. ConfigError
// naming the file when an id is >= vocab_size, the width cannot hold vocab_size - 1, or I/O fails.
void write_token_file(const std::filesystem::path& path, std::span<const TokenId> ids, std::int64_t vocab_size,
                      int bytes_per_token);

class TokenFile final : public TokenSource {
 public:
  // Maps and validates a zero3 or llm.c file, recognised by its header; ConfigError naming the file when it
  // is missing or unreadable (with the OS reason), its magic is neither format's, its version or width
  // unsupported, its size disagrees with the header, or a token id is >= the header's vocab_size (naming
  // the first offending index and value). heldout_fraction in (0, 1): the last
  // floor(heldout_fraction * token_count) tokens are held out.
  static TokenFile open(const std::filesystem::path& path, double heldout_fraction = 0.1);
  // A headerless file of uint16 ids; ConfigError naming the file when it is unreadable, empty or of an odd
  // byte count.
  static TokenFile open_raw16(const std::filesystem::path& path, double heldout_fraction = 0.1);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile() override;

  std::int64_t vocab_size() const override { return vocab_size_; }
  std::int64_t token_count() const { return token_count_; }
  int bytes_per_token() const { return bytes_per_token_; }
  TokenFileFormat format() const { return format_; }
  const std::filesystem::path& path() const { return path_; }
  // Tokens of a split: train is [0, train_tokens()), held-out the rest.
  std::int64_t split_tokens(Split split) const;

  // Sample i of a split starts at token i * context_len of that split and holds context_len + 1 tokens:
  // windows advance by context_len so each one's last target is the next one's first input, and every token
  // of the split after its first is a target exactly once per epoch. Windows never cross the split boundary.
  std::int64_t num_samples(Split split, std::int64_t context_len) const override;
  void tokens(Split split, std::int64_t sample_index, std::int64_t context_len, std::span<TokenId> out) const override;
  std::string describe() const override;

  // ConfigError naming the file and both lengths when either split is too short for one window of
  // context_len + 1 tokens (the context is longer than the data).
  void check_context(std::int64_t context_len) const;

  // Token `index` of the whole file (no split), for tests and tools.
  TokenId at(std::int64_t index) const;

 private:
  TokenFile() = default;
  static TokenFile map(const std::filesystem::path& path, double heldout_fraction);
  void read_zero3_header();
  void read_llmc_header();
  void set_ids(std::size_t header_bytes, std::uint64_t width, std::uint64_t count);
  void validate_ids(double heldout_fraction);  // vocab_size_ 0: none in the file, take the largest id + 1
  void release() noexcept;

  std::filesystem::path path_;
  const std::byte* mapping_ = nullptr;  // the whole file, read-only
  std::size_t mapping_bytes_ = 0;
  const std::byte* ids_ = nullptr;  // mapping_ + kTokenFileHeaderBytes
  std::int64_t vocab_size_ = 0;
  std::int64_t token_count_ = 0;
  std::int64_t train_tokens_ = 0;
  int bytes_per_token_ = 0;
  TokenFileFormat format_ = TokenFileFormat::zero3;
};

}  // namespace zero3::data
