// Writes checkpoints for the `zero3 ckpt` script test (ckpt_export_safetensors.sh), as W ranks would.
//   make_test_checkpoint small ROOT EXPECTED_DIR
//       tag global_step5 at step 5, two ranks, a few params (bf16 and fp16 trainable, a frozen one, a
//       zero-size one, one spanning several chunks); EXPECTED_DIR gets params.json (names, shapes in
//       order) and per param NAME.f32 / NAME.bf16: the raw little-endian values an fp32 / bf16 export holds.
//   make_test_checkpoint big ROOT MEGABYTES
//       tag big, two ranks, trainable bf16 params of 4M elements until the fp32 masters hold MEGABYTES;
//       written piece by piece, so this program's memory stays small too.
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/rng.hpp"

namespace fs = std::filesystem;
namespace ckpt = zero3::ckpt;
using zero3::DType;

namespace {

struct Param {
  ckpt::ParamInfo info;
  std::vector<float> master;   // trainable only
  std::vector<std::byte> low;  // "param" in info.dtype
};

Param make(const std::string& name, std::vector<std::int64_t> shape, DType dtype, bool trainable) {
  Param p{{name, "unit0", std::move(shape), dtype, trainable}, {}, {}};
  const std::size_t n = p.info.numel();
  const zero3::CounterRng rng(5, zero3::hash_name(name));
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rng.normal(i));
  p.low.resize(n * zero3::size_of(dtype));
  for (std::size_t i = 0; i < n; ++i) zero3::store_from_float(p.low.data(), dtype, i, v[i]);
  if (trainable) p.master = std::move(v);
  return p;
}

void write_raw(const fs::path& path, const void* data, std::size_t bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!f) throw std::runtime_error("cannot write " + path.string());
}

void small(const fs::path& root, const fs::path& expected_dir) {
  std::vector<Param> params;
  params.push_back(make("layers.0.attn.weight", {6, 5}, DType::bf16, true));
  params.push_back(make("layers.0.ln.bias", {5}, DType::f16, true));
  params.push_back(make("embed.frozen", {4, 3}, DType::bf16, false));
  params.push_back(make("empty.weight", {0, 2}, DType::bf16, true));
  params.push_back(make("mid.weight", {1'100'003}, DType::bf16, true));  // 4.4 MB master: two chunks

  const std::string tag = "global_step5";
  const int world_size = 2;
  ckpt::prepare_staging(root, tag);
  ckpt::Manifest m;
  m.tag = tag;
  m.step = 5;
  m.world_size = world_size;
  m.config = {{"train_batch_size", 4}};
  m.config_hash = "feedface";
  m.state = nlohmann::json::object();
  for (const Param& p : params) m.params.push_back(p.info);
  for (int r = 0; r < world_size; ++r) {
    ckpt::RankFileWriter w(ckpt::staging_dir(root, tag), r);
    for (const Param& p : params) {
      const std::uint64_t n = p.info.numel();
      const std::uint64_t lo = n * static_cast<std::uint64_t>(r) / world_size;
      const std::uint64_t hi = n * static_cast<std::uint64_t>(r + 1) / world_size;
      if (p.info.trainable) {
        w.append(p.info.name, "master", DType::f32, lo, hi - lo,
                 std::as_bytes(std::span(p.master)).subspan(lo * 4, (hi - lo) * 4));
      }
      const std::size_t e = zero3::size_of(p.info.dtype);
      w.append(p.info.name, "param", p.info.dtype, lo, hi - lo, std::span(p.low).subspan(lo * e, (hi - lo) * e));
    }
    m.files.push_back(w.finish());
  }
  ckpt::commit(root, m);

  // What an export holds: the master where there is one, else the param, as fp32 and as bf16.
  fs::create_directories(expected_dir);
  nlohmann::json list = nlohmann::json::array();
  for (const Param& p : params) {
    const std::size_t n = p.info.numel();
    std::vector<float> f32(n);
    std::vector<zero3::bf16_t> bf16(n);
    for (std::size_t i = 0; i < n; ++i) {
      f32[i] = p.info.trainable ? p.master[i] : zero3::load_as_float(p.low.data(), p.info.dtype, i);
      bf16[i] = zero3::float_to_bf16(f32[i]);
    }
    write_raw(expected_dir / (p.info.name + ".f32"), f32.data(), n * 4);
    write_raw(expected_dir / (p.info.name + ".bf16"), bf16.data(), n * 2);
    list.push_back({{"name", p.info.name}, {"shape", p.info.shape}});
  }
  std::ofstream(expected_dir / "params.json") << nlohmann::json{{"tag", tag}, {"step", 5}, {"params", list}}.dump(1);
}

void big(const fs::path& root, std::uint64_t megabytes) {
  constexpr std::uint64_t kParamElems = std::uint64_t{4} << 20;
  constexpr std::uint64_t kPiece = std::uint64_t{1} << 20;
  const std::uint64_t total = (megabytes << 20) / 4;
  const int world_size = 2;
  ckpt::Manifest m;
  m.tag = "big";
  m.step = 1;
  m.world_size = world_size;
  m.config = nlohmann::json::object();
  m.state = nlohmann::json::object();
  for (std::uint64_t done = 0, i = 0; done < total; done += kParamElems, ++i) {
    const auto n = static_cast<std::int64_t>(std::min(kParamElems, total - done));
    m.params.push_back({"layers." + std::to_string(i) + ".weight", "unit" + std::to_string(i), {n}, DType::bf16, true});
  }
  ckpt::prepare_staging(root, m.tag);
  std::vector<float> master(kPiece);
  std::vector<zero3::bf16_t> low(kPiece);
  for (int r = 0; r < world_size; ++r) {
    ckpt::RankFileWriter w(ckpt::staging_dir(root, m.tag), r);
    for (const ckpt::ParamInfo& p : m.params) {
      const std::uint64_t n = p.numel();
      const std::uint64_t lo = n * static_cast<std::uint64_t>(r) / world_size;
      const std::uint64_t hi = n * static_cast<std::uint64_t>(r + 1) / world_size;
      for (std::string_view kind : {"master", "param"}) {
        for (std::uint64_t at = lo; at < hi; at += kPiece) {
          const std::uint64_t count = std::min(kPiece, hi - at);
          for (std::uint64_t i = 0; i < count; ++i) {
            master[i] = static_cast<float>((at + i) % 1000) * 0.001f;
            low[i] = zero3::float_to_bf16(master[i]);
          }
          if (kind == "master") {
            w.append(p.name, kind, DType::f32, at, count, std::as_bytes(std::span(master).first(count)));
          } else {
            w.append(p.name, kind, DType::bf16, at, count, std::as_bytes(std::span(low).first(count)));
          }
        }
      }
    }
    m.files.push_back(w.finish());
  }
  ckpt::commit(root, m);
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() == 3 && args[0] == "small") {
      small(args[1], args[2]);
    } else if (args.size() == 3 && args[0] == "big") {
      big(args[1], std::stoull(args[2]));
    } else {
      std::fprintf(stderr, "usage: make_test_checkpoint small ROOT EXPECTED_DIR | big ROOT MEGABYTES\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_test_checkpoint: %s\n", e.what());
    return 1;
  }
  return 0;
}
