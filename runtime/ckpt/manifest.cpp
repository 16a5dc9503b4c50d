// The manifest's JSON form (to_json / *_from_json, every field checked and named when wrong), the paths
// under a checkpoint root, and tag validation.
#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <string>
#include <utility>

#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/json_fields.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/json_integer.hpp"

namespace zero3::ckpt {
namespace {

using nlohmann::json;

// Only the manifest's own spellings (dtype_name()); parse_dtype's DeepSpeed aliases are for configs.
std::optional<DType> manifest_dtype(std::string_view name) {
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    if (name == dtype_name(t)) return t;
  }
  return std::nullopt;
}

// 64-bit hashes are strings of 16 hex digits: JSON numbers are doubles to most readers.
std::string hex64(std::uint64_t v) {
  return fmt::format("{:016x}", v);
}

using Fields = JsonFields;

// Only the manifest's own spellings (dtype_name()).
DType field_dtype(const Fields& f, std::string_view key) {
  const std::string s = f.string(key);
  if (auto t = manifest_dtype(s)) return *t;
  f.fail(f.sub(key), fmt::format("unknown dtype \"{}\" (fp32, bf16 or fp16)", s));
}

// 16 hex digits (hex64).
std::uint64_t field_hash(const Fields& f, std::string_view key) {
  const std::string s = f.string(key);
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (s.size() != 16 || ec != std::errc() || end != s.data() + s.size()) {
    f.fail(f.sub(key), fmt::format("expected 16 hex digits, got \"{}\"", s));
  }
  return v;
}

json chunk_to_json(const ChunkEntry& c) {
  return json{{"param", c.param}, {"kind", c.kind},     {"dtype", dtype_name(c.dtype)}, {"first", c.first},
              {"count", c.count}, {"offset", c.offset}, {"xxh64", hex64(c.xxh64)}};
}

ChunkEntry chunk_from_json(const json& j, const std::string& path, const std::string& source) {
  const Fields f(j, path, source);
  ChunkEntry c;
  c.param = f.string("param");
  c.kind = f.string("kind");
  c.dtype = field_dtype(f, "dtype");
  c.first = f.u64("first");
  c.count = f.u64("count");
  c.offset = f.u64("offset");
  c.xxh64 = field_hash(f, "xxh64");
  if (c.param.empty()) f.fail(f.sub("param"), "empty");
  if (c.kind.empty()) f.fail(f.sub("kind"), "empty");
  return c;
}

FileSummary file_from_json(const json& j, const std::string& path, const std::string& source) {
  const Fields f(j, path, source);
  FileSummary s;
  s.name = f.string("name");
  s.rank = f.int32("rank", 0);
  s.bytes = f.u64("bytes");
  s.xxh64 = field_hash(f, "xxh64");
  // A name is a plain file in the checkpoint directory, never a path out of it.
  if (s.name.empty() || s.name == "." || s.name == ".." || s.name.find('/') != std::string::npos ||
      s.name.find('\0') != std::string::npos) {
    f.fail(f.sub("name"), fmt::format("\"{}\" is not a file name", s.name));
  }
  const json& chunks = f.array("chunks");
  s.chunks.reserve(chunks.size());
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    s.chunks.push_back(chunk_from_json(chunks[i], fmt::format("{}[{}]", f.sub("chunks"), i), source));
    const ChunkEntry& c = s.chunks.back();
    // Readers hold one chunk in memory at a time: a larger one (or a count whose byte size overflows) is
    // not of this format.
    if (c.count > kChunkBytes / size_of(c.dtype)) {
      f.fail(fmt::format("{}[{}]", f.sub("chunks"), i),
             fmt::format("{} elements of {} are more than a chunk holds ({} bytes)", c.count, dtype_name(c.dtype),
                         kChunkBytes));
    }
    const std::uint64_t size = c.count * size_of(c.dtype);
    if (c.offset > s.bytes || size > s.bytes - c.offset) {
      f.fail(fmt::format("{}[{}]", f.sub("chunks"), i),
             fmt::format("{} bytes at offset {} lie past the end of the file ({} bytes)", size, c.offset, s.bytes));
    }
  }
  return s;
}

ParamInfo param_from_json(const json& j, const std::string& path, const std::string& source) {
  const Fields f(j, path, source);
  ParamInfo p;
  p.name = f.string("name");
  p.unit = f.string("unit");
  p.dtype = field_dtype(f, "dtype");
  p.trainable = f.boolean("trainable");
  if (p.name.empty()) f.fail(f.sub("name"), "empty");
  const json& shape = f.array("shape");
  for (std::size_t i = 0; i < shape.size(); ++i) {
    const std::optional<std::int64_t> d = json_integer(shape[i]);
    if (!d || *d < 0) {
      f.fail(fmt::format("{}[{}]", f.sub("shape"), i), fmt::format("expected a size, got {}", shape[i].dump()));
    }
    p.shape.push_back(*d);
  }
  // numel() and every byte count derived from it stay in 64 bits.
  std::uint64_t numel = 1;
  for (std::int64_t d : p.shape) {
    const auto n = static_cast<std::uint64_t>(d);
    if (n != 0 && numel > std::numeric_limits<std::uint64_t>::max() / 8 / n) {
      f.fail(f.sub("shape"), fmt::format("{} elements or more: too many to address", numel));
    }
    numel *= n;
  }
  return p;
}

}  // namespace

