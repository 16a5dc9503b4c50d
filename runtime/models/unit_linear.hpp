// What the GPT and the Llama share around their matrix products: a unit's weights as the caller gathered
// them (fp32, or bf16 where the CPU multiplies bf16 natively and the model marks the param a bf16 operand),
// the linear layer over either, and set_batch's checks. Private to runtime/models.
#pragma once

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "gpt_ops.hpp"
#include "host_gemm.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"

namespace zero3::models::detail {

// Checks a unit's bf16 weights against its params and keeps them in w16 (null: fp32 products). A non-null
// params16[k] is allowed only where is_operand(k), for float, on a CPU with bf16 products; every other
// params[k] must be non-null. `model` names the model in errors ("GptModel").
template <typename T, typename IsOperand>
void take_unit_params16(const char* model, const char* what, std::size_t unit, std::span<const T* const> params,
                        std::span<const bf16_t* const> params16, const IsOperand& is_operand,
                        std::vector<const bf16_t*>& w16) {
  if (!params16.empty() && params16.size() != params.size()) {
    throw UsageError(fmt::format("{}::{}: unit {}: {} bf16 params for {} params", model, what, unit, params16.size(),
                                 params.size()));
  }
  w16.assign(params.size(), nullptr);
  for (std::size_t k = 0; k < params.size(); ++k) {
    const bf16_t* p16 = params16.empty() ? nullptr : params16[k];
    if (p16 != nullptr) {
      if (!std::is_same_v<T, float> || !is_operand(k) || !gemm::bf16_native()) {
        throw UsageError(fmt::format(
            "{}::{}: unit {} param {}: a bf16 copy is taken only for a matrix weight of a float model on a CPU "
            "with bf16 products (bf16_operand, host_bf16_products)",
            model, what, unit, k));
      }
      w16[k] = p16;
      continue;
    }
    if (params[k] == nullptr) throw UsageError(fmt::format("{}::{}: unit {} param {} is null", model, what, unit, k));
  }
}

// y[rows, out] = x p[k]^T + bias, in bf16 products (x rounded into round_x) when w16[k] is set.
template <typename T>
void unit_linear_forward(const std::vector<const bf16_t*>& w16, std::vector<bf16_t>& round_x,
                         std::span<const T* const> p, std::size_t k, const T* bias, const T* x, T* y, std::size_t rows,
                         std::size_t in, std::size_t out) {
  if constexpr (std::is_same_v<T, float>) {
    if (w16[k] != nullptr) {
      ops::linear_forward_bf16(x, w16[k], bias, y, rows, in, out, round_x);
      return;
    }
  }
  ops::linear_forward(x, p[k], bias, y, rows, in, out);
}

// As ops::linear_backward, in bf16 products when w16[k] is set.
template <typename T>
void unit_linear_backward(const std::vector<const bf16_t*>& w16, std::vector<bf16_t>& round_x,
                          std::vector<bf16_t>& round_dy, std::span<const T* const> p, std::size_t k, const T* x,
                          const T* dy, T* dx, bool accumulate_dx, T* dw, T* dbias, std::size_t rows, std::size_t in,
                          std::size_t out) {
  if constexpr (std::is_same_v<T, float>) {
    if (w16[k] != nullptr) {
      ops::linear_backward_bf16(x, w16[k], dy, dx, accumulate_dx, dw, dbias, rows, in, out, round_x, round_dy);
      return;
    }
  }
  ops::linear_backward(x, p[k], dy, dx, accumulate_dx, dw, dbias, rows, in, out);
}

// set_batch's checks of a token model: batch >= 1, 1 <= len <= seq_len, batch * len ids each for tokens and
// targets, every id in [0, vocab). UsageError naming `model`, and the first bad id with its position.
inline void check_token_batch(const char* model, std::span<const std::int32_t> tokens,
                              std::span<const std::int32_t> targets, int batch, int len, int seq_len, int vocab) {
  if (batch < 1) throw UsageError(fmt::format("{}::set_batch: batch must be >= 1, got {}", model, batch));
  if (len < 1 || len > seq_len) {
    throw UsageError(
        fmt::format("{}::set_batch: len must be in [1, zero3.model.seq_len = {}], got {}", model, seq_len, len));
  }
  const auto rows = static_cast<std::size_t>(batch) * static_cast<std::size_t>(len);
  if (tokens.size() != rows || targets.size() != rows) {
    throw UsageError(fmt::format("{}::set_batch: tokens ({}) and targets ({}) must hold batch * len = {} ids", model,
                                 tokens.size(), targets.size(), rows));
  }
  for (std::size_t i = 0; i < rows; ++i) {
    for (const auto& [ids, what] : {std::pair{tokens, "tokens"}, std::pair{targets, "targets"}}) {
      if (ids[i] < 0 || ids[i] >= vocab) {
        throw UsageError(fmt::format(
            "{}::set_batch: {}[{}] (sequence {}, position {}) = {} is outside the vocabulary [0, {})", model, what, i,
            i / static_cast<std::size_t>(len), i % static_cast<std::size_t>(len), ids[i], vocab));
      }
    }
  }
}

}  // namespace zero3::models::detail
