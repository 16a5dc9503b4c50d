// `zero3 ckpt info DIR [--tag T] [--json]`: what a checkpoint holds (tag, step, world size, params and
// elements, bytes per tensor kind, files), after verifying every file and chunk checksum.
// `zero3 ckpt export DIR --out FILE [--dtype fp32|bf16] [--tag T]`: the model's weights as safetensors;
// with `--format hf`, OUT is a Hugging Face model directory (zero3/ckpt/hf_export.hpp).
// DIR is a checkpoint directory or a root (then --tag, else ROOT/latest). Exit 0: done; 2: not a checkpoint,
// or a file missing, truncated or corrupt ("error: <file>: <what>" on stderr).
#include <fmt/format.h>

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/hf_export.hpp"
#include "zero3/core/error.hpp"

namespace zero3::tools {
namespace {

constexpr int kExitBadCheckpoint = 2;

struct InfoArgs {
  std::string dir;
  std::string tag;
  bool json = false;
};

struct ExportArgs {
  std::string dir;
  std::string tag;
  std::string out;
  std::string dtype = "fp32";
  std::string format = "safetensors";
  std::string max_shard_size = "5GB";
};

struct Totals {
  std::uint64_t elements = 0;
  std::size_t trainable = 0;
  std::uint64_t file_bytes = 0;
  std::size_t chunks = 0;
  std::map<std::string, std::uint64_t> bytes_by_kind;
};

Totals totals_of(const ckpt::Manifest& m) {
  Totals t;
  for (const ckpt::ParamInfo& p : m.params) {
    t.elements += p.numel();
    if (p.trainable) ++t.trainable;
  }
  for (const ckpt::FileSummary& f : m.files) {
    t.file_bytes += f.bytes;
    t.chunks += f.chunks.size();
    for (const ckpt::ChunkEntry& c : f.chunks) t.bytes_by_kind[c.kind] += c.count * size_of(c.dtype);
  }
  return t;
}

void print_info(const ckpt::CheckpointReader& reader, bool as_json) {
  const ckpt::Manifest& m = reader.manifest();
  const Totals t = totals_of(m);
  if (as_json) {
    nlohmann::json files = nlohmann::json::array();
    for (const ckpt::FileSummary& f : m.files) {
      files.push_back({{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"chunks", f.chunks.size()}});
    }
    const nlohmann::json j = {{"dir", reader.dir().string()},
                              {"tag", m.tag},
                              {"step", m.step},
                              {"world_size", m.world_size},
                              {"config_hash", m.config_hash},
                              {"params", m.params.size()},
                              {"trainable_params", t.trainable},
                              {"elements", t.elements},
                              {"bytes_by_kind", t.bytes_by_kind},
                              {"bytes", t.file_bytes},
                              {"files", files},
                              {"verified", true}};
    std::cout << j.dump(2) << '\n';
    return;
  }
  std::string out = fmt::format("checkpoint  {}\ntag         {}\nstep        {}\nworld size  {}\n",
                                reader.dir().string(), m.tag, m.step, m.world_size);
  out += fmt::format("params      {} ({} elements; {} trainable, {} frozen)\n", m.params.size(), t.elements,
                     t.trainable, m.params.size() - t.trainable);
  out += "bytes by kind\n";
  for (const auto& [kind, bytes] : t.bytes_by_kind) out += fmt::format("  {:<12} {:>14}\n", kind, bytes);
  out += fmt::format("files       {} ({} bytes, {} chunks)\n", m.files.size(), t.file_bytes, t.chunks);
  for (const ckpt::FileSummary& f : m.files) out += fmt::format("  {:<16} {:>14} bytes\n", f.name, f.bytes);
  out += "checksums   ok\n";
  std::cout << out;
}

// --max-shard-size: "5GB", "500MB", "2GiB", "1000000" -> bytes (decimal units as transformers' max_shard_size,
// binary with "i"). ConfigError naming the text when it is not a size.
std::uint64_t parse_size(const std::string& text) {
  std::size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) != 0 || text[digits] == '.')) {
    ++digits;
  }
  double value = 0;
  try {
    value = std::stod(text.substr(0, digits));
  } catch (const std::exception&) {
    throw ConfigError(fmt::format("--max-shard-size \"{}\": not a size (e.g. 5GB, 500MB, 2GiB)", text));
  }
  std::string unit = text.substr(digits);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const std::pair<const char*, double> units[] = {
      {"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9}, {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}};
  for (const auto& [name, factor] : units) {
    if (unit == name && value * factor >= 1) return static_cast<std::uint64_t>(value * factor);
  }
  throw ConfigError(fmt::format("--max-shard-size \"{}\": not a size (e.g. 5GB, 500MB, 2GiB)", text));
}

// Runs `body`; a CheckpointError becomes "error: ..." on stderr and exit status 2.
template <typename F>
void reporting_checkpoint_errors(F&& body) {
  try {
    body();
  } catch (const CheckpointError& e) {
    std::cerr << "error: " << e.what() << '\n';
    throw CLI::RuntimeError(kExitBadCheckpoint);
  }
}

void run_info(const InfoArgs& args) {
  reporting_checkpoint_errors([&] {
    const ckpt::CheckpointReader reader(args.dir, args.tag);
    reader.verify_all();
    print_info(reader, args.json);
  });
}

void run_export(const ExportArgs& args) {
  const DType dtype = args.dtype == "bf16" ? DType::bf16 : DType::f32;
  reporting_checkpoint_errors([&] {
    const ckpt::CheckpointReader reader(args.dir, args.tag);
    if (args.format == "hf") {
      const auto refuse = [](const std::string& what) {
        std::cerr << "error: " << what << '\n';
        throw CLI::RuntimeError(kExitBadCheckpoint);
      };
      std::uint64_t max_shard_bytes = 0;
      try {
        max_shard_bytes = parse_size(args.max_shard_size);
      } catch (const ConfigError& e) {
        refuse(e.what());
      }
      std::vector<std::filesystem::path> files;
      try {
        files = ckpt::export_hf(reader, args.out, dtype, max_shard_bytes);
      } catch (const ConfigError& e) {
        refuse(fmt::format("--format hf: {} (--format safetensors writes the weights alone)", e.what()));
      }
      std::cout << fmt::format("{}: wrote {} ({} tensors in {} file(s), config.json, {})\n", reader.dir().string(),
                               args.out, reader.manifest().params.size(), files.size() - 1, dtype_name(dtype));
      return;
    }
    ckpt::export_safetensors(reader, args.out, dtype);
    std::cout << fmt::format("{}: wrote {} ({} tensors, {} bytes, {})\n", reader.dir().string(), args.out,
                             reader.manifest().params.size(), std::filesystem::file_size(args.out), dtype_name(dtype));
  });
}

}  // namespace

