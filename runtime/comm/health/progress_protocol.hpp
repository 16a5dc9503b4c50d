// The progress store's wire format, shared by its server and client: the preamble, frames, the handshake's
// proofs, the per-frame tags of an authenticated session, and the encodings of a snapshot and an endpoint.
// Pure functions over bytes, plus an owning file descriptor; no sockets are touched here. Spec: docs/comm.md.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "progress_store.hpp"

namespace zero3::comm::detail {

// Owns a file descriptor; closes it on destruction. Move-only.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Both sides open their stream with these 8 bytes, so a stray peer of another protocol is told apart from a
// zero3 peer with a wrong secret.
inline constexpr std::array<char, 8> kPreamble = {'Z', 'E', 'R', 'O', '3', 'P', 'S', '1'};
inline constexpr std::size_t kNonceBytes = 16;
inline constexpr std::size_t kProofBytes = 32;
inline constexpr std::size_t kTagBytes = 16;
inline constexpr std::size_t kFrameHeaderBytes = 4;  // big-endian length of what follows: type, body, tag

enum class FrameType : std::uint8_t {
  hello = 0x01,     // server -> client: world_size u32, server nonce
  auth = 0x02,      // client -> server: rank u32, client nonce, client proof
  auth_ok = 0x03,   // server -> client: server proof
  publish = 0x10,   // client -> server: the record
  fetch = 0x11,     // client -> server: empty
  failure = 0x12,   // client -> server: the notice
  ack = 0x20,       // server -> client: u8, 1 when the request changed the store
  snapshot = 0x21,  // server -> client: see encode_snapshot
};

inline constexpr std::size_t kHelloBody = 4 + kNonceBytes;
inline constexpr std::size_t kAuthBody = 4 + kNonceBytes + kProofBytes;
inline constexpr std::size_t kAuthOkBody = kProofBytes;
// The longest frame a client may send once authenticated (a record or a notice, with type and tag).
inline constexpr std::size_t kMaxClientFrame =
    1 + (kMaxProgressRecordBytes > kMaxFailureNoticeBytes ? kMaxProgressRecordBytes : kMaxFailureNoticeBytes) +
    kTagBytes;
// The longest snapshot frame a server of `world_size` ranks may send.
std::size_t max_snapshot_frame(std::uint32_t world_size);

using Nonce = std::array<std::byte, kNonceBytes>;
using Proof = std::array<std::byte, kProofBytes>;
using SessionKey = std::array<std::byte, 32>;
using Secret = std::array<std::byte, kProgressSecretBytes>;

// strerror's text, thread-safe (the server thread and the clients' threads report errors concurrently).
std::string errno_text(int err);

// Random bytes from getrandom(2) (or /dev/urandom); throws CommError when neither works.
void fill_random(std::span<std::byte> out);

// What both sides bind into the handshake: nonces, the rank claimed and the world size offered.
struct HandshakeTranscript {
  Nonce server_nonce{};
  Nonce client_nonce{};
  std::uint32_t rank = 0;
  std::uint32_t world_size = 0;
};
// The client's proof that it holds the secret, and the server's; distinct labels, so one is never the other.
Proof client_proof(const Secret& secret, const HandshakeTranscript& t);
Proof server_proof(const Secret& secret, const HandshakeTranscript& t);
SessionKey session_key(const Secret& secret, const HandshakeTranscript& t);

// One direction of an authenticated session: each frame carries a tag over its type, its body and a counter,
// so frames cannot be forged, altered, replayed or reordered without the secret.
struct SessionDirection {
  SessionKey key{};
  char direction = 'C';  // 'C' client to server, 'S' server to client
  std::uint64_t counter = 0;
};

// Appends one frame to `out`; with a session, tags it and advances the counter.
void append_frame(std::vector<std::byte>& out, FrameType type, std::span<const std::byte> body,
                  SessionDirection* session);

// A complete frame parsed from the front of a buffer.
struct Frame {
  std::uint8_t type = 0;
  std::span<const std::byte> body;
  std::size_t consumed = 0;  // header included
};
enum class ParseStatus { need_more, ok, oversize, garbage };
struct ParseResult {
  ParseStatus status = ParseStatus::need_more;
  Frame frame;
};
// Parses the frame at the front of `buffer` whose length field may not exceed `max_frame`; with a session,
// checks and strips the tag (a bad tag is garbage) and advances the counter.
ParseResult parse_frame(std::span<const std::byte> buffer, std::size_t max_frame, SessionDirection* session);

// Big-endian integers, appended and read.
void put_u8(std::vector<std::byte>& out, std::uint8_t v);
void put_u32(std::vector<std::byte>& out, std::uint32_t v);
void put_u64(std::vector<std::byte>& out, std::uint64_t v);
void put_bytes(std::vector<std::byte>& out, std::span<const std::byte> bytes);
void put_text(std::vector<std::byte>& out, std::string_view text);

// Reads from a body; every read fails (ok() false) once the body is too short, and stays failed.
class ByteReader {
 public:
  explicit ByteReader(std::span<const std::byte> bytes) : bytes_(bytes) {}
  std::uint8_t u8();
  std::uint32_t u32();
  std::uint64_t u64();
  std::span<const std::byte> bytes(std::size_t n);
  std::string text(std::size_t n);
  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && offset_ == bytes_.size(); }

 private:
  std::span<const std::byte> bytes_;
  std::size_t offset_ = 0;
  bool ok_ = true;
};

// Snapshot body: world_size u32; per rank flags u8 (1 published, 2 connected), age_ms u64, length u32,
// record; then failure_rank u32 (0xffffffff: none), has_notice u8, length u32, notice.
std::vector<std::byte> encode_snapshot(const ProgressSnapshot& snapshot);
std::optional<ProgressSnapshot> decode_snapshot(std::span<const std::byte> body, std::uint32_t world_size);

}  // namespace zero3::comm::detail
