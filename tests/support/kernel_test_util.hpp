// Random inputs and poisoned outputs for the kernel tests (host and GPU). Inputs are non-zero and
// finite once stored in the buffer's dtype, so a test never passes on zeros; outputs are poisoned with
// all-ones bytes (NaN in every dtype), so an element a kernel forgot to write fails.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>

#include "zero3/core/dtype.hpp"
#include "zero3/device/device.hpp"

namespace zero3::test {

// Catch's --rng-seed when given, otherwise a fresh seed (tests print theirs so a failure can be rerun).
inline std::uint64_t test_seed() {
  const std::uint64_t s = Catch::rngSeed();
  return s != 0 ? s : std::random_device{}();
}

// A random non-zero float: log-uniform magnitude in [2^lo_exp, 2^hi_exp), random mantissa and sign.
inline float random_float(std::mt19937_64& rng, int lo_exp, int hi_exp, bool positive = false) {
  std::uniform_int_distribution<int> exp_dist(lo_exp, hi_exp - 1);
  const float m = 1.0f + static_cast<float>(rng() & 0x7fffffu) * 0x1p-23f;
  const float v = std::ldexp(m, exp_dist(rng));
  return (!positive && (rng() & 1u)) ? -v : v;
}

inline double value_at(const void* data, DType t, std::size_t i) {
  return load_as_float(data, t, i);
}
inline double value_at(const Buffer& b, std::size_t i) {
  return load_as_float(b.data(), b.dtype(), i);
}

// Random values, non-zero and finite in b's dtype (already rounded to it).
inline void fill_random(Buffer& b, std::mt19937_64& rng, int lo_exp, int hi_exp, bool positive = false) {
  for (std::size_t i = 0; i < b.count(); ++i) {
    for (;;) {
      store_from_float(b.data(), b.dtype(), i, random_float(rng, lo_exp, hi_exp, positive));
      const double v = value_at(b, i);
      if (v != 0.0 && std::isfinite(v)) break;
    }
  }
}

// All-ones bytes are NaN in every dtype.
inline void poison(Buffer& b) {
  if (!b.empty()) std::memset(b.data(), 0xff, b.size_bytes());
}

}  // namespace zero3::test
