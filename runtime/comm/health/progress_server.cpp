// ProgressServer: one thread, one poll() over the listener, a wake-up eventfd and every connection. No
// call blocks on a peer: sockets are non-blocking, buffers are bounded per connection, a handshake has a
// deadline, and the connections still in the handshake are capped (the oldest gives way to a new one).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "hmac_sha256.hpp"
#include "progress_protocol.hpp"
#include "progress_store.hpp"
#include "zero3/core/env.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::comm {
namespace {

using Clock = std::chrono::steady_clock;
using detail::errno_text;
using detail::UniqueFd;

constexpr auto kRefusalLogInterval = std::chrono::seconds(5);
constexpr auto kAcceptPauseOnFdExhaustion = std::chrono::milliseconds(100);
constexpr auto kPauseAfterFailure = std::chrono::milliseconds(50);
constexpr int kMaxAcceptsPerWake = 128;
constexpr int kListenBacklog = 512;
// The most a client sends before it has proven the secret: the preamble and one auth frame.
constexpr std::size_t kHandshakeInputBytes =
    detail::kPreamble.size() + detail::kFrameHeaderBytes + 1 + detail::kAuthBody;
constexpr std::size_t kSessionInputBytes = detail::kFrameHeaderBytes + detail::kMaxClientFrame;

// "127.0.0.1:41234" or "[fe80::1]:41234".
std::string describe_address(const sockaddr_storage& addr) {
  char host[INET6_ADDRSTRLEN + 16] = {};
  char port[16] = {};
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return addr.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

bool is_loopback(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr->sa_family == AF_INET6) return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  return true;
}

bool is_wildcard(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) return reinterpret_cast<const sockaddr_in*>(addr)->sin_addr.s_addr == INADDR_ANY;
  if (addr->sa_family == AF_INET6) {
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  }
  return false;
}

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { ::freeaddrinfo(ai); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

std::string numeric_host(const sockaddr* addr, socklen_t length) {
  char host[INET6_ADDRSTRLEN + 16] = {};
  if (::getnameinfo(addr, length, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return {};
  return host;
}

// The first non-loopback address this host's name resolves to, as a numeric string; empty when none.
std::string host_name_address(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(name.c_str(), nullptr, &hints, &found);
  AddrInfoList list(found);
  for (const addrinfo* ai = rc == 0 ? found : nullptr; ai != nullptr; ai = ai->ai_next) {
    if (is_loopback(ai->ai_addr) || is_wildcard(ai->ai_addr)) continue;
    if (std::string host = numeric_host(ai->ai_addr, ai->ai_addrlen); !host.empty()) return host;
  }
  return {};
}

// The first IPv4 address of an interface that is up and not loopback; empty when none.
std::string first_interface_address(std::string& interface_name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string found;
  for (const ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_UP) == 0 ||
        (i->ifa_flags & IFF_LOOPBACK) != 0 || is_loopback(i->ifa_addr)) {
      continue;
    }
    found = numeric_host(i->ifa_addr, sizeof(sockaddr_in));
    interface_name = i->ifa_name;
  }
  ::freeifaddrs(list);
  return found;
}

// This host's address for the other hosts' ranks: its name's first non-loopback address, else (names
// often map to 127.0.1.1 in /etc/hosts) the first interface that is up and not loopback.
std::pair<std::string, std::string> host_interface_address() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) {
    throw CommError(
        fmt::format("progress server: gethostname failed ({}); set {} to an address of this host that every "
                    "rank can reach",
                    errno_text(errno), env::kProgressAddr));
  }
  if (std::string host = host_name_address(name); !host.empty()) {
    return {host, fmt::format("the first non-loopback address of host name '{}'", name)};
  }
  std::string interface_name;
  if (std::string host = first_interface_address(interface_name); !host.empty()) {
    return {host, fmt::format("interface {}, since host name '{}' resolves to no non-loopback address; set "
                              "{} if the other hosts reach this one by another",
                              interface_name, name, env::kProgressAddr)};
  }
  throw CommError(fmt::format(
      "progress server: neither host name '{}' nor any interface that is up has a non-loopback address; set "
      "{} to an address of this host that every rank can reach",
      name, env::kProgressAddr));
}

using EnvLookup = std::function<std::optional<std::string>(std::string_view)>;

EnvLookup environment_or(const EnvLookup& lookup) {
  if (lookup) return lookup;
  return [](std::string_view name) -> std::optional<std::string> { return env::get(name); };
}

