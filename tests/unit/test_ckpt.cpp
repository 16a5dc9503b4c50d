// The checkpoint format: rank files written as W ranks would, committed, and read back bitwise over
// arbitrary ranges (across chunk and file boundaries, resharded to other world sizes, converted to other
// dtypes); the manifest's JSON and its field errors; locating a checkpoint (dir, tag, latest) with each
// error's exact text; the commit protocol (replacing a tag, refusing to replace what latest names, a
// crashed save); corruption (truncation, every bit flip caught, a missing file) and writer failures
// (EFBIG via RLIMIT_FSIZE, ENOSPC on a small tmpfs when mount works), each naming the file and leaving
// the previous checkpoint intact; the safetensors export parsed back byte for byte, and the Hugging Face
// export's config.json.
#include <fmt/format.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "scratch_dir.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/hf_export.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using Catch::Matchers::Equals;
using Catch::Matchers::StartsWith;
using zero3::CheckpointError;
using zero3::DType;
namespace ckpt = zero3::ckpt;

namespace {

using zero3::test::ScratchDir;

std::uint64_t fresh_seed() {
  static std::random_device rd;
  return (std::uint64_t{rd()} << 32) | rd();
}

// One param with its full tensors: "master" (fp32, trainable only) and "param" (in `dtype`).
struct TestParam {
  std::string name;
  std::vector<std::int64_t> shape;
  DType dtype = DType::bf16;
  bool trainable = true;
  std::vector<float> master;
  std::vector<std::byte> param;

  std::uint64_t numel() const {
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    return n;
  }
  DType dtype_of(std::string_view kind) const { return kind == "master" ? DType::f32 : dtype; }
  std::span<const std::byte> bytes(std::string_view kind) const {
    return kind == "master" ? std::as_bytes(std::span(master)) : std::span<const std::byte>(param);
  }
  ckpt::ParamInfo info() const { return {name, "unit0", shape, dtype, trainable}; }
};

TestParam make_param(std::string name, std::vector<std::int64_t> shape, DType dtype, bool trainable,
                     std::uint64_t seed) {
  TestParam p{std::move(name), std::move(shape), dtype, trainable, {}, {}};
  const zero3::CounterRng rng(seed, zero3::hash_name(p.name));
  const std::size_t n = p.numel();
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i) values[i] = static_cast<float>(rng.normal(i) * 0.5);
  p.param.resize(n * zero3::size_of(dtype));
  for (std::size_t i = 0; i < n; ++i) zero3::store_from_float(p.param.data(), dtype, i, values[i]);
  if (trainable) p.master = std::move(values);
  return p;
}

// The model most cases use: a bf16 and an fp16 trainable param, a frozen one (only "param"), one whose
// per-rank slices span several chunks, and a zero-size one.
std::vector<TestParam> make_model(std::uint64_t seed) {
  std::vector<TestParam> m;
  m.push_back(make_param("layers.0.attn.qkv.weight", {48, 37}, DType::bf16, true, seed));
  m.push_back(make_param("layers.0.ln.bias", {37}, DType::f16, true, seed));
  m.push_back(make_param("embed.frozen", {13, 11}, DType::bf16, false, seed));
  m.push_back(make_param("big.weight", {3'500'001}, DType::bf16, true, seed));
  m.push_back(make_param("empty.weight", {0, 5}, DType::bf16, true, seed));
  return m;
}

// Writes `model` as `world_size` ranks would (rank r holds [n*r/W, n*(r+1)/W) of each param) and commits.
ckpt::Manifest save(const fs::path& root, const std::string& tag, std::int64_t step,
                    const std::vector<TestParam>& model, int world_size, bool do_commit = true) {
  ckpt::prepare_staging(root, tag);
  ckpt::Manifest m;
  m.tag = tag;
  m.step = step;
  m.world_size = world_size;
  m.config = {{"train_batch_size", 8}, {"zero_optimization", {{"stage", 3}}}};
  m.config_hash = "0123abcd";
  m.state = {{"loss_scale", 65536.0}, {"rng", {1, 2, 3}}};
  for (const auto& p : model) m.params.push_back(p.info());
  const fs::path staging = ckpt::staging_dir(root, tag);
  for (int r = 0; r < world_size; ++r) {
    ckpt::RankFileWriter w(staging, r);
    for (const auto& p : model) {
      const std::uint64_t n = p.numel();
      const std::uint64_t lo = n * static_cast<std::uint64_t>(r) / static_cast<std::uint64_t>(world_size);
      const std::uint64_t hi = n * static_cast<std::uint64_t>(r + 1) / static_cast<std::uint64_t>(world_size);
      for (std::string_view kind : {"master", "param"}) {
        if (kind == "master" && !p.trainable) continue;
        const std::size_t elem = zero3::size_of(p.dtype_of(kind));
        w.append(p.name, kind, p.dtype_of(kind), lo, hi - lo, p.bytes(kind).subspan(lo * elem, (hi - lo) * elem));
      }
    }
    m.files.push_back(w.finish());
  }
  if (do_commit) ckpt::commit(root, m);
  return m;
}

// The expected bytes of elements [first, first+count) of (p, kind) in `out`.
std::vector<std::byte> expected(const TestParam& p, std::string_view kind, std::uint64_t first, std::uint64_t count,
                                DType out) {
  const DType src = p.dtype_of(kind);
  const auto all = p.bytes(kind);
  std::vector<std::byte> e(count * zero3::size_of(out));
  if (e.empty()) return e;
  if (src == out) {
    std::memcpy(e.data(), all.data() + first * zero3::size_of(src), e.size());
  } else {
    for (std::uint64_t i = 0; i < count; ++i) {
      zero3::store_from_float(e.data(), out, i, zero3::load_as_float(all.data(), src, first + i));
    }
  }
  return e;
}

