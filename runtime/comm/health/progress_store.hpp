// The out-of-band progress channel: a small authenticated TCP store on rank 0 that every rank tells what it
// last did, so that a rank stuck in a collective can still learn what the others were doing.
// ProgressServer (rank 0 only) serves from a thread of its own and keeps answering while rank 0's main thread
// is stuck. ProgressClient (every rank, rank 0 too) holds one connection and is used from one thread; every
// call is bounded by its timeout and never throws on network trouble. Protocol and security: docs/comm.md.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace zero3::comm {

class Bootstrap;

inline constexpr std::size_t kProgressSecretBytes = 32;
// Bounds of what a client may send: one rank's record and the job's failure notice.
inline constexpr std::size_t kMaxProgressRecordBytes = 4096;
inline constexpr std::size_t kMaxFailureNoticeBytes = 4096;

// Where the server listens and the per-job secret that opens it. Travels from rank 0 to every rank through
// the launcher's bootstrap (see share_progress_endpoint); whoever holds it can publish as any rank.
struct ProgressEndpoint {
  std::string host;  // a numeric IPv4 or IPv6 address
  std::uint16_t port = 0;
  std::array<std::byte, kProgressSecretBytes> secret{};

  // Fixed size (kWireBytes), so that every rank can pass a buffer of the right size to Bootstrap::broadcast
  // before it knows the endpoint.
  static constexpr std::size_t kWireBytes = 128;
  std::vector<std::byte> to_bytes() const;
  // Throws CommError when `bytes` is not kWireBytes long or does not hold an endpoint.
  static ProgressEndpoint from_bytes(std::span<const std::byte> bytes);
};

struct ProgressServerOptions {
  int world_size = 1;  // ranks 0 .. world_size-1 may authenticate
  // Every rank runs on this host (World::local_size == World::size): bind 127.0.0.1. Otherwise bind the
  // address named by ZERO3_PROGRESS_ADDR, else the first non-loopback address of this host's name, else
  // the first IPv4 address of an interface that is up and not loopback (logged).
  bool single_host = true;
  // Overrides the choice above (tests); a numeric address. The wildcard (0.0.0.0, ::) is refused.
  std::string bind_address;
  std::uint16_t port = 0;  // 0: an ephemeral port (ZERO3_PROGRESS_PORT overrides)
  // A connection that has not proven the secret within this long is closed.
  std::chrono::milliseconds auth_timeout{2000};
  // Connections still in the handshake; when full, one is dropped for each new one: first those that have
  // not sent the protocol's preamble, oldest first. Authenticated connections are never dropped for this.
  int max_unauthenticated = 64;
  // Environment seam (tests pass a map); empty: the process environment.
  std::function<std::optional<std::string>(std::string_view name)> env_lookup;
};

// Counters since the server started. A connection is counted once as accepted, and then at most once as
// authenticated or under one refusal reason.
struct ProgressServerStats {
  std::uint64_t accepted = 0;
  std::uint64_t authenticated = 0;
  std::uint64_t refused_bad_secret = 0;  // wrong MAC, or a rank outside [0, world_size)
  // Not the protocol: a wrong preamble, frame type or length, a bad frame tag, or a hang-up in the handshake.
  std::uint64_t refused_garbage = 0;
  std::uint64_t refused_oversize = 0;  // a frame length above the limit
  std::uint64_t refused_timeout = 0;   // no proof of the secret within auth_timeout
  std::uint64_t refused_too_many = 0;  // dropped to make room under max_unauthenticated
  std::uint64_t replaced = 0;          // an authenticated connection replaced by a newer one of its rank
  std::uint64_t requests = 0;          // publish, fetch and failure requests served
  std::uint64_t refused_total() const {
    return refused_bad_secret + refused_garbage + refused_oversize + refused_timeout + refused_too_many;
  }
};

// Listens on construction (CommError naming the address when it finds none or cannot bind; ConfigError for
// a ZERO3_PROGRESS_PORT that is not a port) and serves until destroyed; destruction wakes the server thread
// and returns promptly. Methods may be called from any thread. Refusals are logged as warnings, at most one
// line per few seconds, with counts of what was suppressed.
class ProgressServer {
 public:
  explicit ProgressServer(ProgressServerOptions options);
  ~ProgressServer();
  ProgressServer(const ProgressServer&) = delete;
  ProgressServer& operator=(const ProgressServer&) = delete;

  ProgressEndpoint endpoint() const;  // bound address, port, and the secret drawn from getrandom
  ProgressServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct RankProgress {
  bool published = false;   // false: this rank never published since the server started
  bool connected = false;   // this rank holds an authenticated connection now
  std::string record;       // its latest record, as published
  std::int64_t age_ms = 0;  // since the server received that record (rank 0's clock only)
};

struct ProgressSnapshot {
  std::vector<RankProgress> ranks;            // indexed by rank, world_size entries
  std::optional<std::string> failure_notice;  // the first notice posted, if any
  int failure_rank = -1;                      // the rank that posted it
};

// One connection to the server, opened on first use and reopened on the next call after any failure.
// Each call blocks for at most `timeout` (connect, handshake, request and answer together) and reports
// failure by its result, never by throwing, so a watchdog can call it while the job is falling apart.
// Not thread-safe: use it from one thread.
class ProgressClient {
 public:
  // Throws UsageError when rank is negative or timeout is not positive. Does not connect.
  ProgressClient(ProgressEndpoint endpoint, int rank, std::chrono::milliseconds timeout);
  ~ProgressClient();
  ProgressClient(const ProgressClient&) = delete;
  ProgressClient& operator=(const ProgressClient&) = delete;

  // Opens the session now, so that later calls need no handshake (call it at start-up, before anything can
  // go wrong). Returns whether the server answered within the timeout; a kept session is reused.
  bool connect();
  // Replaces this rank's record (opaque text, e.g. a JSON object). Throws UsageError when the record is
  // over kMaxProgressRecordBytes. Returns whether the server stored it within the timeout.
  bool publish(std::string_view record);
  // Every rank's latest record; nullopt when the server did not answer within the timeout.
  std::optional<ProgressSnapshot> fetch();
  // Sets the job-wide failure notice unless one is set already (the first one wins). Throws UsageError
  // when over kMaxFailureNoticeBytes. Returns whether the server answered within the timeout.
  bool post_failure(std::string_view notice);

  // Why the last call failed ("connect to 10.0.0.1:41234: connection refused", "no answer within 2000
  // ms"); empty after a success.
  const std::string& last_error() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Collective over the bootstrap's ranks: rank 0 passes its server's endpoint, the others nullptr; every
// rank returns rank 0's endpoint.
ProgressEndpoint share_progress_endpoint(Bootstrap& bootstrap, const ProgressServer* server);

}  // namespace zero3::comm