struct BindChoice {
  std::string address;
  std::string why;  // for messages: "127.0.0.1 (every rank on this host)"
  std::uint16_t port = 0;
};

BindChoice choose_bind(const ProgressServerOptions& options) {
  const EnvLookup lookup = environment_or(options.env_lookup);
  BindChoice choice;
  if (!options.bind_address.empty()) {
    choice = {options.bind_address, "ProgressServerOptions::bind_address"};
  } else if (options.single_host) {
    choice = {"127.0.0.1", "every rank on this host"};
  } else if (auto addr = lookup(env::kProgressAddr); addr && !addr->empty()) {
    choice = {*addr, std::string(env::kProgressAddr)};
  } else {
    const auto [address, why] = host_interface_address();
    choice = {address, why};
    log::info("progress server: listening on {} ({})", address, why);
  }
  choice.port = options.port;
  if (choice.port == 0) {
    const std::string port = lookup(env::kProgressPort).value_or("");
    if (!port.empty()) {
      unsigned value = 0;
      const char* end_of_text = port.data() + port.size();
      const auto [end, ec] = std::from_chars(port.data(), end_of_text, value);
      if (ec != std::errc() || end != end_of_text || value > 65535) {
        throw ConfigError(fmt::format("{}='{}' is not a port number (0-65535)", env::kProgressPort, port));
      }
      choice.port = std::uint16_t(value);
    }
  }
  return choice;
}

UniqueFd listen_on(const BindChoice& choice, sockaddr_storage& bound) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(choice.port);
  const int rc = ::getaddrinfo(choice.address.c_str(), port.c_str(), &hints, &found);
  AddrInfoList list(found);
  if (rc != 0 || found == nullptr) {
    throw CommError(fmt::format("progress server: '{}' (from {}) is not a numeric IPv4 or IPv6 address: {}",
                                choice.address, choice.why, ::gai_strerror(rc)));
  }
  if (is_wildcard(found->ai_addr)) {
    throw CommError(
        fmt::format("progress server: refusing to listen on the wildcard address '{}' (from {}): name "
                    "the one interface the ranks reach this host by",
                    choice.address, choice.why));
  }
  UniqueFd fd(::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const int one = 1;
  if (!fd || ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
      ::bind(fd.get(), found->ai_addr, found->ai_addrlen) != 0 || ::listen(fd.get(), kListenBacklog) != 0) {
    throw CommError(fmt::format("progress server: cannot listen on {} port {} (from {}): {}", choice.address,
                                choice.port, choice.why, errno_text(errno)));
  }
  socklen_t length = sizeof(bound);
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    throw CommError("progress server: getsockname failed: " + errno_text(errno));
  }
  return fd;
}

enum class Refusal { bad_secret, garbage, oversize, timeout, too_many };

struct Connection {
  UniqueFd fd;
  std::string peer;
  Clock::time_point accepted_at;
  bool preamble_seen = false;
  bool authenticated = false;
  int rank = -1;
  detail::HandshakeTranscript transcript;
  detail::SessionDirection from_client;
  detail::SessionDirection to_client;
  std::vector<std::byte> in;
  std::vector<std::byte> out;
  std::size_t out_sent = 0;
  bool closed() const { return !fd; }
};

}  // namespace

struct ProgressServer::Impl {
  struct RankSlot {
    bool published = false;
    std::string record;
    Clock::time_point received_at;
  };

  ProgressServerOptions options;
  ProgressEndpoint endpoint;
  std::string where;  // "127.0.0.1:41234", for log lines
  UniqueFd listener;
  UniqueFd wake;

  mutable std::mutex stats_mutex;
  ProgressServerStats stats;

  // Server thread only from here on.
  std::vector<RankSlot> slots;
  std::optional<std::string> failure_notice;
  int failure_rank = -1;
  std::vector<std::unique_ptr<Connection>> connections;
  std::vector<Connection*> by_rank;
  Clock::time_point accept_paused_until{};
  std::optional<Clock::time_point> last_refusal_line;
  std::uint64_t refusals_not_logged = 0;

  std::atomic<bool> stopping{false};
  std::thread thread;  // last: started once everything it uses exists