// Reads a range into a poisoned buffer (0xff: NaN in every dtype) and compares bit for bit.
void check_range(const ckpt::CheckpointReader& r, const TestParam& p, std::string_view kind, std::uint64_t first,
                 std::uint64_t count, DType out) {
  INFO(p.name << "/" << kind << " [" << first << ", " << first + count << ") as " << zero3::dtype_name(out));
  std::vector<std::byte> got(count * zero3::size_of(out), std::byte{0xff});
  r.read(p.name, kind, first, count, out, got);
  const auto want = expected(p, kind, first, count, out);
  const auto mismatch = std::mismatch(got.begin(), got.end(), want.begin());
  INFO("first differing byte " << (mismatch.first - got.begin()));
  REQUIRE(mismatch.first == got.end());
}

template <class Fn>
std::string checkpoint_error(Fn fn) {
  try {
    fn();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  FAIL("no CheckpointError thrown");
  return {};
}

void flip_bit(const fs::path& path, std::uint64_t byte, int bit) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(byte));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ (1 << bit));
  f.seekp(static_cast<std::streamoff>(byte));
  f.write(&c, 1);
  REQUIRE(f.good());
}

std::vector<std::byte> read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  REQUIRE(f.good());
  std::vector<char> chars((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  REQUIRE(f.good());
}

const TestParam& by_name(const std::vector<TestParam>& model, std::string_view name) {
  for (const auto& p : model) {
    if (p.name == name) return p;
  }
  FAIL("no param " << name);
  return model.front();
}

}  // namespace

TEST_CASE("ckpt: round trip, ranges across chunks and files, resharded reads, dtype conversion", "[ckpt]") {
  ScratchDir dir;
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const auto model = make_model(seed);
  const auto written = save(dir.path(), "global_step7", 7, model, 3);

  const ckpt::CheckpointReader r(dir.path());  // through ROOT/latest
  REQUIRE(r.dir() == dir / "global_step7");
  const ckpt::Manifest& m = r.manifest();
  REQUIRE(m.tag == "global_step7");
  REQUIRE(m.step == 7);
  REQUIRE(m.world_size == 3);
  REQUIRE(m.config == written.config);
  REQUIRE(m.config_hash == "0123abcd");
  REQUIRE(m.state == written.state);
  REQUIRE(m.params.size() == model.size());
  REQUIRE(m.files.size() == 3);
  for (int rank = 0; rank < 3; ++rank) {
    REQUIRE(m.files[rank].name == fmt::format("rank_{:05d}.bin", rank));
    REQUIRE(fs::file_size(r.dir() / m.files[rank].name) == m.files[rank].bytes);
  }
  // Chunks never exceed kChunkBytes; the big param's slices take two chunks each.
  std::size_t big_master_chunks = 0;
  for (const auto& f : m.files) {
    for (const auto& c : f.chunks) {
      REQUIRE(c.count * zero3::size_of(c.dtype) <= ckpt::kChunkBytes);
      if (c.param == "big.weight" && c.kind == "master") ++big_master_chunks;
    }
  }
  REQUIRE(big_master_chunks == 6);
  r.verify_all();

  REQUIRE(r.find_param("embed.frozen") != nullptr);
  REQUIRE_FALSE(r.find_param("embed.frozen")->trainable);
  REQUIRE(r.find_param("nope") == nullptr);
  REQUIRE(r.has("embed.frozen", "param"));
  REQUIRE_FALSE(r.has("embed.frozen", "master"));
  REQUIRE(r.has("empty.weight", "master"));  // an empty slice still records the kind
  REQUIRE(r.find_param("empty.weight")->numel() == 0);

  const std::vector<DType> dtypes = {DType::f32, DType::bf16, DType::f16};
  SECTION("whole tensors, in every dtype") {
    for (const auto& p : model) {
      for (std::string_view kind : {"master", "param"}) {
        if (!r.has(p.name, kind)) continue;
        for (DType out : dtypes) check_range(r, p, kind, 0, p.numel(), out);
      }
    }
  }
  SECTION("random ranges") {
    std::mt19937_64 gen(seed);
    for (const auto& p : model) {
      if (p.numel() == 0) continue;
      for (std::string_view kind : {"master", "param"}) {
        if (!r.has(p.name, kind)) continue;
        for (int i = 0; i < 40; ++i) {
          const std::uint64_t a = gen() % (p.numel() + 1);
          const std::uint64_t b = gen() % (p.numel() + 1);
          check_range(r, p, kind, std::min(a, b), std::max(a, b) - std::min(a, b), dtypes[gen() % 3]);
        }
      }
    }
  }
  SECTION("ranges straddling chunk and file boundaries") {
    const auto& big = by_name(model, "big.weight");
    const std::uint64_t n = big.numel();
    const std::uint64_t per_chunk = ckpt::kChunkBytes / 4;
    for (std::uint64_t slice_start : {std::uint64_t{0}, n / 3, 2 * n / 3}) {
      for (std::uint64_t at : {slice_start, slice_start + per_chunk}) {  // a file boundary, a chunk boundary
        for (DType out : dtypes) {
          if (at >= 3) check_range(r, big, "master", at - 3, 7, out);
          if (at >= 1) check_range(r, big, "master", at - 1, 1, out);
          check_range(r, big, "master", at, 1, out);
        }
      }
    }
    check_range(r, big, "master", 100, n - 200, DType::f32);  // all six chunks, both ends partial
    check_range(r, big, "param", n / 3 - 5, n / 3 + 10, DType::bf16);
  }
  SECTION("resharded: W' readers each read a contiguous shard, together the whole tensor") {
    for (int readers : {1, 2, 4, 5}) {
      for (const auto& p : model) {
        for (std::string_view kind : {"master", "param"}) {
          if (!r.has(p.name, kind)) continue;
          for (int q = 0; q < readers; ++q) {
            const std::uint64_t lo = p.numel() * static_cast<std::uint64_t>(q) / static_cast<std::uint64_t>(readers);
            const std::uint64_t hi =
                p.numel() * static_cast<std::uint64_t>(q + 1) / static_cast<std::uint64_t>(readers);
            check_range(r, p, kind, lo, hi - lo, p.dtype_of(kind));
          }
        }
      }
    }
  }
  SECTION("a copy of the reader reads the same") {
    const ckpt::CheckpointReader copy = r;  // NOLINT(performance-unnecessary-copy-initialization): the copy is the test
    check_range(copy, by_name(model, "layers.0.ln.bias"), "master", 3, 30, DType::f32);
  }
}

