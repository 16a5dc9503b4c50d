#include "zero3/data/token_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "zero3/core/error.hpp"

namespace zero3::data {
namespace {

constexpr std::int64_t kMaxVocab = std::int64_t{std::numeric_limits<TokenId>::max()} + 1;
constexpr std::int64_t kScanBlock = std::int64_t{1} << 16;

std::uint64_t load_le(const std::byte* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint64_t>(p[i]);
  return v;
}

void store_le(std::byte* p, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xffu);
}

// The id at `index` of a packed little-endian array; fixed widths so the scan loop vectorizes.
template <int kWidth>
std::uint32_t id_at(const std::byte* ids, std::int64_t index) {
  const std::byte* p = ids + index * kWidth;
  std::uint32_t v = 0;
  for (int i = kWidth - 1; i >= 0; --i) v = (v << 8) | std::to_integer<std::uint32_t>(p[i]);
  return v;
}

std::uint32_t id_at(const std::byte* ids, std::int64_t index, int width) {
  return width == 2 ? id_at<2>(ids, index) : id_at<4>(ids, index);
}

// The first index whose id is >= vocab, or -1: block maxima first (cheap), the exact index only in a bad block.
template <int kWidth>
std::int64_t first_out_of_vocab(const std::byte* ids, std::int64_t count, std::uint64_t vocab) {
  for (std::int64_t begin = 0; begin < count; begin += kScanBlock) {
    const std::int64_t end = std::min(count, begin + kScanBlock);
    std::uint32_t block_max = 0;
    for (std::int64_t i = begin; i < end; ++i) block_max = std::max(block_max, id_at<kWidth>(ids, i));
    if (block_max < vocab) continue;
    for (std::int64_t i = begin; i < end; ++i) {
      if (id_at<kWidth>(ids, i) >= vocab) return i;
    }
  }
  return -1;
}

std::string printable(const std::byte* p, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = std::to_integer<unsigned char>(p[i]);
    out += (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') ? std::string(1, static_cast<char>(c))
                                                            : fmt::format("\\x{:02x}", c);
  }
  return out;
}

}  // namespace

void write_token_file(const std::filesystem::path& path, std::span<const TokenId> ids, std::int64_t vocab_size,
                      int bytes_per_token) {
  if (bytes_per_token != 2 && bytes_per_token != 4) {
    throw ConfigError(
        fmt::format("token file '{}': bytes_per_token must be 2 or 4, got {}", path.string(), bytes_per_token));
  }
  const std::int64_t width_limit = bytes_per_token == 2 ? std::int64_t{1} << 16 : kMaxVocab;
  if (vocab_size < 1 || vocab_size > width_limit) {
    throw ConfigError(fmt::format("token file '{}': vocab_size {} does not fit {} bytes per token (1 to {})",
                                  path.string(), vocab_size, bytes_per_token, width_limit));
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size) {
      throw ConfigError(fmt::format("token file '{}': token {} has id {}, outside [0, vocab_size = {})", path.string(),
                                    i, ids[i], vocab_size));
    }
  }

  const std::filesystem::path tmp = path.string() + fmt::format(".tmp.{}", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    throw ConfigError(
        fmt::format("token file '{}': cannot create '{}': {}", path.string(), tmp.string(), std::strerror(errno)));
  }
  bool ok = true;
  std::byte header[kTokenFileHeaderBytes] = {};
  std::memcpy(header, kTokenFileMagic, sizeof(kTokenFileMagic));
  store_le(header + 8, kTokenFileVersion, 4);
  store_le(header + 12, static_cast<std::uint64_t>(bytes_per_token), 4);
  store_le(header + 16, static_cast<std::uint64_t>(vocab_size), 8);
  store_le(header + 24, ids.size(), 8);
  ok = ok && std::fwrite(header, 1, sizeof(header), f) == sizeof(header);
  std::vector<std::byte> chunk;
  for (std::size_t begin = 0; ok && begin < ids.size(); begin += kScanBlock) {
    const std::size_t end = std::min(ids.size(), begin + static_cast<std::size_t>(kScanBlock));
    chunk.resize((end - begin) * static_cast<std::size_t>(bytes_per_token));
    for (std::size_t i = begin; i < end; ++i) {
      store_le(chunk.data() + (i - begin) * static_cast<std::size_t>(bytes_per_token),
               static_cast<std::uint64_t>(ids[i]), bytes_per_token);
    }
    ok = std::fwrite(chunk.data(), 1, chunk.size(), f) == chunk.size();
  }
  ok = ok && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int write_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = ok ? errno : write_errno;
    std::remove(tmp.c_str());
    throw ConfigError(fmt::format("token file '{}': writing failed: {}", path.string(), std::strerror(err)));
  }
}