  void serve();
  void serve_once();
  void accept_new(Clock::time_point now);
  void admit(UniqueFd fd, const sockaddr_storage& addr, Clock::time_point now);
  void on_readable(Connection& c);
  void process_input(Connection& c);
  void handle_auth(Connection& c, const detail::Frame& frame);
  void handle_request(Connection& c, const detail::Frame& frame);
  void queue(Connection& c, detail::FrameType type, std::span<const std::byte> body, bool tagged);
  void flush(Connection& c);
  void expire_handshakes(Clock::time_point now);
  int poll_timeout_ms(Clock::time_point now) const;
  ProgressSnapshot snapshot(Clock::time_point now) const;
  void close(Connection& c);
  void refuse(Connection& c, Refusal reason, std::string_view detail);
  void count(std::uint64_t ProgressServerStats::*field) {
    std::lock_guard lock(stats_mutex);
    ++(stats.*field);
  }
};

ProgressServer::ProgressServer(ProgressServerOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  ZERO3_CHECK(options.world_size >= 1, "ProgressServerOptions::world_size must be at least 1");
  ZERO3_CHECK(options.max_unauthenticated >= 1, "ProgressServerOptions::max_unauthenticated must be at least 1");
  ZERO3_CHECK(options.auth_timeout.count() > 0, "ProgressServerOptions::auth_timeout must be positive");
  s.options = std::move(options);
  const BindChoice choice = choose_bind(s.options);
  sockaddr_storage bound{};
  s.listener = listen_on(choice, bound);
  s.where = describe_address(bound);
  char host[INET6_ADDRSTRLEN + 16] = {};
  ::getnameinfo(reinterpret_cast<const sockaddr*>(&bound), sizeof(bound), host, sizeof(host), nullptr, 0,
                NI_NUMERICHOST);
  s.endpoint.host = host;
  s.endpoint.port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                                                : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  detail::fill_random(s.endpoint.secret);
  s.wake = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!s.wake) throw CommError("progress server: eventfd failed: " + errno_text(errno));
  s.slots.resize(std::size_t(s.options.world_size));
  s.by_rank.assign(std::size_t(s.options.world_size), nullptr);
  log::debug("progress server listening on {} ({}) for {} ranks", s.where, choice.why, s.options.world_size);
  s.thread = std::thread([&s] { s.serve(); });
}

ProgressServer::~ProgressServer() {
  Impl& s = *impl_;
  s.stopping.store(true);
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(s.wake.get(), &one, sizeof(one));
  if (s.thread.joinable()) s.thread.join();
  const ProgressServerStats st = stats();
  if (st.refused_total() > 0) {
    log::warn(
        "progress server on {} refused {} connections in all: {} wrong secret, {} not the protocol, {} oversize, {} "
        "handshake timeout, {} over the handshake cap",
        s.where, st.refused_total(), st.refused_bad_secret, st.refused_garbage, st.refused_oversize, st.refused_timeout,
        st.refused_too_many);
  }
}

ProgressEndpoint ProgressServer::endpoint() const {
  return impl_->endpoint;
}

ProgressServerStats ProgressServer::stats() const {
  std::lock_guard lock(impl_->stats_mutex);
  return impl_->stats;
}

void ProgressServer::Impl::serve() {
  while (!stopping.load()) {
    // Nothing a peer sends may end this thread: a failure here is logged and the loop goes on.
    try {
      serve_once();
    } catch (const std::exception& e) {
      log::error("progress server on {}: {} (serving on)", where, e.what());
      std::this_thread::sleep_for(kPauseAfterFailure);  // a failure that repeats must not spin a core
    } catch (...) {
      log::error("progress server on {}: unknown exception (serving on)", where);
      std::this_thread::sleep_for(kPauseAfterFailure);
    }
  }
}