TEST_CASE("ckpt: read errors name the param, the kind and the range", "[ckpt]") {
  ScratchDir dir;
  const auto model = make_model(fresh_seed());
  save(dir.path(), "t", 1, model, 2);
  const ckpt::CheckpointReader r(dir.path(), "t");
  const std::string d = (dir / "t").string();
  std::vector<std::byte> out(std::size_t{64} * 4);
  const auto sub = [&](std::uint64_t count, DType t) { return std::span(out).first(count * zero3::size_of(t)); };

  REQUIRE_THROWS_WITH(r.read("nope", "param", 0, 1, DType::f32, sub(1, DType::f32)),
                      Equals(d + ": no param \"nope\" in the checkpoint"));
  REQUIRE_THROWS_WITH(
      r.read("embed.frozen", "master", 0, 1, DType::f32, sub(1, DType::f32)),
      Equals(d + ": the checkpoint holds no \"master\" of param \"embed.frozen\" (a frozen param: only \"param\")"));
  REQUIRE_THROWS_WITH(r.read("layers.0.ln.bias", "exp_avg", 0, 1, DType::f32, sub(1, DType::f32)),
                      Equals(d + ": the checkpoint holds no \"exp_avg\" of param \"layers.0.ln.bias\""));
  REQUIRE_THROWS_WITH(
      r.read("layers.0.ln.bias", "master", 30, 8, DType::f32, sub(8, DType::f32)),
      Equals(d + ": layers.0.ln.bias/master elements [30, 38) are out of range: the param has 37 elements"));
  // A buffer of the wrong size is the caller's bug, not the checkpoint's.
  REQUIRE_THROWS_AS(r.read("layers.0.ln.bias", "master", 0, 4, DType::f32, sub(3, DType::f32)), zero3::UsageError);
  // Zero elements: nothing to read, even where the kind is absent.
  r.read("empty.weight", "master", 0, 0, DType::f32, sub(0, DType::f32));
  r.read("embed.frozen", "exp_avg", 5, 0, DType::f32, sub(0, DType::f32));

  SECTION("a range the writers did not cover") {
    ScratchDir gap_dir;
    ckpt::prepare_staging(gap_dir.path(), "g");
    const auto& p = by_name(model, "layers.0.ln.bias");
    ckpt::Manifest m;
    m.tag = "g";
    m.params.push_back(p.info());
    ckpt::RankFileWriter w(ckpt::staging_dir(gap_dir.path(), "g"), 0);
    const auto bytes = p.bytes("master");
    w.append(p.name, "master", DType::f32, 0, 10, bytes.subspan(0, 40));
    w.append(p.name, "master", DType::f32, 20, 17, bytes.subspan(80, 68));
    m.files.push_back(w.finish());
    ckpt::commit(gap_dir.path(), m);
    const ckpt::CheckpointReader g(gap_dir.path());
    check_range(g, p, "master", 0, 10, DType::f32);
    check_range(g, p, "master", 22, 15, DType::bf16);
    REQUIRE_THROWS_WITH(g.read(p.name, "master", 5, 20, DType::f32, sub(20, DType::f32)),
                        Equals((gap_dir / "g").string() +
                               ": layers.0.ln.bias/master elements [5, 25) are not all in the checkpoint (no chunk "
                               "holds element 10)"));
    // `zero3 ckpt info` verifies with verify_all(): it refuses what a load or an export would refuse.
    REQUIRE_THROWS_WITH(
        g.verify_all(),
        Equals((gap_dir / "g").string() + ": no chunk holds the values of param \"layers.0.ln.bias\" (shape [37])"));
  }

  SECTION("verify_all refuses chunks that leave part of a param's shape uncovered") {
    ScratchDir gap_dir;
    ckpt::prepare_staging(gap_dir.path(), "g");
    const auto& p = by_name(model, "layers.0.ln.bias");
    ckpt::Manifest m;
    m.tag = "g";
    m.params.push_back(p.info());
    ckpt::RankFileWriter w(ckpt::staging_dir(gap_dir.path(), "g"), 0);
    w.append(p.name, "param", p.dtype, 0, 37, p.bytes("param"));
    const auto bytes = p.bytes("master");
    w.append(p.name, "master", DType::f32, 0, 10, bytes.subspan(0, 40));
    w.append(p.name, "master", DType::f32, 20, 17, bytes.subspan(80, 68));
    m.files.push_back(w.finish());
    ckpt::commit(gap_dir.path(), m);
    const ckpt::CheckpointReader g(gap_dir.path());
    REQUIRE_THROWS_WITH(g.verify_all(), Equals((gap_dir / "g").string() +
                                               ": the chunks of layers.0.ln.bias/master do not cover its shape [37] "
                                               "(37 elements): no chunk holds element 10"));
    // The same checkpoint whole verifies.
    ScratchDir whole_dir;
    ckpt::prepare_staging(whole_dir.path(), "w");
    m.tag = "w";
    m.files.clear();
    ckpt::RankFileWriter ww(ckpt::staging_dir(whole_dir.path(), "w"), 0);
    ww.append(p.name, "param", p.dtype, 0, 37, p.bytes("param"));
    ww.append(p.name, "master", DType::f32, 0, 20, bytes.subspan(0, 80));
    ww.append(p.name, "master", DType::f32, 10, 27, bytes.subspan(40, 108));
    m.files.push_back(ww.finish());
    ckpt::commit(whole_dir.path(), m);
    ckpt::CheckpointReader(whole_dir.path()).verify_all();
  }
}

