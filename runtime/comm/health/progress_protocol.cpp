#include "progress_protocol.hpp"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "hmac_sha256.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/core/error.hpp"

namespace zero3::comm {
namespace detail {

std::string errno_text(int err) {
  return std::generic_category().message(err);
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::size_t max_snapshot_frame(std::uint32_t world_size) {
  const std::size_t per_rank = 1 + 8 + 4 + kMaxProgressRecordBytes;
  return 1 + 4 + std::size_t(world_size) * per_rank + 4 + 1 + 4 + kMaxFailureNoticeBytes + kTagBytes;
}

void fill_random(std::span<std::byte> out) {
  std::size_t filled = 0;
  while (filled < out.size()) {
    const ssize_t n = ::getrandom(out.data() + filled, out.size() - filled, 0);
    if (n > 0) {
      filled += std::size_t(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      break;
    }
  }
  if (filled == out.size()) return;
  // Kernels without getrandom(2): the same pool through the device file.
  UniqueFd urandom(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
  while (urandom && filled < out.size()) {
    const ssize_t n = ::read(urandom.get(), out.data() + filled, out.size() - filled);
    if (n > 0) {
      filled += std::size_t(n);
    } else if (!(n < 0 && errno == EINTR)) {
      break;
    }
  }
  if (filled != out.size()) {
    throw CommError(
        "progress store: cannot draw random bytes (getrandom and /dev/urandom failed: " + errno_text(errno) + ")");
  }
}

void put_u8(std::vector<std::byte>& out, std::uint8_t v) {
  out.push_back(std::byte{v});
}
void put_u32(std::vector<std::byte>& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(std::byte((v >> (24 - 8 * i)) & 0xff));
}
void put_u64(std::vector<std::byte>& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(std::byte((v >> (56 - 8 * i)) & 0xff));
}
void put_bytes(std::vector<std::byte>& out, std::span<const std::byte> bytes) {
  out.insert(out.end(), bytes.begin(), bytes.end());
}
void put_text(std::vector<std::byte>& out, std::string_view text) {
  put_bytes(out, std::as_bytes(std::span(text.data(), text.size())));
}

std::span<const std::byte> ByteReader::bytes(std::size_t n) {
  if (!ok_ || bytes_.size() - offset_ < n) {
    ok_ = false;
    return {};
  }
  const auto out = bytes_.subspan(offset_, n);
  offset_ += n;
  return out;
}
std::uint8_t ByteReader::u8() {
  const auto b = bytes(1);
  return ok_ ? std::uint8_t(b[0]) : 0;
}
std::uint32_t ByteReader::u32() {
  const auto b = bytes(4);
  std::uint32_t v = 0;
  for (std::size_t i = 0; ok_ && i < 4; ++i) v = (v << 8) | std::uint32_t(b[i]);
  return v;
}
std::uint64_t ByteReader::u64() {
  const auto b = bytes(8);
  std::uint64_t v = 0;
  for (std::size_t i = 0; ok_ && i < 8; ++i) v = (v << 8) | std::uint64_t(b[i]);
  return v;
}
std::string ByteReader::text(std::size_t n) {
  const auto b = bytes(n);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

namespace {

// The MAC of a labelled transcript; the label keeps each use of the secret apart from the others.
Sha256Digest transcript_mac(const Secret& secret, std::string_view label, const HandshakeTranscript& t) {
  std::vector<std::byte> message;
  put_text(message, label);
  put_bytes(message, t.server_nonce);
  put_bytes(message, t.client_nonce);
  put_u32(message, t.rank);
  put_u32(message, t.world_size);
  return hmac_sha256(secret, message);
}

std::array<std::byte, kTagBytes> frame_tag(const SessionDirection& s, std::uint8_t type,
                                           std::span<const std::byte> body) {
  std::vector<std::byte> prefix;
  put_u8(prefix, std::uint8_t(s.direction));
  put_u64(prefix, s.counter);
  put_u8(prefix, type);
  HmacSha256 mac(s.key);
  mac.update(prefix);
  mac.update(body);
  const Sha256Digest full = mac.finish();
  std::array<std::byte, kTagBytes> tag{};
  std::copy_n(full.begin(), kTagBytes, tag.begin());
  return tag;
}

}  // namespace

Proof client_proof(const Secret& secret, const HandshakeTranscript& t) {
  return transcript_mac(secret, "zero3 progress v1 client proof", t);
}
Proof server_proof(const Secret& secret, const HandshakeTranscript& t) {
  return transcript_mac(secret, "zero3 progress v1 server proof", t);
}
SessionKey session_key(const Secret& secret, const HandshakeTranscript& t) {
  return transcript_mac(secret, "zero3 progress v1 session key", t);
}

void append_frame(std::vector<std::byte>& out, FrameType type, std::span<const std::byte> body,
                  SessionDirection* session) {
  const std::size_t length = 1 + body.size() + (session != nullptr ? kTagBytes : 0);
  put_u32(out, std::uint32_t(length));
  put_u8(out, std::uint8_t(type));
  put_bytes(out, body);
  if (session != nullptr) {
    put_bytes(out, frame_tag(*session, std::uint8_t(type), body));
    ++session->counter;
  }
}

ParseResult parse_frame(std::span<const std::byte> buffer, std::size_t max_frame, SessionDirection* session) {
  ParseResult result;
  if (buffer.size() < kFrameHeaderBytes) return result;
  ByteReader header(buffer.first(kFrameHeaderBytes));
  const std::uint32_t length = header.u32();
  const std::size_t min_length = 1 + (session != nullptr ? kTagBytes : 0);
  if (length > max_frame) {
    result.status = ParseStatus::oversize;
    return result;
  }
  if (length < min_length) {
    result.status = ParseStatus::garbage;
    return result;
  }
  if (buffer.size() < kFrameHeaderBytes + length) return result;
  const auto frame = buffer.subspan(kFrameHeaderBytes, length);
  result.frame.type = std::uint8_t(frame[0]);
  result.frame.body = frame.subspan(1, length - min_length);
  result.frame.consumed = kFrameHeaderBytes + length;
  if (session != nullptr) {
    const auto expected = frame_tag(*session, result.frame.type, result.frame.body);
    if (!equal_constant_time(expected, frame.last(kTagBytes))) {
      result.status = ParseStatus::garbage;
      return result;
    }
    ++session->counter;
  }
  result.status = ParseStatus::ok;
  return result;
}

std::vector<std::byte> encode_snapshot(const ProgressSnapshot& snapshot) {
  std::vector<std::byte> out;
  put_u32(out, std::uint32_t(snapshot.ranks.size()));
  for (const RankProgress& r : snapshot.ranks) {
    put_u8(out, std::uint8_t((r.published ? 1 : 0) | (r.connected ? 2 : 0)));
    put_u64(out, std::uint64_t(std::max<std::int64_t>(r.age_ms, 0)));
    put_u32(out, std::uint32_t(r.record.size()));
    put_text(out, r.record);
  }
  put_u32(out, snapshot.failure_rank < 0 ? 0xffffffffu : std::uint32_t(snapshot.failure_rank));
  put_u8(out, snapshot.failure_notice ? 1 : 0);
  const std::string_view notice = snapshot.failure_notice ? std::string_view(*snapshot.failure_notice) : "";
  put_u32(out, std::uint32_t(notice.size()));
  put_text(out, notice);
  return out;
}

std::optional<ProgressSnapshot> decode_snapshot(std::span<const std::byte> body, std::uint32_t world_size) {
  ByteReader in(body);
  if (in.u32() != world_size || !in.ok()) return std::nullopt;
  ProgressSnapshot snapshot;
  snapshot.ranks.resize(world_size);
  for (RankProgress& r : snapshot.ranks) {
    const std::uint8_t flags = in.u8();
    r.published = (flags & 1) != 0;
    r.connected = (flags & 2) != 0;
    r.age_ms = std::int64_t(std::min<std::uint64_t>(in.u64(), std::uint64_t(INT64_MAX)));
    const std::uint32_t length = in.u32();
    if (length > kMaxProgressRecordBytes) return std::nullopt;
    r.record = in.text(length);
  }
  const std::uint32_t failure_rank = in.u32();
  const bool has_notice = in.u8() != 0;
  const std::uint32_t notice_length = in.u32();
  if (notice_length > kMaxFailureNoticeBytes) return std::nullopt;
  std::string notice = in.text(notice_length);
  if (!in.at_end()) return std::nullopt;
  if (has_notice) snapshot.failure_notice = std::move(notice);
  snapshot.failure_rank = failure_rank == 0xffffffffu ? -1 : int(failure_rank);
  return snapshot;
}

}  // namespace detail

namespace {
constexpr std::array<char, 4> kEndpointMagic = {'Z', '3', 'E', 'P'};
constexpr std::size_t kMaxHostChars = 64;
}  // namespace

std::vector<std::byte> ProgressEndpoint::to_bytes() const {
  ZERO3_CHECK(!host.empty() && host.size() <= kMaxHostChars, "progress endpoint: host must be 1-64 characters");
  std::vector<std::byte> out;
  detail::put_text(out, std::string_view(kEndpointMagic.data(), kEndpointMagic.size()));
  detail::put_u8(out, std::uint8_t(port >> 8));
  detail::put_u8(out, std::uint8_t(port & 0xff));
  detail::put_u8(out, std::uint8_t(host.size()));
  detail::put_text(out, host);
  detail::put_bytes(out, secret);
  out.resize(kWireBytes, std::byte{0});
  return out;
}

ProgressEndpoint ProgressEndpoint::from_bytes(std::span<const std::byte> bytes) {
  if (bytes.size() != kWireBytes) {
    throw CommError("progress endpoint: expected " + std::to_string(kWireBytes) + " bytes, got " +
                    std::to_string(bytes.size()));
  }
  detail::ByteReader in(bytes);
  const std::string magic = in.text(kEndpointMagic.size());
  const std::uint16_t port_high = in.u8();
  const std::uint16_t port = std::uint16_t((port_high << 8) | in.u8());
  const std::size_t host_chars = in.u8();
  if (magic != std::string_view(kEndpointMagic.data(), kEndpointMagic.size()) || host_chars == 0 ||
      host_chars > kMaxHostChars || port == 0) {
    throw CommError(
        "progress endpoint: the bytes from rank 0 do not hold an endpoint (did rank 0 pass its ProgressServer?)");
  }
  ProgressEndpoint endpoint;
  endpoint.port = port;
  endpoint.host = in.text(host_chars);
  const auto secret = in.bytes(kProgressSecretBytes);
  std::copy(secret.begin(), secret.end(), endpoint.secret.begin());
  return endpoint;
}

ProgressEndpoint share_progress_endpoint(Bootstrap& bootstrap, const ProgressServer* server) {
  // Rank 0 without a server sends zeros, which every rank then rejects alike instead of some of them hanging.
  std::vector<std::byte> bytes(ProgressEndpoint::kWireBytes, std::byte{0});
  if (bootstrap.rank() == 0 && server != nullptr) bytes = server->endpoint().to_bytes();
  bootstrap.broadcast(bytes, 0);
  return ProgressEndpoint::from_bytes(bytes);
}

}  // namespace zero3::comm