void ProgressServer::Impl::serve_once() {
  const Clock::time_point before = Clock::now();
  std::vector<pollfd> fds;
  std::vector<Connection*> polled;
  fds.push_back({wake.get(), POLLIN, 0});
  const bool accepting = before >= accept_paused_until;
  fds.push_back({accepting ? listener.get() : -1, POLLIN, 0});
  for (const auto& c : connections) {
    // A connection with an answer still to send is not read: one request at a time bounds what it holds.
    const short events = c->out.empty() ? POLLIN : POLLOUT;
    fds.push_back({c->fd.get(), events, 0});
    polled.push_back(c.get());
  }
  const int ready = ::poll(fds.data(), fds.size(), poll_timeout_ms(before));
  if (ready < 0 && errno != EINTR) throw CommError("poll failed: " + errno_text(errno));
  if (fds[0].revents != 0) {
    std::uint64_t drained = 0;
    [[maybe_unused]] const ssize_t n = ::read(wake.get(), &drained, sizeof(drained));
  }
  if (stopping.load()) return;
  for (std::size_t i = 0; i < polled.size(); ++i) {
    Connection& c = *polled[i];
    const short revents = fds[i + 2].revents;
    if (c.closed() || revents == 0) continue;
    if ((revents & POLLOUT) != 0) {
      flush(c);
      // A request may have arrived behind the answer just sent.
      if (!c.closed() && c.out.empty() && !c.in.empty()) process_input(c);
    }
    if (!c.closed() && (revents & (POLLIN | POLLHUP | POLLERR)) != 0 && c.out.empty()) on_readable(c);
  }
  const Clock::time_point now = Clock::now();
  if (accepting && (fds[1].revents & POLLIN) != 0) accept_new(now);
  expire_handshakes(now);
  std::erase_if(connections, [](const std::unique_ptr<Connection>& c) { return c->closed(); });
}

int ProgressServer::Impl::poll_timeout_ms(Clock::time_point now) const {
  Clock::time_point wake_at = now + std::chrono::seconds(1);
  if (now < accept_paused_until) wake_at = std::min(wake_at, accept_paused_until);
  for (const auto& c : connections) {
    if (!c->authenticated) wake_at = std::min(wake_at, c->accepted_at + options.auth_timeout);
  }
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now).count();
  return int(std::clamp<std::int64_t>(ms, 0, 1000));
}

void ProgressServer::Impl::accept_new(Clock::time_point now) {
  for (int i = 0; i < kMaxAcceptsPerWake; ++i) {
    sockaddr_storage addr{};
    socklen_t length = sizeof(addr);
    const int fd = ::accept4(listener.get(), reinterpret_cast<sockaddr*>(&addr), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      admit(UniqueFd(fd), addr, now);
      continue;
    }
    const int err = errno;
    if (err == EAGAIN || err == EWOULDBLOCK) return;
    if (err == EINTR || err == ECONNABORTED || err == EPROTO) continue;
    // Out of descriptors or memory: the listener would stay readable, so stop polling it for a moment
    // instead of spinning; the sessions already open go on.
    accept_paused_until = now + kAcceptPauseOnFdExhaustion;
    log::warn("progress server on {}: accept failed ({}); not accepting for {} ms", where, errno_text(err),
              kAcceptPauseOnFdExhaustion.count());
    return;
  }
}

void ProgressServer::Impl::admit(UniqueFd fd, const sockaddr_storage& addr, Clock::time_point now) {
  count(&ProgressServerStats::accepted);
  const auto in_handshake = [](const std::unique_ptr<Connection>& c) { return !c->closed() && !c->authenticated; };
  if (std::count_if(connections.begin(), connections.end(), in_handshake) >= options.max_unauthenticated) {
    // The one that has shown least of the protocol gives way, oldest first: a flood of silent sockets then
    // cannot push out a rank whose preamble has already arrived.
    Connection* victim = nullptr;
    for (const auto& c : connections) {
      if (!in_handshake(c)) continue;
      if (victim == nullptr ||
          std::pair(c->preamble_seen, c->accepted_at) < std::pair(victim->preamble_seen, victim->accepted_at)) {
        victim = c.get();
      }
    }
    refuse(*victim, Refusal::too_many, "dropped for a newer connection: too many connections in the handshake");
  }
  const int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto c = std::make_unique<Connection>();
  c->fd = std::move(fd);
  c->peer = describe_address(addr);
  c->accepted_at = now;
  c->transcript.world_size = std::uint32_t(options.world_size);
  detail::fill_random(c->transcript.server_nonce);
  c->in.reserve(kHandshakeInputBytes);
  c->out.insert(c->out.end(), reinterpret_cast<const std::byte*>(detail::kPreamble.data()),
                reinterpret_cast<const std::byte*>(detail::kPreamble.data()) + detail::kPreamble.size());
  std::vector<std::byte> hello;
  detail::put_u32(hello, c->transcript.world_size);
  detail::put_bytes(hello, c->transcript.server_nonce);
  queue(*c, detail::FrameType::hello, hello, false);
  connections.push_back(std::move(c));
}

