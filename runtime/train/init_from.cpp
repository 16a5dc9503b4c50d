#include "zero3/train/init_from.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string_view>

#include "zero3/ckpt/safetensors.hpp"
#include "zero3/core/error.hpp"

namespace zero3::train {
namespace {

constexpr std::string_view kEmbedding = "model.embed_tokens.weight";
constexpr std::string_view kLmHead = "lm_head.weight";

bool is_skipped_buffer(std::string_view name) {
  return name.ends_with(".rotary_emb.inv_freq");
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace

std::string init_from_checkpoint(std::vector<UnitSpec>& units, const std::filesystem::path& path) {
  auto ckpt = std::make_shared<const ckpt::SafetensorsCheckpoint>(ckpt::SafetensorsCheckpoint::open(path));
  std::set<std::string, std::less<>> used;
  std::set<std::string_view> dtypes;
  for (UnitSpec& unit : units) {
    for (ParamSpec& p : unit.params) {
      std::string source = p.name;
      if (!ckpt->contains(source) && p.name == kLmHead && ckpt->contains(kEmbedding)) source = kEmbedding;  // tied
      if (!ckpt->contains(source)) {
        throw ConfigError(fmt::format("zero3.model.init_from: {} has no tensor \"{}\" (unit {}, shape {})",
                                      ckpt->source().string(), p.name, unit.name, shape_text(p.shape)));
      }
      const ckpt::SafetensorsTensor& t = ckpt->tensor(source);
      if (t.shape != p.shape) {
        throw ConfigError(fmt::format("zero3.model.init_from: {}: tensor \"{}\" has shape {}, the model's param {}",
                                      ckpt->file_of(source).string(), source, shape_text(t.shape),
                                      shape_text(p.shape)));
      }
      used.insert(source);
      dtypes.insert(ckpt::safetensors_dtype_name(t.dtype));
      p.init = ParamInit::custom(
          [ckpt, source](std::uint64_t first, std::span<float> out) { ckpt->read(source, first, out); });
    }
  }
  // A tied model has no lm_head.weight; a checkpoint may still store the tied copy (transformers then
  // ignores it as well).
  const bool tied = used.contains(kEmbedding) && !std::ranges::any_of(units, [](const UnitSpec& u) {
                      return std::ranges::any_of(u.params, [](const ParamSpec& p) { return p.name == kLmHead; });
                    });
  for (const std::string& name : ckpt->names()) {
    if (!used.contains(name) && !is_skipped_buffer(name) && !(tied && name == kLmHead)) {
      throw ConfigError(fmt::format(
          "zero3.model.init_from: {}: tensor \"{}\" matches no param of the model (a different architecture or "
          "shape settings?)",
          ckpt->file_of(name).string(), name));
    }
  }
  const auto bytes = static_cast<double>(ckpt->data_bytes());
  constexpr double kMiB = 1024.0 * 1024.0;
  return fmt::format("init_from {}: {} tensors, {} ({})", path.string(), used.size(),
                     bytes >= 1024.0 * kMiB ? fmt::format("{:.2f} GiB", bytes / (1024.0 * kMiB))
                                            : fmt::format("{:.2f} MiB", bytes / kMiB),
                     fmt::join(dtypes, ", "));
}

}  // namespace zero3::train
