#include "hmac_sha256.hpp"

#include <algorithm>
#include <cstring>

namespace zero3::comm::detail {
namespace {

// FIPS 180-4 section 4.2.2: the first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr std::array<std::uint32_t, 64> kRoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// Section 5.3.3: the first 32 bits of the fractional parts of the square roots of the first 8 primes.
constexpr std::array<std::uint32_t, 8> kInitialState = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                        0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

constexpr std::size_t kBlockBytes = 64;

constexpr std::uint32_t rotr(std::uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

std::uint32_t load_be32(const std::byte* p) {
  return (std::uint32_t(p[0]) << 24) | (std::uint32_t(p[1]) << 16) | (std::uint32_t(p[2]) << 8) | std::uint32_t(p[3]);
}

void store_be32(std::uint32_t v, std::byte* p) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte((v >> (24 - 8 * i)) & 0xff);
}

}  // namespace

Sha256::Sha256() : state_(kInitialState) {}

void Sha256::compress(const std::byte* block) {
  std::array<std::uint32_t, 64> w{};  // the message schedule, section 6.2.2 step 1
  for (std::size_t t = 0; t < 16; ++t) w[t] = load_be32(block + 4 * t);
  for (int t = 16; t < 64; ++t) {
    const std::uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const std::uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = s1 + w[t - 7] + s0 + w[t - 16];
  }
  auto [a, b, c, d, e, f, g, h] = state_;
  for (int t = 0; t < 64; ++t) {
    const std::uint32_t big_sigma1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const std::uint32_t choose = (e & f) ^ (~e & g);
    const std::uint32_t t1 = h + big_sigma1 + choose + kRoundConstants[t] + w[t];
    const std::uint32_t big_sigma0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const std::uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    const std::uint32_t t2 = big_sigma0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  const std::array<std::uint32_t, 8> worked = {a, b, c, d, e, f, g, h};
  for (int i = 0; i < 8; ++i) state_[i] += worked[i];
}

void Sha256::update(std::span<const std::byte> data) {
  if (data.empty()) return;  // an empty span may hold a null pointer, which memcpy must not see
  total_bytes_ += data.size();
  std::size_t offset = 0;
  if (block_fill_ > 0) {
    const std::size_t take = std::min(kBlockBytes - block_fill_, data.size());
    std::memcpy(block_.data() + block_fill_, data.data(), take);
    block_fill_ += take;
    offset = take;
    if (block_fill_ < kBlockBytes) return;
    compress(block_.data());
    block_fill_ = 0;
  }
  for (; offset + kBlockBytes <= data.size(); offset += kBlockBytes) compress(data.data() + offset);
  std::memcpy(block_.data(), data.data() + offset, data.size() - offset);
  block_fill_ = data.size() - offset;
}

void Sha256::update(std::string_view text) {
  update(std::as_bytes(std::span(text.data(), text.size())));
}

Sha256Digest Sha256::finish() {
  // Section 5.1.1: a 1 bit, zeros up to 56 mod 64 bytes, then the message length in bits, big-endian.
  const std::uint64_t total_bits = total_bytes_ * 8;
  std::array<std::byte, kBlockBytes + 8> padding{};
  padding[0] = std::byte{0x80};
  const std::size_t pad_bytes = (block_fill_ < 56 ? 56 : 56 + kBlockBytes) - block_fill_;
  for (int i = 0; i < 8; ++i) padding[pad_bytes + i] = std::byte((total_bits >> (56 - 8 * i)) & 0xff);
  update(std::span(padding.data(), pad_bytes + 8));
  Sha256Digest digest;
  for (std::size_t i = 0; i < 8; ++i) store_be32(state_[i], digest.data() + 4 * i);
  return digest;
}

Sha256Digest sha256(std::span<const std::byte> data) {
  Sha256 h;
  h.update(data);
  return h.finish();
}

HmacSha256::HmacSha256(std::span<const std::byte> key) {
  // RFC 2104: keys longer than the block are hashed first; shorter ones are padded with zeros.
  std::array<std::byte, kBlockBytes> block_key{};
  if (key.size() > kBlockBytes) {
    const Sha256Digest hashed = sha256(key);
    std::copy(hashed.begin(), hashed.end(), block_key.begin());
  } else {
    std::copy(key.begin(), key.end(), block_key.begin());
  }
  std::array<std::byte, kBlockBytes> inner_key_pad{};
  for (std::size_t i = 0; i < kBlockBytes; ++i) {
    inner_key_pad[i] = block_key[i] ^ std::byte{0x36};
    outer_key_pad_[i] = block_key[i] ^ std::byte{0x5c};
  }
  inner_.update(inner_key_pad);
}

Sha256Digest HmacSha256::finish() {
  const Sha256Digest inner_digest = inner_.finish();
  Sha256 outer;
  outer.update(outer_key_pad_);
  outer.update(inner_digest);
  return outer.finish();
}

Sha256Digest hmac_sha256(std::span<const std::byte> key, std::span<const std::byte> message) {
  HmacSha256 mac(key);
  mac.update(message);
  return mac.finish();
}

bool equal_constant_time(std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return false;
  std::byte diff{0};
  for (std::size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == std::byte{0};
}

}  // namespace zero3::comm::detail
