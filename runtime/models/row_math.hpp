// Per-row helpers the host kernels share (gpt_ops, flash_attention): per-thread scratch and a row's shifted
// exponentials with their sum in a fixed order. Internal to zero3_models; header-only templates.
#pragma once

#include <cmath>
#include <cstddef>
#include <type_traits>
#include <vector>

#include "vector_math.hpp"

namespace zero3::models::ops {

// Per-thread scratch of n elements; each Slot is a separate buffer, so a kernel can hold several at once. The
// contents are left from the thread's last use.
template <typename T, int Slot = 0>
T* thread_scratch(std::size_t n) {
  thread_local std::vector<T> scratch;
  if (scratch.size() < n) scratch.resize(n);
  return scratch.data();
}

// out[j] = exp(x[j] - shift) for j in [0, n), returning their sum in double (x and out may be the same
// array): float through vmath::exp_shifted_sum_f32 (one pass, 16 lanes summed in a fixed order), double
// with std::exp and the same lane order.
template <typename T>
double exp_shifted(const T* x, T* out, std::size_t n, T shift) {
  if constexpr (std::is_same_v<T, float>) {
    return vmath::exp_shifted_sum_f32(x, out, n, shift);
  } else {
    constexpr std::size_t kLanes = 16;
    double lane[kLanes] = {};
    for (std::size_t j = 0; j < n; ++j) {
      out[j] = std::exp(x[j] - shift);
      lane[j % kLanes] += out[j];
    }
    double half[kLanes / 2];
    for (std::size_t l = 0; l < kLanes / 2; ++l) half[l] = lane[l] + lane[l + kLanes / 2];
    return ((half[0] + half[1]) + (half[2] + half[3])) + ((half[4] + half[5]) + (half[6] + half[7]));
  }
}

}  // namespace zero3::models::ops
