// Keys DeepSpeed 0.19.8 removed (deepspeed/runtime/config.py, `_reject_removed_config_keys`): DeepSpeed rejects
// a config that merely contains one, even `{}` or false, before it reads anything else, so zero3 does too,
// naming the key, the feature that went and what replaces it.
#include <fmt/format.h>

#include <span>

#include "parse_blocks.hpp"

namespace zero3::config::detail {

namespace {

struct RemovedKey {
  std::string_view key;
  std::string_view feature;
  std::string_view instead;  // what to use now; empty when nothing replaces it
};

constexpr RemovedKey kTopLevel[] = {
    {"amp", "NVIDIA Apex AMP", "use fp16, bf16 or torch_autocast"},
    {"nebula", "Nebula checkpointing", "the checkpoint block and zero3 train --save-dir"},
    {"compression_training", "the compression library", ""},
    {"quantize_training", "Mixture-of-Quantization (quantize_training)", ""},
    {"sparse_gradients", "sparse embedding gradients", ""},
    {"eigenvalue", "eigenvalue-based Mixture-of-Quantization", ""},
    {"sparse_attention", "Sparse Attention", ""},
    {"elasticity", "elastic training", ""},
    {"graph_harvesting", "graph harvesting", ""},
    {"curriculum_learning", "the top-level curriculum learning",
     "use data_efficiency.data_sampling.curriculum_learning"},
    {"progressive_layer_drop", "Progressive Layer Dropping", ""},
};

constexpr RemovedKey kZeroOptimization[] = {
    {"mics_shard_size", "MiCS sharding", ""},
    {"mics_hierarchical_params_gather", "MiCS sharding", ""},
    {"zeropp_loco_param", "LoCo-ZeRO++", ""},
};

void reject_removed(ObjectReader& r, std::span<const RemovedKey> keys) {
  for (const RemovedKey& k : keys) {
    if (!r.has(k.key)) continue;
    r.skip(k.key);
    r.error(k.key, fmt::format("{} was removed in DeepSpeed 0.19.8, which rejects this key even when the feature is "
                               "off (DeepSpeed issue 8489); delete the key{}{}",
                               k.feature, k.instead.empty() ? "" : ", and ", k.instead));
  }
}

}  // namespace

void parse_removed_keys(ObjectReader& top, Context&) {
  reject_removed(top, kTopLevel);
}

void parse_removed_zero_keys(ObjectReader& zero) {
  reject_removed(zero, kZeroOptimization);
}

}  // namespace zero3::config::detail
