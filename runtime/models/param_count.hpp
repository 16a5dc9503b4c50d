// Param counts of the models from their unit specs, in checked arithmetic: a model of many identical blocks
// is counted from one block, so that a layer count no memory could declare is counted (and refused by the
// memory checks) instead of being built. Internal to zero3_models.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zero3/core/checked.hpp"
#include "zero3/core/error.hpp"
#include "zero3/units/unit_spec.hpp"

namespace zero3::models::detail {

// Elements of all params of `unit`; ConfigError naming the unit when the sum overflows.
inline std::size_t unit_numel(const UnitSpec& unit) {
  std::size_t total = 0;
  for (const ParamSpec& p : unit.params)
    total = checked_add<ConfigError>(total, p.numel(), "params of unit " + unit.name);
  return total;
}

// first + blocks x block + last: the elements of a model whose `blocks` middle units hold `block` each.
inline std::size_t model_params(std::size_t first, int blocks, std::size_t block, std::size_t last) {
  const std::size_t middle =
      checked_mul<ConfigError>(static_cast<std::size_t>(blocks), block, "zero3.model: the params of the layers");
  return checked_add<ConfigError>(checked_add<ConfigError>(first, middle, "zero3.model: the params of the model"), last,
                                  "zero3.model: the params of the model");
}

// A bound on every product of a model's activation plan: no buffer holds more than `rows` x `widest` elements
// (widest: the largest of the model's widths) of at most 8 bytes, and a layer, the embedding and the head keep
// fewer than 32 each; that bound fitting int64 keeps every product below it from wrapping. ConfigError otherwise.
inline void check_activation_bound(std::int64_t rows, std::int64_t layers, std::int64_t widest) {
  const std::int64_t per_buffer = checked_mul<ConfigError>(
      rows, widest, "zero3.model: a buffer of the activations (micro-batch x seq_len x the model's widest width)");
  checked_mul<ConfigError>(per_buffer, checked_add<ConfigError>(layers, std::int64_t{2}, "zero3.model.layers") * 256,
                           "zero3.model: the activations of all layers");
}

}  // namespace zero3::models::detail
