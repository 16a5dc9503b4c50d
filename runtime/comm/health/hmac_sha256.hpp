// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), written for the progress store's handshake so that
// zero3_comm needs no crypto library. Plain functions and value types; any thread.
// Not hardened against timing side channels beyond equal_constant_time (the key is only ever a MAC key).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace zero3::comm::detail {

using Sha256Digest = std::array<std::byte, 32>;

class Sha256 {
 public:
  Sha256();
  void update(std::span<const std::byte> data);
  void update(std::string_view text);
  // Pads and returns the digest; the object must not be updated afterwards.
  Sha256Digest finish();

 private:
  void compress(const std::byte* block);
  std::array<std::uint32_t, 8> state_;
  std::array<std::byte, 64> block_{};
  std::size_t block_fill_ = 0;
  std::uint64_t total_bytes_ = 0;
};

Sha256Digest sha256(std::span<const std::byte> data);

// HMAC-SHA-256 over the concatenation of every update().
class HmacSha256 {
 public:
  explicit HmacSha256(std::span<const std::byte> key);
  void update(std::span<const std::byte> data) { inner_.update(data); }
  void update(std::string_view text) { inner_.update(text); }
  Sha256Digest finish();

 private:
  Sha256 inner_;
  std::array<std::byte, 64> outer_key_pad_{};
};

Sha256Digest hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> message);

// Compares without an early exit, so the time taken does not say how many leading bytes matched.
bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b);

}  // namespace zero3::comm::detail