void ProgressServer::Impl::on_readable(Connection& c) {
  const std::size_t capacity = c.authenticated ? kSessionInputBytes : kHandshakeInputBytes;
  const std::size_t held = c.in.size();
  if (held >= capacity) {
    // Unreachable while parse_frame's limit fits the buffer; a guard, so memory can never grow.
    refuse(c, Refusal::oversize, "input buffer full");
    return;
  }
  c.in.resize(capacity);
  const ssize_t n = ::recv(c.fd.get(), c.in.data() + held, capacity - held, 0);
  c.in.resize(held + std::size_t(std::max<ssize_t>(n, 0)));
  if (n > 0) {
    process_input(c);
    return;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (c.authenticated) {
    log::debug("progress server on {}: rank {} disconnected", where, c.rank);
  } else {
    refuse(c, Refusal::garbage, n == 0 ? "closed during the handshake" : errno_text(errno));
    return;
  }
  close(c);
}

void ProgressServer::Impl::process_input(Connection& c) {
  if (!c.preamble_seen) {
    const std::size_t seen = std::min(c.in.size(), detail::kPreamble.size());
    if (std::memcmp(c.in.data(), detail::kPreamble.data(), seen) != 0) {
      refuse(c, Refusal::garbage, "not the zero3 progress protocol");
      return;
    }
    if (seen < detail::kPreamble.size()) return;
    c.in.erase(c.in.begin(), c.in.begin() + std::ptrdiff_t(seen));
    c.preamble_seen = true;
  }
  while (!c.closed() && c.out.empty()) {
    const std::size_t max_frame = c.authenticated ? detail::kMaxClientFrame : 1 + detail::kAuthBody;
    const detail::ParseResult r = detail::parse_frame(c.in, max_frame, c.authenticated ? &c.from_client : nullptr);
    if (r.status == detail::ParseStatus::need_more) return;
    if (r.status == detail::ParseStatus::oversize) {
      refuse(c, Refusal::oversize, fmt::format("a frame longer than the {} bytes allowed", max_frame));
      return;
    }
    if (r.status == detail::ParseStatus::garbage) {
      refuse(c, Refusal::garbage, c.authenticated ? "a frame with a bad tag" : "a malformed frame");
      return;
    }
    if (c.authenticated) {
      handle_request(c, r.frame);
    } else {
      handle_auth(c, r.frame);
    }
    if (!c.closed()) c.in.erase(c.in.begin(), c.in.begin() + std::ptrdiff_t(r.frame.consumed));
  }
}

void ProgressServer::Impl::handle_auth(Connection& c, const detail::Frame& frame) {
  if (frame.type != std::uint8_t(detail::FrameType::auth) || frame.body.size() != detail::kAuthBody) {
    refuse(c, Refusal::garbage, "expected the auth frame");
    return;
  }
  detail::ByteReader body(frame.body);
  const std::uint32_t rank = body.u32();
  const auto client_nonce = body.bytes(detail::kNonceBytes);
  const auto proof = body.bytes(detail::kProofBytes);
  std::copy(client_nonce.begin(), client_nonce.end(), c.transcript.client_nonce.begin());
  c.transcript.rank = rank;
  const detail::Proof expected = detail::client_proof(endpoint.secret, c.transcript);
  // The proof is checked whatever the rank, so the answer's timing does not tell ranks apart.
  const bool proven = detail::equal_constant_time(expected, proof);
  if (!proven || rank >= std::uint32_t(options.world_size)) {
    refuse(c, Refusal::bad_secret,
           proven ? fmt::format("claims rank {} of {}", rank, options.world_size) : "wrong secret");
    return;
  }
  count(&ProgressServerStats::authenticated);
  c.authenticated = true;
  c.rank = int(rank);
  const detail::SessionKey key = detail::session_key(endpoint.secret, c.transcript);
  c.from_client = {key, 'C', 0};
  c.to_client = {key, 'S', 0};
  if (Connection* previous = by_rank[rank]; previous != nullptr && previous != &c) {
    // The rank reconnected (its client gave up on the old connection after a timeout).
    count(&ProgressServerStats::replaced);
    close(*previous);
  }
  by_rank[rank] = &c;
  log::debug("progress server on {}: rank {} authenticated from {}", where, rank, c.peer);
  const detail::Proof answer = detail::server_proof(endpoint.secret, c.transcript);
  queue(c, detail::FrameType::auth_ok, answer, false);
}

void ProgressServer::Impl::handle_request(Connection& c, const detail::Frame& frame) {
  count(&ProgressServerStats::requests);
  const auto text = [&] { return std::string(reinterpret_cast<const char*>(frame.body.data()), frame.body.size()); };
  const std::byte changed{1};
  const std::byte unchanged{0};
  switch (detail::FrameType(frame.type)) {
    case detail::FrameType::publish: {
      if (frame.body.size() > kMaxProgressRecordBytes) break;
      RankSlot& slot = slots[std::size_t(c.rank)];
      slot = {true, text(), Clock::now()};
      queue(c, detail::FrameType::ack, std::span(&changed, 1), true);
      return;
    }
    case detail::FrameType::fetch: {
      if (!frame.body.empty()) break;
      queue(c, detail::FrameType::snapshot, detail::encode_snapshot(snapshot(Clock::now())), true);
      return;
    }
    case detail::FrameType::failure: {
      if (frame.body.size() > kMaxFailureNoticeBytes) break;
      const bool first = !failure_notice.has_value();
      if (first) {
        failure_notice = text();
        failure_rank = c.rank;
        log::debug("progress server on {}: rank {} posted the failure notice", where, c.rank);
      }
      queue(c, detail::FrameType::ack, std::span(first ? &changed : &unchanged, 1), true);
      return;
    }
    default:
      break;
  }
  log::warn("progress server on {}: rank {} sent a request of type {} with {} bytes; closing its connection", where,
            c.rank, frame.type, frame.body.size());
  close(c);
}

ProgressSnapshot ProgressServer::Impl::snapshot(Clock::time_point now) const {
  ProgressSnapshot out;
  out.ranks.resize(slots.size());
  for (std::size_t r = 0; r < slots.size(); ++r) {
    out.ranks[r].published = slots[r].published;
    out.ranks[r].connected = by_rank[r] != nullptr;
    if (slots[r].published) {
      out.ranks[r].record = slots[r].record;
      out.ranks[r].age_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - slots[r].received_at).count();
    }
  }
  out.failure_notice = failure_notice;
  out.failure_rank = failure_rank;
  return out;
}

