// ProgressClient: blocking calls built from non-blocking sockets and poll(), each bounded by one deadline.
// Any failure closes the connection, so a late answer can never be taken for the next call's; the next call
// connects and authenticates again.
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "hmac_sha256.hpp"
#include "progress_protocol.hpp"
#include "progress_store.hpp"
#include "zero3/core/error.hpp"

namespace zero3::comm {
namespace {

using Clock = std::chrono::steady_clock;
using detail::UniqueFd;

// Why a step failed; `connection_lost` marks failures a fresh connection may fix within the same call.
struct Failure {
  std::string what;
  bool connection_lost = false;
};

}  // namespace

struct ProgressClient::Impl {
  ProgressEndpoint endpoint;
  int rank = 0;
  std::chrono::milliseconds timeout{0};
  std::string last_error;

  UniqueFd fd;
  std::uint32_t world_size = 0;
  detail::SessionDirection to_server;
  detail::SessionDirection from_server;
  std::vector<std::byte> frame;  // the last frame received, header included

  std::string where() const { return fmt::format("progress server {}:{}", endpoint.host, endpoint.port); }

  bool call(detail::FrameType type, std::span<const std::byte> body, detail::FrameType reply_type,
            std::vector<std::byte>& reply);
  std::optional<Failure> connect_and_authenticate(Clock::time_point deadline);
  std::optional<Failure> open_socket(Clock::time_point deadline);
  std::optional<Failure> exchange(detail::FrameType type, std::span<const std::byte> body, detail::FrameType reply_type,
                                  std::vector<std::byte>& reply, Clock::time_point deadline);
  std::optional<Failure> wait_for(short events, Clock::time_point deadline);
  std::optional<Failure> send_all(std::span<const std::byte> bytes, Clock::time_point deadline);
  std::optional<Failure> recv_exact(std::byte* out, std::size_t n, Clock::time_point deadline);
  std::optional<Failure> recv_frame(std::size_t max_frame, detail::SessionDirection* session, detail::Frame& parsed,
                                    Clock::time_point deadline);
};

ProgressClient::ProgressClient(ProgressEndpoint endpoint, int rank, std::chrono::milliseconds timeout)
    : impl_(std::make_unique<Impl>()) {
  ZERO3_CHECK(rank >= 0, "ProgressClient: rank must not be negative");
  ZERO3_CHECK(timeout.count() > 0, "ProgressClient: timeout must be positive");
  impl_->endpoint = std::move(endpoint);
  impl_->rank = rank;
  impl_->timeout = timeout;
}

ProgressClient::~ProgressClient() = default;

const std::string& ProgressClient::last_error() const {
  return impl_->last_error;
}

bool ProgressClient::connect() {
  if (impl_->fd) return true;
  const Clock::time_point deadline = Clock::now() + impl_->timeout;
  std::optional<Failure> failure;
  try {
    failure = impl_->connect_and_authenticate(deadline);
  } catch (const std::exception& e) {
    failure = Failure{e.what()};
  }
  if (!failure) {
    impl_->last_error.clear();
    return true;
  }
  impl_->fd.reset();
  impl_->last_error = failure->what;
  return false;
}

bool ProgressClient::publish(std::string_view record) {
  if (record.size() > kMaxProgressRecordBytes) {
    throw UsageError(fmt::format("ProgressClient::publish on rank {}: record of {} bytes is over the {} allowed",
                                 impl_->rank, record.size(), kMaxProgressRecordBytes));
  }
  std::vector<std::byte> reply;
  return impl_->call(detail::FrameType::publish, std::as_bytes(std::span(record.data(), record.size())),
                     detail::FrameType::ack, reply);
}

std::optional<ProgressSnapshot> ProgressClient::fetch() {
  std::vector<std::byte> reply;
  if (!impl_->call(detail::FrameType::fetch, {}, detail::FrameType::snapshot, reply)) return std::nullopt;
  auto snapshot = detail::decode_snapshot(reply, impl_->world_size);
  if (!snapshot) {
    impl_->last_error = impl_->where() + " sent a malformed snapshot";
    impl_->fd.reset();
  }
  return snapshot;
}

bool ProgressClient::post_failure(std::string_view notice) {
  if (notice.size() > kMaxFailureNoticeBytes) {
    throw UsageError(fmt::format("ProgressClient::post_failure on rank {}: notice of {} bytes is over the {} allowed",
                                 impl_->rank, notice.size(), kMaxFailureNoticeBytes));
  }
  std::vector<std::byte> reply;
  return impl_->call(detail::FrameType::failure, std::as_bytes(std::span(notice.data(), notice.size())),
                     detail::FrameType::ack, reply);
}

bool ProgressClient::Impl::call(detail::FrameType type, std::span<const std::byte> body, detail::FrameType reply_type,
                                std::vector<std::byte>& reply) {
  const Clock::time_point deadline = Clock::now() + timeout;
  std::optional<Failure> failure;
  try {
    // A kept connection may have died since the last call (the server replaced or dropped it): one fresh
    // connection is tried within the same deadline before giving up.
    for (int attempt = 0; attempt < 2; ++attempt) {
      const bool reused = bool(fd);
      failure = reused ? std::nullopt : connect_and_authenticate(deadline);
      if (!failure) failure = exchange(type, body, reply_type, reply, deadline);
      if (!failure) {
        last_error.clear();
        return true;
      }
      fd.reset();
      if (!reused || !failure->connection_lost || Clock::now() >= deadline) break;
    }
  } catch (const std::exception& e) {
    failure = Failure{e.what()};
  }
  fd.reset();
  last_error = failure ? failure->what : "unknown failure";
  return false;
}

std::optional<Failure> ProgressClient::Impl::open_socket(Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(endpoint.port);
  const int rc = ::getaddrinfo(endpoint.host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) return Failure{where() + ": not a numeric address: " + ::gai_strerror(rc)};
  fd = UniqueFd(::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const int connect_rc = fd ? ::connect(fd.get(), found->ai_addr, found->ai_addrlen) : -1;
  const int connect_errno = errno;
  ::freeaddrinfo(found);
  if (!fd) return Failure{where() + ": socket failed: " + detail::errno_text(connect_errno)};
  if (connect_rc != 0 && connect_errno != EINPROGRESS) {
    return Failure{"connect to " + where() + ": " + detail::errno_text(connect_errno)};
  }
  if (connect_rc != 0) {
    if (auto f = wait_for(POLLOUT, deadline)) return f;
    int err = 0;
    socklen_t length = sizeof(err);
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &length) != 0) err = errno;
    if (err != 0) return Failure{"connect to " + where() + ": " + detail::errno_text(err)};
  }
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return std::nullopt;
}