const char* token_file_format_name(TokenFileFormat format) {
  switch (format) {
    case TokenFileFormat::zero3:
      return "zero3";
    case TokenFileFormat::llmc:
      return "llm.c";
    case TokenFileFormat::raw16:
      return "raw uint16";
  }
  return "?";
}

TokenFile TokenFile::map(const std::filesystem::path& path, double heldout_fraction) {
  const std::string name = path.string();
  if (!(heldout_fraction > 0.0 && heldout_fraction < 1.0)) {
    throw ConfigError(
        fmt::format("token file '{}': zero3.data.heldout_fraction must be in (0, 1), got {}", name, heldout_fraction));
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ConfigError(fmt::format("token file '{}': cannot open: {}", name, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    const int err = errno;
    ::close(fd);
    throw ConfigError(fmt::format("token file '{}': not a readable regular file{}", name,
                                  S_ISREG(st.st_mode) ? fmt::format(": {}", std::strerror(err)) : ""));
  }
  const auto file_bytes = static_cast<std::uint64_t>(st.st_size);
  if (file_bytes == 0) {
    ::close(fd);
    throw ConfigError(fmt::format("token file '{}': the file is empty", name));
  }
  void* mapped = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapped == MAP_FAILED) {
    throw ConfigError(
        fmt::format("token file '{}': cannot map {} bytes: {}", name, file_bytes, std::strerror(map_errno)));
  }
  TokenFile file;  // owns the mapping from here on, so every throw unmaps it
  file.path_ = path;
  file.mapping_ = static_cast<const std::byte*>(mapped);
  file.mapping_bytes_ = file_bytes;
  return file;
}

// ids_ after `header_bytes`, `count` of `width` bytes each, which must fill the rest of the file exactly.
void TokenFile::set_ids(std::size_t header_bytes, std::uint64_t width, std::uint64_t count) {
  const std::uint64_t payload = mapping_bytes_ - header_bytes;
  if (count > payload / width || count * width != payload) {
    throw ConfigError(fmt::format(
        "token file '{}': size mismatch: the header says {} tokens x {} bytes, but {} bytes follow the {}-byte "
        "header ({})",
        path_.string(), count, width, payload, header_bytes, count > payload / width ? "truncated" : "trailing bytes"));
  }
  ids_ = mapping_ + header_bytes;
  bytes_per_token_ = static_cast<int>(width);
  token_count_ = static_cast<std::int64_t>(count);
}

void TokenFile::read_zero3_header() {
  const std::string name = path_.string();
  const std::byte* header = mapping_;
  if (mapping_bytes_ < kTokenFileHeaderBytes) {
    throw ConfigError(
        fmt::format("token file '{}': {} bytes, shorter than the {}-byte header (truncated, or not a "
                    "token file)",
                    name, mapping_bytes_, kTokenFileHeaderBytes));
  }
  const std::uint64_t version = load_le(header + 8, 4);
  if (version != kTokenFileVersion) {
    throw ConfigError(fmt::format("token file '{}': unsupported version {} (this build reads version {})", name,
                                  version, kTokenFileVersion));
  }
  const std::uint64_t width = load_le(header + 12, 4);
  if (width != 2 && width != 4) {
    throw ConfigError(fmt::format("token file '{}': unsupported bytes_per_token {} (2 or 4)", name, width));
  }
  const std::uint64_t vocab = load_le(header + 16, 8);
  if (vocab < 1 || vocab > static_cast<std::uint64_t>(kMaxVocab)) {
    throw ConfigError(fmt::format("token file '{}': header vocab_size {} outside [1, {}]", name, vocab, kMaxVocab));
  }
  set_ids(kTokenFileHeaderBytes, width, load_le(header + 24, 8));
  vocab_size_ = static_cast<std::int64_t>(vocab);
  format_ = TokenFileFormat::zero3;
}

void TokenFile::read_llmc_header() {
  const std::string name = path_.string();
  if (mapping_bytes_ < kLlmcHeaderBytes) {
    throw ConfigError(fmt::format(
        "token file '{}': llm.c magic, but {} bytes, shorter than llm.c's {}-byte header (256 x int32; truncated)",
        name, mapping_bytes_, kLlmcHeaderBytes));
  }
  const auto magic = static_cast<std::int32_t>(load_le(mapping_, 4));
  const auto version = static_cast<std::int32_t>(load_le(mapping_ + 4, 4));
  const auto count = static_cast<std::int32_t>(load_le(mapping_ + 8, 4));
  const std::int32_t expected_version = magic == kLlmcMagicGpt2 ? 1 : 7;
  if (version != expected_version) {
    throw ConfigError(fmt::format("token file '{}': llm.c magic {} with version {}; this build reads version {}", name,
                                  magic, version, expected_version));
  }
  if (count < 0) throw ConfigError(fmt::format("token file '{}': llm.c header token count {} < 0", name, count));
  set_ids(kLlmcHeaderBytes, magic == kLlmcMagicGpt2 ? 2 : 4, static_cast<std::uint64_t>(count));
  vocab_size_ = 0;
  format_ = TokenFileFormat::llmc;
}

void TokenFile::validate_ids(double heldout_fraction) {
  const std::string name = path_.string();
  if (token_count_ == 0) throw ConfigError(fmt::format("token file '{}': holds no tokens", name));
  ::madvise(const_cast<std::byte*>(mapping_), mapping_bytes_, MADV_SEQUENTIAL);  // a hint; may fail
  if (vocab_size_ == 0) {  // no vocabulary in the file: every id a TokenId holds is allowed
    const auto limit = static_cast<std::uint64_t>(kMaxVocab);
    const std::int64_t bad = bytes_per_token_ == 2 ? -1 : first_out_of_vocab<4>(ids_, token_count_, limit);
    if (bad >= 0) {
      throw ConfigError(fmt::format("token file '{}': token {} has id {}, beyond the largest id this build reads ({})",
                                    name, bad, id_at(ids_, bad, bytes_per_token_), limit - 1));
    }
    std::uint32_t largest = 0;
    for (std::int64_t i = 0; i < token_count_; ++i) largest = std::max(largest, id_at(ids_, i, bytes_per_token_));
    vocab_size_ = static_cast<std::int64_t>(largest) + 1;
  } else {
    const auto vocab = static_cast<std::uint64_t>(vocab_size_);
    const std::int64_t bad = bytes_per_token_ == 2 ? first_out_of_vocab<2>(ids_, token_count_, vocab)
                                                   : first_out_of_vocab<4>(ids_, token_count_, vocab);
    if (bad >= 0) {
      throw ConfigError(fmt::format("token file '{}': token {} has id {}, outside [0, vocab_size = {})", name, bad,
                                    id_at(ids_, bad, bytes_per_token_), vocab));
    }
  }
  ::madvise(const_cast<std::byte*>(mapping_), mapping_bytes_, MADV_RANDOM);  // training reads windows
  const auto heldout = static_cast<std::int64_t>(std::floor(heldout_fraction * static_cast<double>(token_count_)));
  train_tokens_ = token_count_ - heldout;
}

TokenFile TokenFile::open(const std::filesystem::path& path, double heldout_fraction) {
  TokenFile file = map(path, heldout_fraction);
  const std::size_t magic_bytes = std::min(file.mapping_bytes_, sizeof(kTokenFileMagic));
  const auto llmc_magic =
      file.mapping_bytes_ >= 4 ? static_cast<std::int32_t>(load_le(file.mapping_, 4)) : std::int32_t{0};
  if (magic_bytes == sizeof(kTokenFileMagic) &&
      std::memcmp(file.mapping_, kTokenFileMagic, sizeof(kTokenFileMagic)) == 0) {
    file.read_zero3_header();
  } else if (llmc_magic == kLlmcMagicGpt2 || llmc_magic == kLlmcMagicLlama3) {
    file.read_llmc_header();
  } else if (file.mapping_bytes_ < kTokenFileHeaderBytes) {
    throw ConfigError(
        fmt::format("token file '{}': {} bytes, shorter than the {}-byte header (truncated, or not a "
                    "token file)",
                    path.string(), file.mapping_bytes_, kTokenFileHeaderBytes));
  } else {
    throw ConfigError(fmt::format(
        "token file '{}': bad magic \"{}\", expected \"ZERO3TOK\" (zero3) or the int32 {} or {} (llm.c); a "
        "headerless file of uint16 ids is read with \"raw16:{}\"",
        path.string(), printable(file.mapping_, magic_bytes), kLlmcMagicGpt2, kLlmcMagicLlama3, path.string()));
  }
  file.validate_ids(heldout_fraction);
  return file;
}

TokenFile TokenFile::open_raw16(const std::filesystem::path& path, double heldout_fraction) {
  TokenFile file = map(path, heldout_fraction);
  if (file.mapping_bytes_ % 2 != 0) {
    throw ConfigError(fmt::format("token file '{}': {} bytes, an odd count, cannot hold uint16 ids (truncated?)",
                                  path.string(), file.mapping_bytes_));
  }
  file.set_ids(0, 2, file.mapping_bytes_ / 2);
  file.vocab_size_ = 0;
  file.format_ = TokenFileFormat::raw16;
  file.validate_ids(heldout_fraction);
  return file;
}

TokenFile::TokenFile(TokenFile&& other) noexcept {
  *this = std::move(other);
}

TokenFile& TokenFile::operator=(TokenFile&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    ids_ = std::exchange(other.ids_, nullptr);
    vocab_size_ = std::exchange(other.vocab_size_, 0);
    token_count_ = std::exchange(other.token_count_, 0);
    train_tokens_ = std::exchange(other.train_tokens_, 0);
    bytes_per_token_ = std::exchange(other.bytes_per_token_, 0);
    format_ = other.format_;
  }
  return *this;
}

