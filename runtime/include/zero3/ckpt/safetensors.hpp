// Reading safetensors files (Hugging Face's format: an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and data_offsets, then the data) as untrusted input: the header is
// validated in full before any tensor is read, and nothing is allocated at a size the file merely claims.
// A tensor is read by element range with pread, converted to float on the way (F32, BF16, F16), so a rank
// reads only the slice of each param it keeps. A checkpoint is one file or several with
// model.safetensors.index.json (its weight_map names each tensor's file).
//
//   auto ckpt = zero3::ckpt::SafetensorsCheckpoint::open("Llama-3.2-1B/");   // a dir, or a .safetensors file
//   const auto& t = ckpt.tensor("model.norm.weight");                      // dtype, shape, file
//   std::vector<float> row(t.numel());
//   ckpt.read("model.norm.weight", 0, row);
//
// Every error is a CheckpointError naming the file and, where one is at fault, the tensor.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zero3::ckpt {

enum class SafetensorsDType { f32, bf16, f16 };
std::size_t element_bytes(SafetensorsDType dtype);
std::string_view safetensors_dtype_name(SafetensorsDType dtype);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDType dtype = SafetensorsDType::f32;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets into the data section (after the header)
  std::uint64_t end = 0;
  std::uint64_t numel() const;
};

// The header a file holds: its tensors, sorted by name, and __metadata__'s strings. Parses `header` (the
// JSON text) against a data section of `data_bytes`; CheckpointError naming `file` and the tensor for
// malformed JSON, an unknown dtype, a negative or overflowing shape, a byte count that disagrees with
// dtype x shape, offsets outside the data or overlapping another tensor's, or a non-string metadata value.
struct SafetensorsHeader {
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;
};
SafetensorsHeader parse_safetensors_header(std::string_view header, std::uint64_t data_bytes, const std::string& file);

// The most header bytes a file may declare (safetensors' own reader refuses more than 100 MB).
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

class SafetensorsFile {
 public:
  // Opens and validates `path` (header length within the file and the limit, then the header).
  static std::unique_ptr<SafetensorsFile> open(const std::filesystem::path& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // nullptr when the file has no tensor of that name.
  const SafetensorsTensor* find(std::string_view name) const;
  // Elements [first, first + out.size()) of the tensor (row-major), as float.
  void read(const SafetensorsTensor& tensor, std::uint64_t first, std::span<float> out) const;

 private:
  SafetensorsFile() = default;
  std::filesystem::path path_;
  int fd_ = -1;
  std::uint64_t data_offset_ = 0;
  SafetensorsHeader header_;
};

class SafetensorsCheckpoint {
 public:
  // `path`: a .safetensors file; a directory with model.safetensors.index.json (every file its weight_map
  // names is opened and must hold the tensors it is said to); or a directory with model.safetensors.
  static SafetensorsCheckpoint open(const std::filesystem::path& path);

  // Every tensor, by name. CheckpointError naming the checkpoint for an unknown name.
  const SafetensorsTensor& tensor(std::string_view name) const;
  bool contains(std::string_view name) const;
  std::vector<std::string> names() const;
  // The file a tensor lives in.
  const std::filesystem::path& file_of(std::string_view name) const;
  void read(std::string_view name, std::uint64_t first, std::span<float> out) const;
  // Bytes of all tensors' data.
  std::uint64_t data_bytes() const;
  const std::filesystem::path& path() const { return path_; }
  // What names the checkpoint's contents: its one file, or its index.
  const std::filesystem::path& source() const { return source_; }

 private:
  std::filesystem::path path_;
  std::filesystem::path source_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsTensor*, const SafetensorsFile*>, std::less<>> index_;
};

}  // namespace zero3::ckpt
