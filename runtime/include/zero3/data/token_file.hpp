// TokenFile: a read-only, memory-mapped file of token ids in the zero3 token format, validated in full on
// open, serving non-overlapping training and held-out windows. The mapping is owned by the TokenFile
// (move-only) and released on destruction; after open every method is const and thread-safe.
//
// Format (little endian): 32-byte header, then `token_count` ids of `bytes_per_token` bytes each.
//   offset 0  char[8] magic "ZERO3TOK" | 8 u32 version (1) | 12 u32 bytes_per_token (2 or 4)
//   offset 16 u64 vocab_size            | 24 u64 token_count  | 32 ids...   (file size = 32 + count * width)
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

// Writes `ids` in the token format with the given width (2 or 4 bytes per token), atomically: to
// "<path>.tmp.<pid>" then renamed over `path`, so a reader never sees a half-written file. ConfigError
// naming the file when an id is >= vocab_size, the width cannot hold vocab_size - 1, or I/O fails.
void write_token_file(const std::filesystem::path& path, std::span<const TokenId> ids, std::int64_t vocab_size,
                      int bytes_per_token);

class TokenFile final : public TokenSource {
 public:
  // Maps and validates `path`; ConfigError naming the file when it is missing or unreadable (with the OS
  // reason), its magic is wrong, its version or width unsupported, its size disagrees with the header, or a
  // token id is >= the header's vocab_size (naming the first offending index and value).
  // heldout_fraction in (0, 1): the last floor(heldout_fraction * token_count) tokens are held out.
  static TokenFile open(const std::filesystem::path& path, double heldout_fraction = 0.1);

  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  ~TokenFile() override;

  std::int64_t vocab_size() const override { return vocab_size_; }
  std::int64_t token_count() const { return token_count_; }
  int bytes_per_token() const { return bytes_per_token_; }
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
  void release() noexcept;

  std::filesystem::path path_;
  const std::byte* mapping_ = nullptr;  // the whole file, read-only
  std::size_t mapping_bytes_ = 0;
  const std::byte* ids_ = nullptr;  // mapping_ + kTokenFileHeaderBytes
  std::int64_t vocab_size_ = 0;
  std::int64_t token_count_ = 0;
  std::int64_t train_tokens_ = 0;
  int bytes_per_token_ = 0;
};

}  // namespace zero3::data