std::optional<Failure> ProgressClient::Impl::connect_and_authenticate(Clock::time_point deadline) {
  if (auto f = open_socket(deadline)) return f;
  if (auto f = send_all(std::as_bytes(std::span(detail::kPreamble)), deadline)) return f;
  std::array<std::byte, detail::kPreamble.size()> preamble{};
  if (auto f = recv_exact(preamble.data(), preamble.size(), deadline)) return f;
  if (std::memcmp(preamble.data(), detail::kPreamble.data(), preamble.size()) != 0) {
    return Failure{where() + " does not speak the zero3 progress protocol"};
  }
  detail::Frame hello;
  if (auto f = recv_frame(1 + detail::kHelloBody, nullptr, hello, deadline)) return f;
  if (hello.type != std::uint8_t(detail::FrameType::hello) || hello.body.size() != detail::kHelloBody) {
    return Failure{where() + " sent a malformed hello"};
  }
  detail::ByteReader in(hello.body);
  detail::HandshakeTranscript t;
  t.world_size = in.u32();
  const auto server_nonce = in.bytes(detail::kNonceBytes);
  std::copy(server_nonce.begin(), server_nonce.end(), t.server_nonce.begin());
  if (std::uint32_t(rank) >= t.world_size) {
    return Failure{fmt::format("{} serves {} ranks; this is rank {}", where(), t.world_size, rank)};
  }
  t.rank = std::uint32_t(rank);
  detail::fill_random(t.client_nonce);
  std::vector<std::byte> auth_body;
  detail::put_u32(auth_body, t.rank);
  detail::put_bytes(auth_body, t.client_nonce);
  detail::put_bytes(auth_body, detail::client_proof(endpoint.secret, t));
  std::vector<std::byte> out;
  detail::append_frame(out, detail::FrameType::auth, auth_body, nullptr);
  if (auto f = send_all(out, deadline)) return f;
  detail::Frame auth_ok;
  if (auto f = recv_frame(1 + detail::kAuthOkBody, nullptr, auth_ok, deadline)) {
    if (f->connection_lost) f->what += " (the server refused the handshake: is the secret this job's?)";
    f->connection_lost = false;
    return f;
  }
  const detail::Proof expected = detail::server_proof(endpoint.secret, t);
  if (auth_ok.type != std::uint8_t(detail::FrameType::auth_ok) ||
      !detail::equal_constant_time(expected, auth_ok.body)) {
    return Failure{where() + " did not prove that it holds the job's secret"};
  }
  world_size = t.world_size;
  const detail::SessionKey key = detail::session_key(endpoint.secret, t);
  to_server = {key, 'C', 0};
  from_server = {key, 'S', 0};
  return std::nullopt;
}

