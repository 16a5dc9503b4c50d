// The safetensors reader (zero3/ckpt/safetensors.hpp) over files laid out byte by byte in this test from
// the format's description (8-byte little-endian header length, JSON header, data): F32, BF16 and F16
// tensors read back exactly, element ranges, a sharded checkpoint with model.safetensors.index.json, and
// each malformed file rejected with a CheckpointError that names the file and the tensor at fault.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "zero3/ckpt/safetensors.hpp"
#include "zero3/core/error.hpp"

namespace fs = std::filesystem;
using zero3::ckpt::SafetensorsCheckpoint;
using zero3::ckpt::SafetensorsFile;

namespace {

struct Entry {
  std::string name;
  std::string dtype;
  std::string shape;  // JSON text, e.g. "[2,3]"
  std::string data;   // raw bytes
};

void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::string f32_bytes(const std::vector<float>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

std::string u16_bytes(const std::vector<std::uint16_t>& v) {
  std::string s(v.size() * 2, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// A file from entries laid out back to back; `header_override` replaces the computed header text.
std::string file_bytes(const std::vector<Entry>& entries, const std::string& header_override = "") {
  std::string header = "{";
  std::string data;
  for (const Entry& e : entries) {
    if (header.size() > 1) header += ",";
    header += "\"" + e.name + "\":{\"dtype\":\"" + e.dtype + "\",\"shape\":" + e.shape + ",\"data_offsets\":[" +
              std::to_string(data.size()) + "," + std::to_string(data.size() + e.data.size()) + "]}";
    data += e.data;
  }
  header += ",\"__metadata__\":{\"format\":\"pt\"}}";
  if (!header_override.empty()) header = header_override;
  std::string out;
  put_u64(out, header.size());
  return out + header + data;
}

class Scratch {
 public:
  Scratch() : dir_(fs::temp_directory_path() / ("zero3_st_" + std::to_string(::getpid()))) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  ~Scratch() { fs::remove_all(dir_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  fs::path write(const std::string& name, const std::string& bytes) const {
    std::ofstream(dir_ / name, std::ios::binary) << bytes;
    return dir_ / name;
  }
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

std::string error_of(const fs::path& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const zero3::CheckpointError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("safetensors reader: F32, BF16 and F16 tensors read back, whole and by range", "[ckpt][safetensors]") {
  Scratch s;
  // bf16 0x3f80 = 1, 0xc040 = -3; f16 0x3c00 = 1, 0xc200 = -3, 0x3555 ~ 0.33325
  const fs::path path =
      s.write("model.safetensors", file_bytes({{"w", "F32", "[2,3]", f32_bytes({1, 2, 3, 4, 5, 6})},
                                               {"b", "BF16", "[2]", u16_bytes({0x3f80, 0xc040})},
                                               {"h", "F16", "[3]", u16_bytes({0x3c00, 0xc200, 0x3555})},
                                               {"empty", "F32", "[0,4]", ""}}));
  const auto file = SafetensorsFile::open(path);
  REQUIRE(file->header().tensors.size() == 4);
  REQUIRE(file->header().metadata.at("format") == "pt");
  const auto* w = file->find("w");
  REQUIRE(w != nullptr);
  REQUIRE(w->shape == std::vector<std::int64_t>{2, 3});
  std::vector<float> out(4);
  file->read(*w, 2, out);
  REQUIRE(out == std::vector<float>{3, 4, 5, 6});
  std::vector<float> two(2);
  file->read(*file->find("b"), 0, two);
  REQUIRE(two == std::vector<float>{1, -3});
  std::vector<float> three(3);
  file->read(*file->find("h"), 0, three);
  REQUIRE(three[0] == 1.0f);
  REQUIRE(three[1] == -3.0f);
  REQUIRE(three[2] == Approx(0.33325).epsilon(1e-4));
  REQUIRE_THROWS_AS(file->read(*w, 5, out), zero3::UsageError);  // past the tensor's end
  REQUIRE(file->find("missing") == nullptr);
}

TEST_CASE("safetensors reader: a sharded checkpoint through its index", "[ckpt][safetensors]") {
  Scratch s;
  s.write("model-00001-of-00002.safetensors", file_bytes({{"a", "F32", "[2]", f32_bytes({1, 2})}}));
  s.write("model-00002-of-00002.safetensors", file_bytes({{"b", "BF16", "[1]", u16_bytes({0x4000})}}));
  s.write("model.safetensors.index.json",
          R"({"metadata": {"total_size": 10}, "weight_map": {"a": "model-00001-of-00002.safetensors",
              "b": "model-00002-of-00002.safetensors"}})");
  const auto ckpt = SafetensorsCheckpoint::open(s.dir());
  REQUIRE(ckpt.names() == std::vector<std::string>{"a", "b"});
  REQUIRE(ckpt.data_bytes() == 10);
  std::vector<float> one(1);
  ckpt.read("b", 0, one);
  REQUIRE(one[0] == 2.0f);
  REQUIRE(ckpt.file_of("a").filename() == "model-00001-of-00002.safetensors");
  REQUIRE_THROWS_WITH(ckpt.tensor("c"), Catch::Contains("model.safetensors.index.json: no tensor \"c\""));

  s.write("model.safetensors.index.json",
          R"({"weight_map": {"a": "model-00002-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}})");
  REQUIRE_THROWS_WITH(SafetensorsCheckpoint::open(s.dir()),
                      Catch::Contains("the index puts tensor \"a\" in this file, which does not hold it"));
  s.write("model.safetensors.index.json", R"({"weight_map": {"a": "../elsewhere.safetensors"}})");
  REQUIRE_THROWS_WITH(SafetensorsCheckpoint::open(s.dir()), Catch::Contains("is not a file in the directory"));
}

TEST_CASE("safetensors reader: malformed files are named errors, nothing is allocated on a claim",
          "[ckpt][safetensors]") {
  Scratch s;
  const std::string good = file_bytes({{"w", "F32", "[2]", f32_bytes({1, 2})}});

  std::string huge_length = good;
  for (int i = 0; i < 8; ++i) huge_length[static_cast<std::size_t>(i)] = '\xff';  // 2^64 - 1 header bytes
  const fs::path p1 = s.write("length.safetensors", huge_length);
  REQUIRE_THAT(error_of(p1), Catch::Contains(p1.string()) && Catch::Contains("exceeds the"));

  const fs::path p2 = s.write("short.safetensors", "abc");
  REQUIRE_THAT(error_of(p2), Catch::Contains("too short"));

  const fs::path p3 =
      s.write("outside.safetensors",
              file_bytes({}, R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,800]}})") + std::string(8, '\0'));
  REQUIRE_THAT(error_of(p3), Catch::Contains("tensor \"w\"") && Catch::Contains("outside the 8 data bytes"));

  const fs::path p4 = s.write("count.safetensors", file_bytes({{"w", "F32", "[3]", f32_bytes({1, 2})}}));
  REQUIRE_THAT(error_of(p4),
               Catch::Contains("tensor \"w\"") && Catch::Contains("is 12 bytes, but data_offsets span 8"));

  const fs::path p5 = s.write(
      "overlap.safetensors",
      file_bytes(
          {},
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})") +
          std::string(12, '\0'));
  REQUIRE_THAT(error_of(p5), Catch::Contains("tensors \"a\" and \"b\" overlap"));

  const fs::path p6 = s.write("dtype.safetensors", file_bytes({{"w", "F64", "[1]", std::string(8, '\0')}}));
  REQUIRE_THAT(error_of(p6), Catch::Contains("tensor \"w\": dtype \"F64\" is not supported"));

  const fs::path p7 = s.write("shape.safetensors", file_bytes({{"w", "F32", "[-1]", ""}}));
  REQUIRE_THAT(error_of(p7), Catch::Contains("tensor \"w\": shape [-1]"));

  // A shape whose element count overflows 64 bits and would pass a product check modulo 2^64.
  const fs::path p8 = s.write("overflow.safetensors", file_bytes({{"w", "F32", "[4294967296,4294967296]", ""}}));
  REQUIRE_THAT(error_of(p8), Catch::Contains("more elements than the file has bytes"));

  const fs::path p9 = s.write("json.safetensors", file_bytes({}, R"({"w": {"dtype": "F32", )"));
  REQUIRE_THAT(error_of(p9), Catch::Contains("not valid JSON"));

  const fs::path p10 = s.write("deep.safetensors", file_bytes({}, std::string(5000, '[') + std::string(5000, ']')));
  REQUIRE_THAT(error_of(p10), Catch::Contains("nests deeper"));

  const fs::path p11 = s.write(
      "dup.safetensors",
      file_bytes(
          {},
          R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})"));
  REQUIRE_THAT(error_of(p11), Catch::Contains("names \"w\" twice"));

  // A file truncated after it was opened: the read names the tensor.
  const fs::path p13 = s.write("later.safetensors", good);
  const auto file = SafetensorsFile::open(p13);
  fs::resize_file(p13, fs::file_size(p13) - 4);
  std::vector<float> out(2);
  REQUIRE_THROWS_WITH(file->read(*file->find("w"), 0, out), Catch::Contains("tensor \"w\": reading failed"));
}
