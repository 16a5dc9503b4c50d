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
// array); float through vmath::exp_f32.
template <typename T>
double exp_shifted(const T* x, T* out, std::size_t n, T shift) {
  for (std::size_t j = 0; j < n; ++j) out[j] = x[j] - shift;
  if constexpr (std::is_same_v<T, float>) {
    vmath::exp_f32(out, out, n);
  } else {
    for (std::size_t j = 0; j < n; ++j) out[j] = std::exp(out[j]);
  }
  // Eight partial sums (lane j % 8), added pairwise at the end: one running double sum would wait on each
  // add's latency, and a fixed order keeps the result independent of threads.
  constexpr std::size_t kLanes = 8;
  double part[kLanes] = {};
  std::size_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (std::size_t l = 0; l < kLanes; ++l) part[l] += out[j + l];
  }
  for (; j < n; ++j) part[j % kLanes] += out[j];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

}  // namespace zero3::models::ops