TEST_CASE("ckpt: the manifest's JSON round-trips and names a bad field", "[ckpt]") {
  ScratchDir dir;
  const auto model = make_model(fresh_seed());
  const auto m = save(dir.path(), "t", 3, model, 2);
  const nlohmann::json j = ckpt::to_json(m);
  REQUIRE(j["format"] == "zero3-checkpoint");
  REQUIRE(j["version"] == 1);
  REQUIRE(j["params"][1]["dtype"] == "fp16");
  REQUIRE(j["params"][0]["dtype"] == "bf16");
  REQUIRE(j["files"][0]["chunks"][0]["dtype"] == "fp32");
  const std::string hash = j["files"][1]["xxh64"].get<std::string>();
  REQUIRE(hash.size() == 16);
  REQUIRE(hash == fmt::format("{:016x}", m.files[1].xxh64));

  const ckpt::Manifest back = ckpt::manifest_from_json(j, "src");
  REQUIRE(ckpt::to_json(back) == j);
  REQUIRE(back.files[1].chunks.size() == m.files[1].chunks.size());
  REQUIRE(back.files[1].chunks[2].xxh64 == m.files[1].chunks[2].xxh64);

  // On disk, written by commit().
  const auto on_disk = nlohmann::json::parse(std::ifstream(dir / "t" / "manifest.json"));
  REQUIRE(on_disk == j);

  const auto summary = ckpt::file_summary_from_json(ckpt::to_json(m.files[0]));
  REQUIRE(ckpt::to_json(summary) == ckpt::to_json(m.files[0]));

  auto bad = j;
  bad["files"][0]["chunks"][1]["xxh64"] = 5;
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: field files[0].chunks[1].xxh64: expected a string, got 5"));
  bad = j;
  bad["files"][0]["chunks"][1]["xxh64"] = "12345";
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: field files[0].chunks[1].xxh64: expected 16 hex digits, got \"12345\""));
  bad = j;
  bad["params"][2]["dtype"] = "float32";
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: field params[2].dtype: unknown dtype \"float32\" (fp32, bf16 or fp16)"));
  bad = j;
  bad["params"][0]["shape"][1] = -1;
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: field params[0].shape[1]: expected a size, got -1"));
  bad = j;
  bad["files"][1]["name"] = "../escape.bin";
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: field files[1].name: \"../escape.bin\" is not a file name"));
  bad = j;
  bad["files"][0]["bytes"] = 10;
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"), StartsWith("src: field files[0].chunks[0]: ") &&
                                                                Contains("lie past the end of the file (10 bytes)"));
  bad = j;
  bad.erase("step");
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"), Equals("src: field step: missing"));
  // Integers are read only where their type holds them: no truncation of 1.5, no wrap of 2^63.
  bad["step"] = 1.5;
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: field step: expected an integer (at least 0), got 1.5"));
  bad["step"] = std::uint64_t{1} << 63;
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: field step: expected an integer (at least 0), got 9223372036854775808"));
  bad["step"] = -1;
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"), Equals("src: field step: -1 is out of range (at least 0)"));
  bad = j;
  bad["world_size"] = std::int64_t{1} << 32;
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: field world_size: 4294967296 is out of range (1 .. 2147483647)"));
  bad = j;
  bad["state"] = 7;
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: field state: expected an object, got number"));  // null: no state
  bad = j;
  bad["version"] = 2;
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: checkpoint format version 2 is not supported (this build reads version 1)"));
  bad = j;
  bad["format"] = "pytorch";
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: not a zero3 checkpoint (format \"pytorch\", expected \"zero3-checkpoint\")"));
  bad = j;
  bad["optimizer_storage"]["state"] = "int8";
  REQUIRE_THROWS_WITH(ckpt::manifest_from_json(bad, "src"),
                      Equals("src: field optimizer_storage.state: unknown dtype \"int8\" (fp32, bf16 or fp16)"));

  // The optimizer's storage dtypes: recorded, and fp32 for a manifest written before the field existed.
  REQUIRE(j["optimizer_storage"] == nlohmann::json({{"master", "fp32"}, {"state", "fp32"}}));
  auto sixteen = m;
  sixteen.master_dtype = DType::bf16;
  sixteen.state_dtype = DType::bf16;
  const ckpt::Manifest sixteen_back = ckpt::manifest_from_json(ckpt::to_json(sixteen), "src");
  REQUIRE(sixteen_back.master_dtype == DType::bf16);
  REQUIRE(sixteen_back.state_dtype == DType::bf16);
  auto old_manifest = ckpt::to_json(sixteen);
  old_manifest.erase("optimizer_storage");
  const ckpt::Manifest old_back = ckpt::manifest_from_json(old_manifest, "src");
  REQUIRE(old_back.master_dtype == DType::f32);
  REQUIRE(old_back.state_dtype == DType::f32);

  auto no_bytes = ckpt::to_json(m.files[0]);
  no_bytes.erase("bytes");
  REQUIRE_THROWS_WITH(ckpt::file_summary_from_json(no_bytes), Equals("file summary: field bytes: missing"));
}