void add_ckpt_command(CLI::App& app) {
  CLI::App* ckpt = app.add_subcommand("ckpt", "Inspect, verify and export zero3 checkpoints");
  ckpt->require_subcommand(1);

  auto info_args = std::make_shared<InfoArgs>();
  CLI::App* info = ckpt->add_subcommand(
      "info", "Show a checkpoint's contents after verifying every checksum; exit 2 when missing or corrupt");
  info->add_option("dir", info_args->dir, "Checkpoint directory, or a root holding `latest`")->required();
  info->add_option("--tag", info_args->tag, "Tag under the root (default: the one ROOT/latest names)");
  info->add_flag("--json", info_args->json, "Print a JSON object instead of text");
  info->callback([info_args] { run_info(*info_args); });

  auto export_args = std::make_shared<ExportArgs>();
  CLI::App* exp = ckpt->add_subcommand(
      "export", "Write the model's weights (fp32 master where present, else the param) as a safetensors file");
  exp->add_option("dir", export_args->dir, "Checkpoint directory, or a root holding `latest`")->required();
  exp->add_option("--out", export_args->out, "The safetensors file to write (--format hf: the directory)")->required();
  exp->add_option("--format", export_args->format,
                  "safetensors: one file of the weights; hf: a transformers model directory (llama models)")
      ->check(CLI::IsMember({"safetensors", "hf"}))
      ->capture_default_str();
  exp->add_option("--max-shard-size", export_args->max_shard_size,
                  "--format hf: shard the weights above this size (5GB, 500MB, 2GiB)")
      ->capture_default_str();
  exp->add_option("--dtype", export_args->dtype, "Element type of the exported tensors")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  exp->add_option("--tag", export_args->tag, "Tag under the root (default: the one ROOT/latest names)");
  exp->callback([export_args] { run_export(*export_args); });
}

}  // namespace zero3::tools