TokenFile::~TokenFile() {
  release();
}

void TokenFile::release() noexcept {
  if (mapping_ != nullptr) ::munmap(const_cast<std::byte*>(mapping_), mapping_bytes_);
  mapping_ = nullptr;
  ids_ = nullptr;
}

std::int64_t TokenFile::split_tokens(Split split) const {
  return split == Split::train ? train_tokens_ : token_count_ - train_tokens_;
}

std::int64_t TokenFile::num_samples(Split split, std::int64_t context_len) const {
  ZERO3_CHECK(context_len >= 1, fmt::format("context_len must be >= 1, got {}", context_len));
  const std::int64_t n = split_tokens(split);
  return n < context_len + 1 ? 0 : (n - 1) / context_len;
}

void TokenFile::tokens(Split split, std::int64_t sample_index, std::int64_t context_len, std::span<TokenId> out) const {
  const std::int64_t count = num_samples(split, context_len);
  ZERO3_CHECK(sample_index >= 0 && sample_index < count,
              fmt::format("token file '{}': {} sample {} out of range [0, {}) for context_len {}", path_.string(),
                          split_name(split), sample_index, count, context_len));
  ZERO3_CHECK(static_cast<std::int64_t>(out.size()) == context_len + 1,
              fmt::format("token file '{}': out holds {} tokens, a window is context_len + 1 = {}", path_.string(),
                          out.size(), context_len + 1));
  const std::int64_t first = (split == Split::train ? 0 : train_tokens_) + sample_index * context_len;
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<TokenId>(id_at(ids_, first + static_cast<std::int64_t>(i), bytes_per_token_));
  }
}