TEST_CASE("ckpt: tags and paths", "[ckpt]") {
  REQUIRE(ckpt::checkpoint_dir("/r", "global_step1") == fs::path("/r/global_step1"));
  REQUIRE(ckpt::staging_dir("/r", "global_step1") == fs::path("/r/.tmp.global_step1"));
  REQUIRE_THROWS_WITH(ckpt::check_tag(""), Equals("invalid checkpoint tag \"\": empty"));
  REQUIRE_THROWS_WITH(ckpt::check_tag("latest"),
                      Equals("invalid checkpoint tag \"latest\": \"latest\" names the pointer file"));
  REQUIRE_THROWS_WITH(ckpt::check_tag(".x"), StartsWith("invalid checkpoint tag \".x\": starts with '.'"));
  REQUIRE_THROWS_WITH(ckpt::check_tag("a/b"), Equals("invalid checkpoint tag \"a/b\": holds '/'"));
  REQUIRE_THROWS_WITH(ckpt::check_tag(std::string_view("a\0b", 3)),
                      Equals("invalid checkpoint tag \"a\\0b\": holds a NUL"));
  ckpt::check_tag("global_step100");
  ckpt::check_tag("run.3-final");
}

TEST_CASE("ckpt: locating a checkpoint: dir, tag, latest, and what is wrong when none is found", "[ckpt]") {
  ScratchDir dir;
  const fs::path& root = dir.path();
  const std::string R = root.string();
  const auto model = make_model(fresh_seed());

  REQUIRE(ckpt::read_latest(root) == std::nullopt);
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root),
                      Equals("no checkpoint at " + R + " (no manifest.json and no latest)"));
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root / "missing"),
                      Equals("no checkpoint at " + R + "/missing (no such directory)"));
  write_text(root / "file.txt", "hello");
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root / "file.txt"),
                      Equals("no checkpoint at " + R + "/file.txt (not a directory)"));

  save(root, "a", 1, model, 1);
  save(root, "b", 2, model, 2);
  REQUIRE(ckpt::read_latest(root) == "b");
  REQUIRE(ckpt::CheckpointReader(root).manifest().tag == "b");
  REQUIRE(ckpt::CheckpointReader(root, "a").manifest().tag == "a");
  REQUIRE(ckpt::CheckpointReader(root / "a").manifest().step == 1);
  REQUIRE(ckpt::CheckpointReader(root / "a", "a").manifest().step == 1);
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root / "a", "b"), Equals(R + "/a holds the checkpoint of tag a, not b"));
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root, "nope"), Equals("tag nope does not exist in " + R));
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root, "../x"), Equals("invalid checkpoint tag \"../x\": starts with '.' "
                                                                   "(hidden names are the library's own)"));

  write_text(root / "latest", "ghost\n");
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root),
                      Equals(R + "/latest names tag ghost, but " + R + "/ghost does not exist"));
  write_text(root / "latest", "\n");
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root), Equals(R + "/latest: empty (it should name a checkpoint tag)"));
  write_text(root / "latest", "a");  // no newline: still fine
  REQUIRE(ckpt::CheckpointReader(root).manifest().tag == "a");

  fs::create_directories(root / "c");  // a directory that is no checkpoint
  REQUIRE_THROWS_WITH(
      ckpt::CheckpointReader(root, "c"),
      Equals("no checkpoint at " + R + "/c (no manifest.json: not a checkpoint, or an unfinished save)"));
  write_text(root / "c" / "manifest.json", R"({"format": "safetensors", "version": 1})");
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root / "c"),
                      Equals(R + "/c/manifest.json: not a zero3 checkpoint (format \"safetensors\", expected "
                                 "\"zero3-checkpoint\")"));
  write_text(root / "c" / "manifest.json", "{\"format\": ");
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root / "c"),
                      StartsWith(R + "/c/manifest.json: not a zero3 checkpoint (invalid JSON: "));
}

TEST_CASE("ckpt: commit replaces a tag latest does not name, refuses the one it names", "[ckpt]") {
  ScratchDir dir;
  const fs::path& root = dir.path();
  const auto old_model = make_model(fresh_seed());
  const auto new_model = make_model(fresh_seed() + 1);
  save(root, "a", 1, old_model, 2);
  save(root, "b", 2, old_model, 2);
  REQUIRE(ckpt::read_latest(root) == "b");

  save(root, "a", 3, new_model, 3);  // latest names b: a may be replaced
  REQUIRE(ckpt::read_latest(root) == "a");
  {
    const ckpt::CheckpointReader r(root);
    REQUIRE(r.manifest().step == 3);
    REQUIRE(r.manifest().files.size() == 3);
    r.verify_all();
    check_range(r, by_name(new_model, "layers.0.attn.qkv.weight"), "master", 0, std::uint64_t{48} * 37, DType::f32);
  }
  // Nothing hidden is left behind: no staging directory, no retired copy.
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    REQUIRE((name == "a" || name == "b" || name == "latest"));
  }

  // latest names a: replacing it would leave latest naming a half-replaced checkpoint for a moment.
  REQUIRE_THROWS_WITH(save(root, "a", 4, old_model, 1),
                      Equals((root / "a").string() + ": cannot replace the checkpoint " + root.string() +
                             "/latest names; save under a new tag"));
  const ckpt::CheckpointReader r(root);
  REQUIRE(r.manifest().step == 3);
  r.verify_all();
  check_range(r, by_name(new_model, "big.weight"), "param", 10, 1000, DType::bf16);
}