std::uint64_t ParamInfo::numel() const {
  std::uint64_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

nlohmann::json to_json(const FileSummary& f) {
  json chunks = json::array();
  for (const ChunkEntry& c : f.chunks) chunks.push_back(chunk_to_json(c));
  return json{{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"xxh64", hex64(f.xxh64)}, {"chunks", chunks}};
}

FileSummary file_summary_from_json(const nlohmann::json& j) {
  return file_from_json(j, "", "file summary");
}

nlohmann::json to_json(const Manifest& m) {
  json params = json::array();
  for (const ParamInfo& p : m.params) {
    params.push_back(json{{"name", p.name},
                          {"unit", p.unit},
                          {"shape", p.shape},
                          {"dtype", dtype_name(p.dtype)},
                          {"trainable", p.trainable}});
  }
  json files = json::array();
  for (const FileSummary& f : m.files) files.push_back(to_json(f));
  return json{{"format", kFormat},
              {"version", kVersion},
              {"tag", m.tag},
              {"step", m.step},
              {"world_size", m.world_size},
              {"config", m.config},
              {"config_hash", m.config_hash},
              {"params", params},
              {"optimizer_storage", {{"master", dtype_name(m.master_dtype)}, {"state", dtype_name(m.state_dtype)}}},
              {"files", files},
              {"state", m.state}};
}

Manifest manifest_from_json(const nlohmann::json& j, const std::string& source) {
  // The format is checked before anything else, so any other JSON file reads as "not a checkpoint".
  if (!j.is_object()) throw CheckpointError(fmt::format("{}: not a zero3 checkpoint (not a JSON object)", source));
  auto format = j.find("format");
  if (format == j.end()) throw CheckpointError(fmt::format("{}: not a zero3 checkpoint (no \"format\")", source));
  if (!format->is_string() || format->get<std::string>() != kFormat) {
    throw CheckpointError(
        fmt::format("{}: not a zero3 checkpoint (format {}, expected \"{}\")", source, format->dump(), kFormat));
  }
  const Fields f(j, "", source);
  const std::int64_t version = f.i64("version");
  if (version != kVersion) {
    throw CheckpointError(fmt::format("{}: checkpoint format version {} is not supported (this build reads version {})",
                                      source, version, kVersion));
  }
  Manifest m;
  m.tag = f.string("tag");
  m.step = f.i64("step", 0);
  m.world_size = f.int32("world_size", 1);
  m.config = f.get("config");
  m.config_hash = f.string("config_hash");
  m.state = f.get("state");  // null from a writer given no state, else an object
  if (!m.state.is_null()) Fields(m.state, "state", source);
  if (j.contains("optimizer_storage")) {  // absent before 16-bit storage: fp32
    const Fields storage(f.get("optimizer_storage"), "optimizer_storage", source);
    m.master_dtype = field_dtype(storage, "master");
    m.state_dtype = field_dtype(storage, "state");
  }
  const json& params = f.array("params");
  m.params.reserve(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    m.params.push_back(param_from_json(params[i], fmt::format("params[{}]", i), source));
  }
  const json& files = f.array("files");
  m.files.reserve(files.size());
  for (std::size_t i = 0; i < files.size(); ++i) {
    m.files.push_back(file_from_json(files[i], fmt::format("files[{}]", i), source));
  }
  return m;
}

Manifest manifest_from_text(std::string_view text, const std::string& source) {
  // Copying and printing a JSON value recurse once per level: deeper nesting would overflow the stack.
  const json::parser_callback_t limit_depth = [&source](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= kMaxManifestDepth) {
      throw CheckpointError(
          fmt::format("{}: not a zero3 checkpoint (JSON nested deeper than {} levels)", source, kMaxManifestDepth));
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text, limit_depth);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past a double (1e999)
    throw CheckpointError(fmt::format("{}: not a zero3 checkpoint (invalid JSON: {})", source, e.what()));
  }
  return manifest_from_json(j, source);
}

std::filesystem::path checkpoint_dir(const std::filesystem::path& root, std::string_view tag) {
  check_tag(tag);
  return root / std::string(tag);
}

std::filesystem::path staging_dir(const std::filesystem::path& root, std::string_view tag) {
  check_tag(tag);
  return root / (".tmp." + std::string(tag));
}

void check_tag(std::string_view tag) {
  std::string_view problem;
  if (tag.empty()) {
    problem = "empty";
  } else if (tag == "latest") {
    problem = "\"latest\" names the pointer file";
  } else if (tag.front() == '.') {
    problem = "starts with '.' (hidden names are the library's own)";
  } else if (tag.find('/') != std::string_view::npos) {
    problem = "holds '/'";
  } else if (tag.find('\0') != std::string_view::npos) {
    problem = "holds a NUL";
  } else {
    return;
  }
  std::string shown;
  for (char c : tag) shown += c == '\0' ? std::string("\\0") : std::string(1, c);
  throw CheckpointError(fmt::format("invalid checkpoint tag \"{}\": {}", shown, problem));
}

}  // namespace zero3::ckpt
