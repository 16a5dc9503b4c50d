// Reading safetensors files as untrusted input (zero3/ckpt/safetensors.hpp). The header is checked before
// it is parsed (its nesting depth, so a hostile file cannot exhaust the parser's stack) and after (every
// entry's fields, sizes and offsets); data is read by element range with pread, in bounded chunks.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "zero3/ckpt/safetensors.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"

namespace zero3::ckpt {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr int kMaxHeaderDepth = 16;  // a valid header nests 3 deep (header, entry, shape)
constexpr std::size_t kReadChunkBytes = std::size_t{1} << 20;
constexpr std::uint64_t kMaxIndexBytes = 64ull << 20;

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw CheckpointError(fmt::format("{}: {}", file, what));
}

// The deepest nesting of arrays and objects in JSON text, strings skipped; stops counting past the limit.
int nesting_depth(std::string_view text) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > kMaxHeaderDepth) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

// Parses JSON text, refusing duplicate keys in any object (nlohmann would keep the last silently).
Json parse_strict(std::string_view text, const std::string& file, std::string_view what) {
  if (nesting_depth(text) > kMaxHeaderDepth)
    fail(file, fmt::format("{} nests deeper than {} levels", what, kMaxHeaderDepth));
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  const Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    const auto level = static_cast<std::size_t>(depth);
    if (event == Json::parse_event_t::object_start) {
      if (keys.size() <= level) keys.resize(level + 1);
      keys[level].clear();
    } else if (event == Json::parse_event_t::key && level >= 1 && level - 1 < keys.size()) {
      if (!keys[level - 1].insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), check);
  } catch (const Json::exception& e) {
    fail(file, fmt::format("{} is not valid JSON: {}", what, e.what()));
  }
  if (!duplicate.empty()) fail(file, fmt::format("{} names \"{}\" twice", what, duplicate));
  return j;
}

SafetensorsDType parse_dtype(const Json& v, const std::string& file, const std::string& tensor) {
  if (!v.is_string()) fail(file, fmt::format("tensor \"{}\": dtype is {}, not a string", tensor, v.dump()));
  const std::string s = v.get<std::string>();
  if (s == "F32") return SafetensorsDType::f32;
  if (s == "BF16") return SafetensorsDType::bf16;
  if (s == "F16") return SafetensorsDType::f16;
  fail(file, fmt::format("tensor \"{}\": dtype \"{}\" is not supported (F32, BF16 or F16)", tensor, s));
}

SafetensorsTensor parse_entry(const std::string& name, const Json& entry, std::uint64_t data_bytes,
                              const std::string& file) {
  if (!entry.is_object()) fail(file, fmt::format("tensor \"{}\": its entry is {}, not an object", name, entry.dump()));
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) fail(file, fmt::format("tensor \"{}\": no \"{}\"", name, key));
  }
  SafetensorsTensor t;
  t.name = name;
  t.dtype = parse_dtype(entry["dtype"], file, name);
  const Json& shape = entry["shape"];
  if (!shape.is_array()) fail(file, fmt::format("tensor \"{}\": shape is {}, not an array", name, shape.dump()));
  std::uint64_t numel = 1;
  for (const Json& extent : shape) {
    if (!extent.is_number_unsigned()) {
      fail(file, fmt::format("tensor \"{}\": shape {} holds {}, not a size", name, shape.dump(), extent.dump()));
    }
    const auto e = extent.get<std::uint64_t>();
    if (e > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) ||
        (e != 0 && numel > data_bytes / e)) {
      fail(file,
           fmt::format("tensor \"{}\": shape {} holds more elements than the file has bytes", name, shape.dump()));
    }
    numel *= e;
    t.shape.push_back(static_cast<std::int64_t>(e));
  }
  const Json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    fail(file, fmt::format("tensor \"{}\": data_offsets {} is not [begin, end]", name, offsets.dump()));
  }
  t.begin = offsets[0].get<std::uint64_t>();
  t.end = offsets[1].get<std::uint64_t>();
  if (t.begin > t.end || t.end > data_bytes) {
    fail(file, fmt::format("tensor \"{}\": data_offsets [{}, {}] lie outside the {} data bytes", name, t.begin, t.end,
                           data_bytes));
  }
  const std::uint64_t expected = numel * element_bytes(t.dtype);
  if (t.end - t.begin != expected) {
    fail(file, fmt::format("tensor \"{}\": {} x shape {} is {} bytes, but data_offsets span {}", name,
                           safetensors_dtype_name(t.dtype), shape.dump(), expected, t.end - t.begin));
  }
  return t;
}

}  // namespace

std::size_t element_bytes(SafetensorsDType dtype) {
  return dtype == SafetensorsDType::f32 ? 4 : 2;
}