TEST_CASE("ckpt: a crashed save leaves latest on the previous checkpoint; prepare_staging cleans up", "[ckpt]") {
  ScratchDir dir;
  const fs::path& root = dir.path();
  const auto model = make_model(fresh_seed());
  save(root, "a", 1, model, 2);

  // Every rank wrote its file, then the job died before commit().
  save(root, "b", 2, model, 2, /*do_commit=*/false);
  REQUIRE(fs::exists(ckpt::staging_dir(root, "b") / "rank_00001.bin"));
  REQUIRE(ckpt::read_latest(root) == "a");
  REQUIRE(ckpt::CheckpointReader(root).manifest().tag == "a");
  REQUIRE_THROWS_WITH(ckpt::CheckpointReader(root, "b"), Equals("tag b does not exist in " + root.string()));

  // A writer dropped mid-file (an exception, a crash in the caller) removes its partial file.
  {
    ckpt::RankFileWriter w(ckpt::staging_dir(root, "b"), 7);
    const float v[4] = {1, 2, 3, 4};
    w.append("x", "master", DType::f32, 0, 4, std::as_bytes(std::span(v)));
    REQUIRE(fs::exists(ckpt::staging_dir(root, "b") / "rank_00007.bin"));
  }
  REQUIRE_FALSE(fs::exists(ckpt::staging_dir(root, "b") / "rank_00007.bin"));

  // A crash between moving an old b aside and removing it leaves a retired copy; both are cleaned.
  fs::create_directories(root / ".old.b");
  ckpt::prepare_staging(root, "b");
  REQUIRE(fs::is_empty(ckpt::staging_dir(root, "b")));
  REQUIRE_FALSE(fs::exists(root / ".old.b"));
  save(root, "b", 2, model, 2);
  REQUIRE(ckpt::CheckpointReader(root).manifest().tag == "b");

  // commit() without a staging directory, or with a rank's file missing, commits nothing.
  ckpt::Manifest m = ckpt::CheckpointReader(root).manifest();
  m.tag = "c";
  REQUIRE_THROWS_WITH(ckpt::commit(root, m),
                      StartsWith(ckpt::staging_dir(root, "c").string() + ": no staging directory to commit"));
  ckpt::prepare_staging(root, "c");
  REQUIRE_THROWS_WITH(ckpt::commit(root, m), Equals((ckpt::staging_dir(root, "c") / "rank_00000.bin").string() +
                                                    ": cannot commit: No such file or directory"));
  REQUIRE(ckpt::read_latest(root) == "b");
}

TEST_CASE("ckpt: truncation, any bit flip and a missing file are caught, naming the file", "[ckpt]") {
  ScratchDir dir;
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  auto model = make_model(seed);
  model.erase(model.begin() + 3);  // without the big param: fast to verify many times
  model.push_back(make_param("mid.weight", {1'200'000}, DType::bf16, true, seed));  // 4.8 MB: two chunks
  save(dir.path(), "t", 1, model, 3);
  const ckpt::CheckpointReader r(dir.path());
  r.verify_all();
  const auto& files = r.manifest().files;

  SECTION("a single bit flipped anywhere") {
    std::mt19937_64 gen(seed);
    for (int trial = 0; trial < 24; ++trial) {
      const std::size_t fi = gen() % files.size();
      const ckpt::FileSummary& f = files[fi];
      const fs::path path = r.dir() / f.name;
      const std::uint64_t byte = trial == 0 ? 0 : trial == 1 ? f.bytes - 1 : gen() % f.bytes;
      const int bit = static_cast<int>(gen() % 8);
      INFO(f.name << " byte " << byte << " bit " << bit);
      flip_bit(path, byte, bit);
      REQUIRE_THROWS_WITH(r.verify_all(), StartsWith(path.string() + ": checksum mismatch"));
      // The read of the chunk holding that byte fails too; a reader opened afterwards as well.
      const ckpt::ChunkEntry* hit = nullptr;
      for (const auto& c : f.chunks) {
        if (byte >= c.offset && byte < c.offset + c.count * zero3::size_of(c.dtype)) hit = &c;
      }
      REQUIRE(hit != nullptr);
      std::vector<std::byte> out(hit->count * 4);
      REQUIRE_THROWS_WITH(r.read(hit->param, hit->kind, hit->first, hit->count, DType::f32, out),
                          StartsWith(path.string() + ": checksum mismatch in chunk " + hit->param + "/" + hit->kind));
      const ckpt::CheckpointReader fresh(dir.path());
      REQUIRE_THROWS_WITH(fresh.read(hit->param, hit->kind, hit->first, 1, DType::f32, std::span(out).first(4)),
                          StartsWith(path.string() + ": checksum mismatch"));
      flip_bit(path, byte, bit);
    }
    r.verify_all();
  }
  SECTION("a truncated file") {
    const fs::path path = r.dir() / files[1].name;
    fs::resize_file(path, files[1].bytes - 3);
    REQUIRE_THROWS_WITH(r.verify_all(), Equals(fmt::format("{}: size {}, manifest says {}", path.string(),
                                                           files[1].bytes - 3, files[1].bytes)));
    const ckpt::ChunkEntry& last = files[1].chunks.back();
    std::vector<std::byte> out(last.count * 4);
    REQUIRE_THROWS_WITH(
        r.read(last.param, last.kind, last.first, last.count, DType::f32, out),
        StartsWith(path.string() + ": short read: chunk " + last.param + "/" + last.kind) && Contains("(truncated?)"));
  }
  SECTION("a missing file") {
    const fs::path path = r.dir() / files[2].name;
    fs::remove(path);
    REQUIRE_THROWS_WITH(ckpt::CheckpointReader(dir.path()).verify_all(),
                        Equals(path.string() + ": cannot open: No such file or directory"));
  }
}