void TokenFile::check_context(std::int64_t context_len) const {
  if (context_len < 1) {
    throw ConfigError(fmt::format("token file '{}': context length must be >= 1, got {}", path_.string(), context_len));
  }
  if (num_samples(Split::train, context_len) < 1 || num_samples(Split::heldout, context_len) < 1) {
    throw ConfigError(fmt::format(
        "token file '{}': context length {} needs windows of {} tokens, but the file's {} tokens split into {} "
        "train and {} held-out; use a shorter zero3.model.seq_len, a longer file, or adjust "
        "zero3.data.heldout_fraction",
        path_.string(), context_len, context_len + 1, token_count_, split_tokens(Split::train),
        split_tokens(Split::heldout)));
  }
}

TokenId TokenFile::at(std::int64_t index) const {
  ZERO3_CHECK(index >= 0 && index < token_count_,
              fmt::format("token file '{}': index {} outside [0, {})", path_.string(), index, token_count_));
  return static_cast<TokenId>(id_at(ids_, index, bytes_per_token_));
}

std::string TokenFile::describe() const {
  return fmt::format("{}:{} ({} file, {} tokens x {} bytes, {}={}, {} train / {} held-out)",
                     format_ == TokenFileFormat::raw16 ? "raw16" : "tokens", path_.string(),
                     token_file_format_name(format_), token_count_, bytes_per_token_,
                     format_ == TokenFileFormat::zero3 ? "vocab_size" : "largest id + 1", vocab_size_,
                     split_tokens(Split::train), split_tokens(Split::heldout));
}

}  // namespace zero3::data