std::string_view safetensors_dtype_name(SafetensorsDType dtype) {
  switch (dtype) {
    case SafetensorsDType::f32:
      return "F32";
    case SafetensorsDType::bf16:
      return "BF16";
    case SafetensorsDType::f16:
      return "F16";
  }
  return "?";
}

std::uint64_t SafetensorsTensor::numel() const {
  std::uint64_t n = 1;
  for (const std::int64_t e : shape) n *= static_cast<std::uint64_t>(e);
  return n;
}

SafetensorsHeader parse_safetensors_header(std::string_view header, std::uint64_t data_bytes, const std::string& file) {
  const Json j = parse_strict(header, file, "the header");
  if (!j.is_object())
    fail(file, fmt::format("the header is {}, not a JSON object", j.is_array() ? "an array" : "a value"));
  SafetensorsHeader out;
  for (const auto& item : j.items()) {
    if (item.key() == "__metadata__") {
      if (!item.value().is_object()) fail(file, "__metadata__ is not an object");
      for (const auto& m : item.value().items()) {
        if (!m.value().is_string()) fail(file, fmt::format("__metadata__ \"{}\" is not a string", m.key()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    out.tensors.push_back(parse_entry(item.key(), item.value(), data_bytes, file));
  }
  // Overlaps: sorted by start, each tensor must end before the next non-empty one starts.
  std::vector<const SafetensorsTensor*> by_offset;
  for (const SafetensorsTensor& t : out.tensors) {
    if (t.end > t.begin) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsTensor* a, const SafetensorsTensor* b) { return a->begin < b->begin; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      fail(file,
           fmt::format("tensors \"{}\" and \"{}\" overlap in the data", by_offset[i - 1]->name, by_offset[i]->name));
    }
  }
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const SafetensorsTensor& a, const SafetensorsTensor& b) { return a.name < b.name; });
  return out;
}

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
  const std::string file = path.string();
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) fail(file, fmt::format("cannot open: {}", std::strerror(errno)));
  const off_t size = ::lseek(f->fd_, 0, SEEK_END);
  if (size < 0) fail(file, fmt::format("cannot size: {}", std::strerror(errno)));
  const auto file_bytes = static_cast<std::uint64_t>(size);
  std::array<unsigned char, 8> length_bytes{};
  if (file_bytes < 8 || ::pread(f->fd_, length_bytes.data(), 8, 0) != 8) {
    fail(file, fmt::format("{} bytes: too short for the 8-byte header length (not a safetensors file)", file_bytes));
  }
  std::uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length_bytes[static_cast<std::size_t>(i)];
  if (header_bytes > file_bytes - 8 || header_bytes > kMaxSafetensorsHeaderBytes) {
    fail(file, fmt::format("the header length {} exceeds the {} bytes after it{}", header_bytes, file_bytes - 8,
                           header_bytes > kMaxSafetensorsHeaderBytes ? " (or the 100 MB limit)" : ""));
  }
  std::string header(header_bytes, '\0');
  if (header_bytes > 0 && ::pread(f->fd_, header.data(), header_bytes, 8) != static_cast<ssize_t>(header_bytes)) {
    fail(file, fmt::format("cannot read the {}-byte header: {}", header_bytes, std::strerror(errno)));
  }
  f->data_offset_ = 8 + header_bytes;
  f->header_ = parse_safetensors_header(header, file_bytes - f->data_offset_, file);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  const auto it = std::lower_bound(header_.tensors.begin(), header_.tensors.end(), name,
                                   [](const SafetensorsTensor& t, std::string_view n) { return t.name < n; });
  return it != header_.tensors.end() && it->name == name ? &*it : nullptr;
}

