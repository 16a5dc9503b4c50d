// Counter-based random numbers: the value at (seed, key, index) is a pure function of those three, so
// any rank can produce any slice of a tensor without producing the rest, and the full tensor is the
// same for every world size. `key` is usually the hash of a parameter name (hash_name).
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace zero3 {

// FNV-1a, 64-bit: a stable hash of a name across builds and platforms.
inline constexpr std::uint64_t hash_name(std::string_view name) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// splitmix64's finalizer: a bijective mix with full avalanche.
inline constexpr std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

class CounterRng {
 public:
  constexpr CounterRng(std::uint64_t seed, std::uint64_t key)
      : base_(mix64(seed ^ mix64(key + 0x9e3779b97f4a7c15ull))) {}

  constexpr std::uint64_t bits(std::uint64_t index, std::uint64_t lane = 0) const {
    return mix64(base_ + mix64(index * 2 + lane + 1));
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform(std::uint64_t index, std::uint64_t lane = 0) const {
    return static_cast<double>(bits(index, lane) >> 11) * 0x1.0p-53;
  }
  // Standard normal (Box-Muller on two lanes of the same counter).
  double normal(std::uint64_t index) const {
    const double u1 = 1.0 - uniform(index, 0);  // (0, 1]: log never sees 0
    const double u2 = uniform(index, 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  std::uint64_t base_;
};

}  // namespace zero3