std::optional<Failure> ProgressClient::Impl::exchange(detail::FrameType type, std::span<const std::byte> body,
                                                      detail::FrameType reply_type, std::vector<std::byte>& reply,
                                                      Clock::time_point deadline) {
  std::vector<std::byte> out;
  detail::append_frame(out, type, body, &to_server);
  if (auto f = send_all(out, deadline)) return f;
  const std::size_t max_frame =
      reply_type == detail::FrameType::snapshot ? detail::max_snapshot_frame(world_size) : 1 + 1 + detail::kTagBytes;
  detail::Frame answer;
  if (auto f = recv_frame(max_frame, &from_server, answer, deadline)) return f;
  if (answer.type != std::uint8_t(reply_type)) {
    return Failure{
        fmt::format("{} answered with frame type {} instead of {}", where(), answer.type, std::uint8_t(reply_type))};
  }
  reply.assign(answer.body.begin(), answer.body.end());
  return std::nullopt;
}

std::optional<Failure> ProgressClient::Impl::wait_for(short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Failure{fmt::format("no answer from {} within {} ms", where(), timeout.count())};
    pollfd p{fd.get(), events, 0};
    const int ready = ::poll(&p, 1, int(std::min<std::int64_t>(left, 60'000)));
    if (ready > 0) return std::nullopt;  // errors and hang-ups show in the read or write that follows
    if (ready < 0 && errno != EINTR) return Failure{where() + ": poll failed: " + detail::errno_text(errno)};
  }
}

std::optional<Failure> ProgressClient::Impl::send_all(std::span<const std::byte> bytes, Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd.get(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += std::size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (auto f = wait_for(POLLOUT, deadline)) return f;
      continue;
    }
    return Failure{"send to " + where() + ": " + detail::errno_text(errno), true};
  }
  return std::nullopt;
}

std::optional<Failure> ProgressClient::Impl::recv_exact(std::byte* out, std::size_t n, Clock::time_point deadline) {
  std::size_t received = 0;
  while (received < n) {
    const ssize_t got = ::recv(fd.get(), out + received, n - received, 0);
    if (got > 0) {
      received += std::size_t(got);
      continue;
    }
    if (got == 0) return Failure{where() + " closed the connection", true};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (auto f = wait_for(POLLIN, deadline)) return f;
      continue;
    }
    return Failure{"receive from " + where() + ": " + detail::errno_text(errno), true};
  }
  return std::nullopt;
}

std::optional<Failure> ProgressClient::Impl::recv_frame(std::size_t max_frame, detail::SessionDirection* session,
                                                        detail::Frame& parsed, Clock::time_point deadline) {
  frame.resize(detail::kFrameHeaderBytes);
  if (auto f = recv_exact(frame.data(), frame.size(), deadline)) return f;
  const std::uint32_t length = detail::ByteReader(frame).u32();
  if (length > max_frame) {
    return Failure{fmt::format("{} sent a frame of {} bytes, over the {} expected", where(), length, max_frame)};
  }
  frame.resize(detail::kFrameHeaderBytes + length);
  if (auto f = recv_exact(frame.data() + detail::kFrameHeaderBytes, length, deadline)) return f;
  const detail::ParseResult r = detail::parse_frame(frame, max_frame, session);
  if (r.status != detail::ParseStatus::ok) return Failure{where() + " sent a malformed or forged frame"};
  parsed = r.frame;
  return std::nullopt;
}

}  // namespace zero3::comm