void SafetensorsFile::read(const SafetensorsTensor& t, std::uint64_t first, std::span<float> out) const {
  if (first > t.numel() || out.size() > t.numel() - first) {
    throw UsageError(fmt::format("{}: tensor \"{}\": elements [{}, {}) outside its {}", path_.string(), t.name, first,
                                 first + out.size(), t.numel()));
  }
  const std::size_t width = element_bytes(t.dtype);
  std::vector<std::byte> chunk(std::min(kReadChunkBytes, out.size() * width));
  for (std::size_t done = 0; done < out.size();) {
    const std::size_t n = std::min(out.size() - done, chunk.size() / width);
    const std::uint64_t offset = data_offset_ + t.begin + (first + done) * width;
    std::size_t got = 0;
    while (got < n * width) {
      const ssize_t r = ::pread(fd_, chunk.data() + got, n * width - got, static_cast<off_t>(offset + got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        fail(path_.string(), fmt::format("tensor \"{}\": reading failed{}", t.name,
                                         r == 0 ? ": the file ended (truncated since it was opened?)"
                                                : ": " + std::string(std::strerror(errno))));
      }
      got += static_cast<std::size_t>(r);
    }
    for (std::size_t i = 0; i < n; ++i) {
      const std::byte* p = chunk.data() + i * width;
      if (t.dtype == SafetensorsDType::f32) {
        std::memcpy(&out[done + i], p, 4);
      } else {
        std::uint16_t bits = 0;
        std::memcpy(&bits, p, 2);
        out[done + i] = t.dtype == SafetensorsDType::bf16 ? bf16_to_float(bf16_t{bits}) : fp16_to_float(fp16_t{bits});
      }
    }
    done += n;
  }
}

SafetensorsCheckpoint SafetensorsCheckpoint::open(const fs::path& path) {
  SafetensorsCheckpoint ckpt;
  ckpt.path_ = path;
  std::vector<std::pair<std::string, fs::path>> expected;  // (tensor, file) from an index
  if (fs::is_directory(path)) {
    const fs::path index = path / "model.safetensors.index.json";
    if (fs::exists(index)) {
      std::error_code ec;
      const auto bytes = fs::file_size(index, ec);
      if (ec || bytes > kMaxIndexBytes) fail(index.string(), "cannot read the index (or larger than 64 MiB)");
      std::ifstream in(index);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const Json j = parse_strict(text, index.string(), "the index");
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
        fail(index.string(), "no \"weight_map\" object");
      }
      std::map<std::string, std::shared_ptr<SafetensorsFile>> opened;
      for (const auto& item : j["weight_map"].items()) {
        if (!item.value().is_string())
          fail(index.string(), fmt::format("weight_map \"{}\" is not a file name", item.key()));
        const std::string name = item.value().get<std::string>();
        if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
          fail(index.string(),
               fmt::format("weight_map \"{}\": \"{}\" is not a file in the directory", item.key(), name));
        }
        if (!opened.contains(name)) {
          opened[name] = SafetensorsFile::open(path / name);
          ckpt.files_.push_back(opened[name]);
        }
        expected.emplace_back(item.key(), path / name);
      }
    } else if (fs::exists(path / "model.safetensors")) {
      ckpt.files_.push_back(SafetensorsFile::open(path / "model.safetensors"));
    } else {
      fail(path.string(), "neither model.safetensors.index.json nor model.safetensors in this directory");
    }
  } else {
    ckpt.files_.push_back(SafetensorsFile::open(path));
  }
  ckpt.source_ = expected.empty() ? ckpt.files_.front()->path() : path / "model.safetensors.index.json";
  for (const auto& f : ckpt.files_) {
    for (const SafetensorsTensor& t : f->header().tensors) {
      if (!ckpt.index_.emplace(t.name, std::pair{&t, f.get()}).second) {
        fail(f->path().string(), fmt::format("tensor \"{}\" is also in {}", t.name, ckpt.file_of(t.name).string()));
      }
    }
  }
  for (const auto& [tensor, file] : expected) {
    const auto it = ckpt.index_.find(tensor);
    if (it == ckpt.index_.end() || it->second.second->path() != file) {
      fail(file.string(), fmt::format("the index puts tensor \"{}\" in this file, which does not hold it", tensor));
    }
  }
  if (!expected.empty() && expected.size() != ckpt.index_.size()) {
    fail((path / "model.safetensors.index.json").string(),
         fmt::format("its weight_map names {} tensors, the files hold {}", expected.size(), ckpt.index_.size()));
  }
  return ckpt;
}

const SafetensorsTensor& SafetensorsCheckpoint::tensor(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail(source_.string(), fmt::format("no tensor \"{}\"", name));
  return *it->second.first;
}

bool SafetensorsCheckpoint::contains(std::string_view name) const {
  return index_.find(name) != index_.end();
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : index_) out.push_back(name);
  return out;
}

const fs::path& SafetensorsCheckpoint::file_of(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail(path_.string(), fmt::format("no tensor \"{}\"", name));
  return it->second.second->path();
}

void SafetensorsCheckpoint::read(std::string_view name, std::uint64_t first, std::span<float> out) const {
  const auto it = index_.find(name);
  if (it == index_.end()) fail(path_.string(), fmt::format("no tensor \"{}\"", name));
  it->second.second->read(*it->second.first, first, out);
}

std::uint64_t SafetensorsCheckpoint::data_bytes() const {
  std::uint64_t total = 0;
  for (const auto& [name, entry] : index_) total += entry.first->end - entry.first->begin;
  return total;
}

}  // namespace zero3::ckpt
