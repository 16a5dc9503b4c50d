// Keys of features DeepSpeed 0.19.8 removed. Its loader (deepspeed/runtime/config.py,
// `_reject_removed_config_keys`) refuses a config that merely contains one of them, whatever the value ({},
// false, null), before reading anything else; zero3 gives the same verdict, one error per key at its path,
// with what to use instead. See https://github.com/deepspeedai/DeepSpeed/issues/8489.
#include <fmt/format.h>

#include <span>

#include "parse_blocks.hpp"

namespace zero3::config::detail {

namespace {

struct RemovedKey {
  std::string_view key;
  std::string_view feature;  // what the key configured
  std::string_view advice;   // what to do instead, before "delete the key"; may be empty
};

constexpr RemovedKey kTopLevel[] = {
    {"amp", "NVIDIA Apex AMP", "for mixed precision use the fp16, bf16 or torch_autocast block"},
    {"nebula", "Nebula checkpointing", "checkpoints are written by the regular checkpoint path"},
    {"compression_training", "the compression library", "it has no replacement; the model trains unquantized"},
    {"quantize_training", "Mixture-of-Quantization (MoQ) training", "it has no replacement"},
    {"sparse_gradients", "sparse compression of dense embedding gradients",
     "embeddings built with sparse=True need no config flag"},
    {"eigenvalue", "eigenvalue-based MoQ", "it has no replacement"},
    {"sparse_attention", "DeepSpeed Sparse Attention", "it has no replacement"},
    {"elasticity", "elastic training",
     "set train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps directly"},
    {"graph_harvesting", "graph harvesting", "it has no replacement"},
    {"curriculum_learning", "top-level curriculum learning",
     "configure it under data_efficiency.data_sampling.curriculum_learning"},
    {"progressive_layer_drop", "progressive layer dropping", "it has no replacement"},
};

constexpr RemovedKey kZeroOptimization[] = {
    {"mics_shard_size", "MiCS sharding", "plain ZeRO-3 partitioning is the replacement"},
    {"mics_hierarchical_params_gather", "MiCS sharding", "plain ZeRO-3 partitioning is the replacement"},
    {"zeropp_loco_param", "LoCo-ZeRO++", "ZeRO++ quantized gradients work without it"},
};

void reject_present(ObjectReader& r, std::span<const RemovedKey> keys) {
  for (const RemovedKey& k : keys) {
    if (r.raw(k.key) == nullptr) continue;
    r.error(k.key, fmt::format("{} was removed in DeepSpeed 0.19.8, which rejects a config containing this key "
                               "even when the feature is off; {}; delete the key",
                               k.feature, k.advice));
  }
}

}  // namespace

void parse_removed_keys(ObjectReader& top, Context& /*cx*/) {
  reject_present(top, kTopLevel);
}

void reject_removed_zero_keys(ObjectReader& zero) {
  reject_present(zero, kZeroOptimization);
}

}  // namespace zero3::config::detail