void ProgressServer::Impl::queue(Connection& c, detail::FrameType type, std::span<const std::byte> body, bool tagged) {
  detail::append_frame(c.out, type, body, tagged ? &c.to_client : nullptr);
  flush(c);
}

void ProgressServer::Impl::flush(Connection& c) {
  while (!c.closed() && c.out_sent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_sent += std::size_t(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;
    } else if (!(n < 0 && errno == EINTR)) {
      log::debug("progress server on {}: send to {} failed: {}", where, c.peer, errno_text(errno));
      close(c);
      return;
    }
  }
  c.out.clear();
  c.out_sent = 0;
}

void ProgressServer::Impl::expire_handshakes(Clock::time_point now) {
  for (const auto& c : connections) {
    if (!c->closed() && !c->authenticated && now - c->accepted_at >= options.auth_timeout) {
      refuse(*c, Refusal::timeout, fmt::format("no proof of the secret within {} ms", options.auth_timeout.count()));
    }
  }
}

void ProgressServer::Impl::close(Connection& c) {
  if (c.authenticated && by_rank[std::size_t(c.rank)] == &c) by_rank[std::size_t(c.rank)] = nullptr;
  c.fd.reset();
}

void ProgressServer::Impl::refuse(Connection& c, Refusal reason, std::string_view detail) {
  static constexpr std::uint64_t ProgressServerStats::*kCounter[] = {
      &ProgressServerStats::refused_bad_secret, &ProgressServerStats::refused_garbage,
      &ProgressServerStats::refused_oversize, &ProgressServerStats::refused_timeout,
      &ProgressServerStats::refused_too_many};
  count(kCounter[int(reason)]);
  close(c);
  // At most one line per interval, however fast the refusals come; the line says how many it stands for.
  const Clock::time_point now = Clock::now();
  if (last_refusal_line && now - *last_refusal_line < kRefusalLogInterval) {
    ++refusals_not_logged;
    return;
  }
  const std::string more =
      refusals_not_logged > 0 ? fmt::format(" ({} more refused since the last report)", refusals_not_logged) : "";
  log::warn("progress server on {}: refused the connection from {}: {}{}", where, c.peer, detail, more);
  last_refusal_line = now;
  refusals_not_logged = 0;
}

}  // namespace zero3::comm
