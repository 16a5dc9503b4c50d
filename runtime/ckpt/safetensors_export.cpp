// Export of a checkpoint's weights as one safetensors file: an 8-byte little-endian header length, the
// JSON header (dtype, shape, data_offsets per tensor; string-valued __metadata__), padded with spaces to
// a multiple of 8, then every tensor's bytes back to back in the manifest's param order. The data is
// streamed through one kChunkBytes buffer, so memory does not grow with the model.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <system_error>
#include <vector>

#include "posix_io.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/core/error.hpp"

namespace zero3::ckpt {
namespace {

namespace fs = std::filesystem;

std::string_view safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
  }
  return "?";
}

struct Tensor {
  const ParamInfo* param = nullptr;
  std::string_view kind;
  std::uint64_t numel = 0;
};

// The header text, padded so the data starts 8-byte aligned.
std::string header_text(const Manifest& m, const std::vector<Tensor>& tensors, DType dtype) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  std::uint64_t offset = 0;
  for (const Tensor& t : tensors) {
    const std::uint64_t bytes = t.numel * size_of(dtype);
    header[t.param->name] = {
        {"dtype", safetensors_dtype(dtype)}, {"shape", t.param->shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  header["__metadata__"] = {{"format", "pt"}, {"zero3_tag", m.tag}, {"zero3_step", std::to_string(m.step)}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// Gathers output into whole-buffer writes: many small tensors do not become many small writes.
class BufferedOut {
 public:
  explicit BufferedOut(detail::FileDescriptor& fd) : fd_(fd), buf_(kChunkBytes) {}
  std::span<std::byte> space() { return std::span(buf_).subspan(used_); }
  void commit(std::size_t bytes) { used_ += bytes; }
  void flush() {
    detail::write_all(fd_, std::span(buf_).first(used_));
    used_ = 0;
  }

 private:
  detail::FileDescriptor& fd_;
  std::vector<std::byte> buf_;
  std::size_t used_ = 0;
};

void write_tensors(const CheckpointReader& reader, const std::vector<Tensor>& tensors, DType dtype,
                   detail::FileDescriptor& fd) {
  const std::size_t elem = size_of(dtype);
  BufferedOut out(fd);
  for (const Tensor& t : tensors) {
    std::uint64_t pos = 0;
    while (pos < t.numel) {
      std::span<std::byte> space = out.space();
      const std::uint64_t n = std::min<std::uint64_t>(t.numel - pos, space.size() / elem);
      if (n == 0) {
        out.flush();
        continue;
      }
      const std::size_t bytes = static_cast<std::size_t>(n) * elem;
      reader.read(t.param->name, t.kind, pos, n, dtype, space.first(bytes));
      out.commit(bytes);
      pos += n;
    }
  }
  out.flush();
}

}  // namespace

namespace {

std::vector<Tensor> exported_tensors(const CheckpointReader& reader) {
  const Manifest& m = reader.manifest();
  std::vector<Tensor> tensors;
  tensors.reserve(m.params.size());
  for (const ParamInfo& p : m.params) {
    if (p.name == "__metadata__") {
      throw CheckpointError(
          fmt::format("{}: a param named \"__metadata__\" cannot be exported to safetensors", reader.dir().string()));
    }
    tensors.push_back({&p, reader.has(p.name, "master") ? "master" : "param", p.numel()});
  }
  return tensors;
}

// One safetensors file of `tensors`, through a temporary renamed into place.
void write_file(const CheckpointReader& reader, const std::vector<Tensor>& tensors, const fs::path& out, DType dtype) {
  const std::string header = header_text(reader.manifest(), tensors, dtype);
  fs::path tmp = out;
  tmp += ".tmp";
  try {
    detail::FileDescriptor fd = detail::create_file(tmp);
    std::array<std::byte, 8> length{};
    for (std::size_t i = 0; i < length.size(); ++i) {
      length[i] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xffu);
    }
    detail::write_all(fd, length);
    detail::write_all(fd, std::as_bytes(std::span(header.data(), header.size())));
    write_tensors(reader, tensors, dtype, fd);
    detail::fsync_fd(fd);
    fd.close();
    detail::rename_path(tmp, out);
  } catch (...) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    throw;
  }
}

}  // namespace

void export_safetensors(const CheckpointReader& reader, const fs::path& out, DType dtype) {
  write_file(reader, exported_tensors(reader), out, dtype);
  detail::fsync_dir(out.has_parent_path() ? out.parent_path() : fs::path("."));
}

std::vector<fs::path> export_safetensors_shards(const CheckpointReader& reader, const fs::path& dir, DType dtype,
                                                std::uint64_t max_shard_bytes) {
  const std::vector<Tensor> tensors = exported_tensors(reader);
  // Shards in the manifest's order, each closed before it would pass the limit (a larger tensor alone).
  std::vector<std::vector<Tensor>> shards(1);
  std::uint64_t bytes = 0;
  std::uint64_t total = 0;
  for (const Tensor& t : tensors) {
    const std::uint64_t b = t.numel * size_of(dtype);
    if (!shards.back().empty() && bytes + b > max_shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(t);
    bytes += b;
    total += b;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw CheckpointError(fmt::format("{}: cannot create the directory: {}", dir.string(), ec.message()));
  std::vector<fs::path> files;
  if (shards.size() == 1) {
    files.push_back(dir / "model.safetensors");
    write_file(reader, shards[0], files.back(), dtype);
  } else {
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < shards.size(); ++i) {
      const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, shards.size());
      files.push_back(dir / name);
      write_file(reader, shards[i], files.back(), dtype);
      for (const Tensor& t : shards[i]) weight_map[t.param->name] = name;
    }
    const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    detail::write_file_atomic(dir / "model.safetensors.index.json", dir / "model.safetensors.index.json.tmp",
                              index.dump(2) + "\n", false);
    files.push_back(dir / "model.safetensors.index.json");
  }
  detail::fsync_dir(dir);
  return files;
}

}  // namespace zero3::ckpt