TEST_CASE("ckpt: a failing write (file size limit) names the file and keeps the previous checkpoint", "[ckpt]") {
  ScratchDir dir;
  const fs::path& root = dir.path();
  const auto model = make_model(fresh_seed());
  save(root, "a", 1, model, 2);

  // In a child: no SIGXFSZ, so write() past RLIMIT_FSIZE fails with EFBIG instead of killing the process.
  int pipe_fds[2] = {-1, -1};
  REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    int code = 3;
    std::string message = "no exception";
    try {
      ::signal(SIGXFSZ, SIG_IGN);
      const rlimit limit{std::uint64_t{1} << 20, std::uint64_t{1} << 20};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(4);
      ckpt::prepare_staging(root, "b");
      ckpt::RankFileWriter w(ckpt::staging_dir(root, "b"), 0);
      const auto& big = by_name(model, "big.weight");
      w.append(big.name, "master", DType::f32, 0, big.numel(), big.bytes("master"));
      (void)w.finish();
    } catch (const CheckpointError& e) {
      code = 0;
      message = e.what();
    } catch (const std::exception& e) {
      code = 2;
      message = e.what();
    }
    (void)!::write(pipe_fds[1], message.data(), message.size());
    ::_exit(code);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buf[256];
  for (ssize_t n = 0; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) message.append(buf, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  INFO("child: " << message);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  const fs::path file = ckpt::staging_dir(root, "b") / "rank_00000.bin";
  REQUIRE_THAT(message, Equals(file.string() + ": write failed: File too large"));
  REQUIRE_FALSE(fs::exists(file));  // the failed writer removed its partial file
  REQUIRE(ckpt::read_latest(root) == "a");
  ckpt::CheckpointReader(root).verify_all();
}

namespace {

// A tmpfs of `size` mounted on `path` while alive; mounted() is false where mount is not permitted.
class TmpfsMount {
 public:
  TmpfsMount(const fs::path& path, const std::string& size) : path_(path) {
    fs::create_directories(path);
    mounted_ = ::mount("tmpfs", path.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
    if (!mounted_) error_ = std::generic_category().message(errno);
  }
  ~TmpfsMount() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  TmpfsMount(const TmpfsMount&) = delete;
  TmpfsMount& operator=(const TmpfsMount&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  fs::path path_;
  bool mounted_ = false;
  std::string error_;
};

}  // namespace

TEST_CASE("ckpt: a full file system (ENOSPC) names the file and keeps the previous checkpoint", "[ckpt]") {
  ScratchDir dir;
  const TmpfsMount tmpfs(dir / "small", "2m");
  if (!tmpfs.mounted()) {
    WARN("cannot mount a tmpfs here (" << tmpfs.error() << "): ENOSPC case skipped");
    return;
  }
  const fs::path root = dir / "small" / "ckpts";
  auto model = make_model(fresh_seed());
  model.erase(model.begin() + 3);  // a few KB: fits
  save(root, "a", 1, model, 2);

  const auto big = make_param("big.weight", {1'000'000}, DType::bf16, true, 5);
  ckpt::prepare_staging(root, "b");
  const fs::path file = ckpt::staging_dir(root, "b") / "rank_00000.bin";
  {
    ckpt::RankFileWriter w(ckpt::staging_dir(root, "b"), 0);
    REQUIRE_THROWS_WITH(w.append(big.name, "master", DType::f32, 0, big.numel(), big.bytes("master")),
                        Equals(file.string() + ": write failed: No space left on device"));
    REQUIRE_THROWS_WITH(w.finish(), Equals(file.string() + ": an earlier write failed; the writer is unusable"));
  }
  REQUIRE_FALSE(fs::exists(file));
  REQUIRE(ckpt::read_latest(root) == "a");
  ckpt::CheckpointReader(root).verify_all();
}

namespace {

struct Safetensors {
  nlohmann::json header;
  std::uint64_t header_bytes = 0;
  std::vector<std::byte> data;
};

Safetensors parse_safetensors(const fs::path& path) {
  const auto bytes = read_file(path);
  REQUIRE(bytes.size() >= 8);
  Safetensors st;
  for (int i = 0; i < 8; ++i) st.header_bytes |= std::to_integer<std::uint64_t>(bytes[i]) << (8 * i);
  REQUIRE(st.header_bytes % 8 == 0);
  REQUIRE(8 + st.header_bytes <= bytes.size());
  const std::string text(reinterpret_cast<const char*>(bytes.data()) + 8, st.header_bytes);
  st.header = nlohmann::json::parse(text);
  st.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(8 + st.header_bytes), bytes.end());
  return st;
}

}  // namespace

TEST_CASE("ckpt: export_safetensors writes a file safetensors readers accept, fp32 and bf16", "[ckpt]") {
  ScratchDir dir;
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const auto model = make_model(seed);
  save(dir.path(), "global_step42", 42, model, 3);
  const ckpt::CheckpointReader r(dir.path());

  for (DType dtype : {DType::f32, DType::bf16}) {
    INFO("export as " << zero3::dtype_name(dtype));
    const fs::path out = dir / "model.safetensors";
    ckpt::export_safetensors(r, out, dtype);
    REQUIRE_FALSE(fs::exists(dir / "model.safetensors.tmp"));
    const Safetensors st = parse_safetensors(out);
    REQUIRE(st.header["__metadata__"] ==
            nlohmann::json({{"format", "pt"}, {"zero3_tag", "global_step42"}, {"zero3_step", "42"}}));
    REQUIRE(st.header.size() == model.size() + 1);
    std::uint64_t offset = 0;
    for (const auto& p : model) {
      INFO(p.name);
      const auto& t = st.header.at(p.name);
      REQUIRE(t["dtype"] == (dtype == DType::f32 ? "F32" : "BF16"));
      REQUIRE(t["shape"] == nlohmann::json(p.shape));
      const auto begin = t["data_offsets"][0].get<std::uint64_t>();
      const auto end = t["data_offsets"][1].get<std::uint64_t>();
      REQUIRE(begin == offset);  // contiguous, in the manifest's order
      REQUIRE(end - begin == p.numel() * zero3::size_of(dtype));
      // The fp32 master where there is one, else the param, converted.
      const auto want = expected(p, p.trainable ? "master" : "param", 0, p.numel(), dtype);
      REQUIRE(std::equal(want.begin(), want.end(), st.data.begin() + static_cast<std::ptrdiff_t>(begin)));
      offset = end;
    }
    REQUIRE(offset == st.data.size());
  }
}

TEST_CASE("ckpt: export_hf writes the weights and transformers' config.json; refuses a model it cannot describe",
          "[ckpt]") {
  ScratchDir dir;
  const std::uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const auto model = make_model(seed);
  const nlohmann::json llama = {{"type", "llama"}, {"vocab_size", 64}, {"hidden_size", 32}, {"intermediate_size", 88},
                                {"layers", 2},     {"heads", 4},       {"kv_heads", 2},     {"seq_len", 16}};
  ckpt::Manifest m = save(dir.path(), "global_step7", 7, model, 2, false);
  m.config["zero3"]["model"] = llama;
  ckpt::commit(dir.path(), m);

  const fs::path out = dir / "hf";
  const auto files = ckpt::export_hf(ckpt::CheckpointReader(dir.path()), out, DType::bf16, 5'000'000'000);
  REQUIRE(files == std::vector<fs::path>{out / "model.safetensors", out / "config.json"});
  const Safetensors st = parse_safetensors(files[0]);
  REQUIRE(st.header.size() == model.size() + 1);
  for (const auto& p : model) REQUIRE(st.header.at(p.name)["dtype"] == "BF16");
  std::ifstream in(files[1]);
  const nlohmann::json c = nlohmann::json::parse(in);
  CHECK(c["architectures"] == nlohmann::json::array({"LlamaForCausalLM"}));
  CHECK(c["model_type"] == "llama");
  CHECK(c["num_hidden_layers"] == 2);
  CHECK(c["num_key_value_heads"] == 2);
  CHECK(c["head_dim"] == 8);  // hidden_size / heads when the block names none
  CHECK(c["max_position_embeddings"] == 16);
  CHECK(c["attention_bias"] == false);
  CHECK(c["tie_word_embeddings"] == false);
  CHECK(c["torch_dtype"] == "bfloat16");

  // q/k/v biases without an o_proj bias: Qwen2; an o_proj bias alone: neither.
  nlohmann::json qwen2 = m.config;
  qwen2["zero3"]["model"]["qkv_bias"] = true;
  const nlohmann::ordered_json q = ckpt::hf_config_json(qwen2, DType::f32);
  CHECK(q["architectures"] == nlohmann::json::array({"Qwen2ForCausalLM"}));
  CHECK(q["model_type"] == "qwen2");
  CHECK_FALSE(q.contains("attention_bias"));
  CHECK(q["torch_dtype"] == "float32");
  nlohmann::json o_only = m.config;
  o_only["zero3"]["model"]["o_bias"] = true;
  REQUIRE_THROWS_AS(ckpt::hf_config_json(o_only, DType::f32), zero3::ConfigError);
  REQUIRE_THROWS_WITH(ckpt::hf_config_json(o_only, DType::f32), Contains("neither a Llama nor a Qwen2"));

  // Another model type: a ConfigError naming it, before anything is written.
  ckpt::Manifest gpt = save(dir.path(), "global_step8", 8, model, 1, false);
  gpt.config["zero3"]["model"] = {{"type", "gpt"}};
  ckpt::commit(dir.path(), gpt);
  const ckpt::CheckpointReader gpt_reader(dir.path(), "global_step8");
  REQUIRE_THROWS_AS(ckpt::export_hf(gpt_reader, dir / "gpt_hf", DType::f32, 1 << 20), zero3::ConfigError);
  REQUIRE_THROWS_WITH(ckpt::export_hf(gpt_reader, dir / "gpt_hf", DType::f32, 1 << 20), Contains("model is \"gpt\""));
  REQUIRE_FALSE(fs::exists(dir / "gpt_hf"));
}
