// The out-of-band progress store: SHA-256 and HMAC-SHA-256 against their published vectors; publish, fetch
// and the failure notice among client threads; hostile peers (wrong secret, garbage, oversize lengths, silent
// connections, a flood) refused and counted while legitimate clients go on; a server that is gone or stopped
// makes every call return within its timeout.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "hmac_sha256.hpp"
#include "progress_protocol.hpp"
#include "progress_store.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/core/error.hpp"

using namespace std::chrono_literals;
using Catch::Matchers::Contains;
using zero3::comm::ProgressClient;
using zero3::comm::ProgressEndpoint;
using zero3::comm::ProgressServer;
using zero3::comm::ProgressServerOptions;
using zero3::comm::ProgressServerStats;
using zero3::comm::ProgressSnapshot;
using zero3::comm::detail::UniqueFd;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<std::byte> bytes_of(std::string_view text) {
  const auto s = std::as_bytes(std::span(text.data(), text.size()));
  return {s.begin(), s.end()};
}

std::vector<std::byte> repeated(std::uint8_t value, std::size_t n) {
  return std::vector<std::byte>(n, std::byte{value});
}

std::string hex(std::span<const std::byte> bytes) {
  std::string out;
  for (std::byte b : bytes) out += fmt::format("{:02x}", std::uint8_t(b));
  return out;
}

ProgressServerOptions local_options(int world_size) {
  ProgressServerOptions o;
  o.world_size = world_size;
  o.single_host = true;
  o.env_lookup = [](std::string_view) { return std::optional<std::string>(); };
  return o;
}

// Waits until `done()` holds or `limit` passes; returns done().
template <typename Pred>
bool eventually(Pred done, std::chrono::milliseconds limit = 5000ms) {
  const auto until = Clock::now() + limit;
  while (!done() && Clock::now() < until) std::this_thread::sleep_for(5ms);
  return done();
}

// A plain blocking socket to the server, with a receive timeout so a test can never hang on it.
UniqueFd raw_connect(const ProgressEndpoint& e, std::chrono::milliseconds recv_timeout = 5000ms) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  REQUIRE(fd);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(e.port);
  REQUIRE(::inet_pton(AF_INET, e.host.c_str(), &addr.sin_addr) == 1);
  REQUIRE(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  timeval tv{};
  tv.tv_sec = recv_timeout.count() / 1000;
  tv.tv_usec = (recv_timeout.count() % 1000) * 1000;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  return fd;
}

void send_raw(const UniqueFd& fd, std::span<const std::byte> bytes) {
  REQUIRE(::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size()));
}

std::vector<std::byte> preamble() {
  const auto p = std::as_bytes(std::span(zero3::comm::detail::kPreamble));
  return {p.begin(), p.end()};
}

// Reads until the server closes the connection (true) or the receive timeout passes (false).
bool closed_by_server(const UniqueFd& fd) {
  std::array<char, 512> sink;
  for (;;) {
    const ssize_t n = ::recv(fd.get(), sink.data(), sink.size(), 0);
    if (n == 0) return true;
    if (n < 0) return errno == ECONNRESET;
  }
}

// Runs a raw handshake up to the auth frame with the given secret and rank; returns the socket.
struct RawSession {
  UniqueFd fd;
  zero3::comm::detail::HandshakeTranscript transcript;
};

RawSession raw_authenticate(const ProgressEndpoint& e, const zero3::comm::detail::Secret& secret, std::uint32_t rank) {
  namespace d = zero3::comm::detail;
  UniqueFd fd = raw_connect(e);
  send_raw(fd, preamble());
  std::array<std::byte, 8 + 4 + 1 + d::kHelloBody> hello;
  REQUIRE(::recv(fd.get(), hello.data(), hello.size(), MSG_WAITALL) == ssize_t(hello.size()));
  d::ByteReader in(std::span<const std::byte>(hello).subspan(8 + 4 + 1));
  d::HandshakeTranscript t;
  t.world_size = in.u32();
  const auto nonce = in.bytes(d::kNonceBytes);
  std::copy(nonce.begin(), nonce.end(), t.server_nonce.begin());
  t.rank = rank;
  d::fill_random(t.client_nonce);
  std::vector<std::byte> body;
  d::put_u32(body, rank);
  d::put_bytes(body, t.client_nonce);
  d::put_bytes(body, d::client_proof(secret, t));
  std::vector<std::byte> frame;
  d::append_frame(frame, d::FrameType::auth, body, nullptr);
  send_raw(fd, frame);
  return {std::move(fd), t};
}

// Receives one tagged frame of the session; returns its type, or -1 when the server closed the connection.
int raw_receive(const UniqueFd& fd, zero3::comm::detail::SessionDirection& from_server) {
  namespace d = zero3::comm::detail;
  std::vector<std::byte> frame(d::kFrameHeaderBytes);
  if (::recv(fd.get(), frame.data(), frame.size(), MSG_WAITALL) != ssize_t(frame.size())) return -1;
  const std::uint32_t length = d::ByteReader(frame).u32();
  REQUIRE(length < 1'000'000);
  frame.resize(d::kFrameHeaderBytes + length);
  if (::recv(fd.get(), frame.data() + 4, length, MSG_WAITALL) != ssize_t(length)) return -1;
  const d::ParseResult r = d::parse_frame(frame, length, &from_server);
  REQUIRE(r.status == d::ParseStatus::ok);
  return r.frame.type;
}

}  // namespace

TEST_CASE("SHA-256 gives the FIPS 180-2 example digests", "[progress][sha256]") {
  using zero3::comm::detail::sha256;
  CHECK(hex(sha256(bytes_of("abc"))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(hex(sha256(bytes_of(""))) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(hex(sha256(bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(hex(sha256(bytes_of("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlm"
                            "nopqrsmnopqrstnopqrstu"))) ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(hex(sha256(repeated('a', 1000000))) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("SHA-256 fed in random pieces equals SHA-256 of the whole", "[progress][sha256]") {
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<std::byte> message(std::uniform_int_distribution<std::size_t>(0, 700)(rng));
    for (auto& b : message) b = std::byte(rng() & 0xff);
    zero3::comm::detail::Sha256 pieces;
    std::size_t at = 0;
    while (at < message.size()) {
      const std::size_t n = std::min(message.size() - at, std::uniform_int_distribution<std::size_t>(0, 130)(rng));
      pieces.update(std::span(message).subspan(at, n));
      at += n;
    }
    CHECK(pieces.finish() == zero3::comm::detail::sha256(message));
  }
}

TEST_CASE("HMAC-SHA-256 gives the RFC 4231 test vectors", "[progress][hmac]") {
  using zero3::comm::detail::hmac_sha256;
  std::vector<std::byte> key_1_to_25;
  for (int i = 1; i <= 25; ++i) key_1_to_25.push_back(std::byte(i));
  // Test cases 1-4, 5 (compared on its first 128 bits, as the RFC truncates it), 6 and 7.
  CHECK(hex(hmac_sha256(repeated(0x0b, 20), bytes_of("Hi There"))) ==
        "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  CHECK(hex(hmac_sha256(bytes_of("Jefe"), bytes_of("what do ya want for nothing?"))) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(hex(hmac_sha256(repeated(0xaa, 20), repeated(0xdd, 50))) ==
        "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
  CHECK(hex(hmac_sha256(key_1_to_25, repeated(0xcd, 50))) ==
        "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
  CHECK(hex(hmac_sha256(repeated(0x0c, 20), bytes_of("Test With Truncation"))).substr(0, 32) ==
        "a3b6167473100ee06e0c796c2955552b");
  CHECK(hex(hmac_sha256(repeated(0xaa, 131), bytes_of("Test Using Larger Than Block-Size Key - Hash Key First"))) ==
        "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
  CHECK(hex(hmac_sha256(repeated(0xaa, 131),
                        bytes_of("This is a test using a larger than block-size key and a larger than block-size data. "
                                 "The key needs to be hashed before being used by the HMAC algorithm."))) ==
        "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST_CASE("an endpoint survives its fixed-size bytes; other bytes are refused", "[progress][endpoint]") {
  ProgressEndpoint e;
  e.host = "fe80::1234:5678:9abc:def0";
  e.port = 40123;
  for (std::size_t i = 0; i < e.secret.size(); ++i) e.secret[i] = std::byte(i * 7 + 3);
  const auto bytes = e.to_bytes();
  REQUIRE(bytes.size() == ProgressEndpoint::kWireBytes);
  const ProgressEndpoint back = ProgressEndpoint::from_bytes(bytes);
  CHECK(back.host == e.host);
  CHECK(back.port == e.port);
  CHECK(back.secret == e.secret);
  CHECK_THROWS_AS(ProgressEndpoint::from_bytes(std::vector<std::byte>(ProgressEndpoint::kWireBytes)), zero3::CommError);
  CHECK_THROWS_AS(ProgressEndpoint::from_bytes(std::span(bytes).first(20)), zero3::CommError);
}

namespace {
// A bootstrap of one rank among `size`, whose broadcast delivers `root_bytes` (what rank 0 would send).
class FakeBootstrap : public zero3::comm::Bootstrap {
 public:
  FakeBootstrap(int rank, int size, std::vector<std::byte> root_bytes)
      : rank_(rank), size_(size), root_bytes_(std::move(root_bytes)) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void broadcast(std::vector<std::byte>& bytes, int root) override {
    REQUIRE(root == 0);
    REQUIRE(bytes.size() == ProgressEndpoint::kWireBytes);
    if (rank_ != 0) bytes = root_bytes_;
    broadcasts_++;
  }
  std::vector<std::byte> all_gather(const std::vector<std::byte>&) override { return {}; }
  void barrier() override {}
  int broadcasts_ = 0;

 private:
  int rank_;
  int size_;
  std::vector<std::byte> root_bytes_;
};
}  // namespace

TEST_CASE("rank 0's endpoint reaches every rank through the bootstrap", "[progress][endpoint]") {
  ProgressServer server(local_options(2));
  FakeBootstrap root(0, 2, {});
  const ProgressEndpoint on_root = zero3::comm::share_progress_endpoint(root, &server);
  CHECK(root.broadcasts_ == 1);
  FakeBootstrap other(1, 2, server.endpoint().to_bytes());
  const ProgressEndpoint on_other = zero3::comm::share_progress_endpoint(other, nullptr);
  for (const ProgressEndpoint& e : {on_root, on_other}) {
    CHECK(e.host == server.endpoint().host);
    CHECK(e.port == server.endpoint().port);
    CHECK(e.secret == server.endpoint().secret);
  }
  ProgressClient client(on_other, 1, 2000ms);
  CHECK(client.publish("through the bootstrap"));
  // Rank 0 without a server: every rank gets the same error instead of a hang.
  FakeBootstrap root_without(0, 2, {});
  CHECK_THROWS_AS(zero3::comm::share_progress_endpoint(root_without, nullptr), zero3::CommError);
  FakeBootstrap other_without(1, 2, std::vector<std::byte>(ProgressEndpoint::kWireBytes));
  CHECK_THROWS_AS(zero3::comm::share_progress_endpoint(other_without, nullptr), zero3::CommError);
}

TEST_CASE("the server binds loopback for one host, the named address otherwise, never the wildcard",
          "[progress][bind]") {
  {
    ProgressServer server(local_options(1));
    CHECK(server.endpoint().host == "127.0.0.1");
    CHECK(server.endpoint().port != 0);
  }
  {
    auto o = local_options(1);
    o.single_host = false;
    o.env_lookup = [](std::string_view name) {
      return name == "ZERO3_PROGRESS_ADDR" ? std::optional<std::string>("127.0.0.1") : std::nullopt;
    };
    CHECK(ProgressServer(o).endpoint().host == "127.0.0.1");
  }
  {
    auto o = local_options(1);
    o.bind_address = "0.0.0.0";
    CHECK_THROWS_WITH(ProgressServer(o), Contains("wildcard"));
    o.bind_address = "::";
    CHECK_THROWS_WITH(ProgressServer(o), Contains("wildcard"));
  }
  {
    auto o = local_options(1);
    o.env_lookup = [](std::string_view name) {
      return name == "ZERO3_PROGRESS_PORT" ? std::optional<std::string>("70000") : std::nullopt;
    };
    CHECK_THROWS_AS(ProgressServer(o), zero3::ConfigError);
  }
  {
    // Across hosts without ZERO3_PROGRESS_ADDR: an address of this host other ranks can reach (not
    // loopback, not the wildcard), or an error that names the variable.
    auto o = local_options(1);
    o.single_host = false;
    try {
      ProgressServer server(o);
      const std::string host = server.endpoint().host;
      ProgressClient client(server.endpoint(), 0, 2000ms);
      CHECK(client.publish("over " + host));
      CHECK(host != "0.0.0.0");
      CHECK(host.rfind("127.", 0) != 0);
      CHECK(host != "::1");
    } catch (const zero3::CommError& e) {
      CHECK_THAT(e.what(), Contains("ZERO3_PROGRESS_ADDR"));
    }
  }
}

TEST_CASE("ranks publish from their own threads and every rank fetches every rank's latest record",
          "[progress][store]") {
  constexpr int kWorld = 5;  // rank 4 never publishes
  constexpr int kRounds = 50;
  ProgressServer server(local_options(kWorld));
  std::vector<std::thread> ranks;
  std::atomic<int> failures{0};
  for (int r = 0; r < kWorld - 1; ++r) {
    ranks.emplace_back([&, r] {
      ProgressClient client(server.endpoint(), r, 2000ms);
      for (int i = 0; i < kRounds; ++i) {
        if (!client.publish(fmt::format(R"({{"rank":{},"seq":{}}})", r, i))) ++failures;
        const auto snap = client.fetch();
        if (!snap || snap->ranks.size() != kWorld ||
            snap->ranks[r].record != fmt::format(R"({{"rank":{},"seq":{}}})", r, i)) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : ranks) t.join();
  CHECK(failures.load() == 0);
  ProgressClient observer(server.endpoint(), kWorld - 1, 2000ms);
  const auto snap = observer.fetch();
  REQUIRE(snap);
  REQUIRE(snap->ranks.size() == kWorld);
  for (int r = 0; r < kWorld - 1; ++r) {
    CHECK(snap->ranks[r].published);
    CHECK_FALSE(snap->ranks[r].connected);  // their clients are gone
    CHECK(snap->ranks[r].record == fmt::format(R"({{"rank":{},"seq":{}}})", r, kRounds - 1));
    CHECK(snap->ranks[r].age_ms >= 0);
    CHECK(snap->ranks[r].age_ms < 60'000);
  }
  CHECK_FALSE(snap->ranks[kWorld - 1].published);
  CHECK(snap->ranks[kWorld - 1].connected);
  CHECK(snap->ranks[kWorld - 1].record.empty());
  CHECK_FALSE(snap->failure_notice);
  const ProgressServerStats st = server.stats();
  CHECK(st.authenticated == kWorld);
  CHECK(st.refused_total() == 0);
  CHECK(st.requests == std::uint64_t((kWorld - 1) * kRounds * 2 + 1));
}

TEST_CASE("a record's age grows while its rank is silent", "[progress][store]") {
  ProgressServer server(local_options(2));
  ProgressClient a(server.endpoint(), 0, 2000ms);
  ProgressClient b(server.endpoint(), 1, 2000ms);
  REQUIRE(a.publish("entered all_gather #3"));
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(250ms);
  const auto snap = b.fetch();
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
  REQUIRE(snap);
  CHECK(snap->ranks[0].age_ms >= 250);
  CHECK(snap->ranks[0].age_ms <= waited + 50);
}

TEST_CASE("the first failure notice wins and every rank sees it with the rank that posted it", "[progress][store]") {
  ProgressServer server(local_options(3));
  ProgressClient r0(server.endpoint(), 0, 2000ms);
  ProgressClient r1(server.endpoint(), 1, 2000ms);
  ProgressClient r2(server.endpoint(), 2, 2000ms);
  REQUIRE(r0.fetch());
  CHECK_FALSE(r0.fetch()->failure_notice);
  REQUIRE(r2.post_failure("rank 2: all_gather #1234 timed out after 20 s"));
  REQUIRE(r1.post_failure("rank 1: reduce_scatter #1235 timed out"));
  for (ProgressClient* c : {&r0, &r1, &r2}) {
    const auto snap = c->fetch();
    REQUIRE(snap);
    REQUIRE(snap->failure_notice);
    CHECK(*snap->failure_notice == "rank 2: all_gather #1234 timed out after 20 s");
    CHECK(snap->failure_rank == 2);
  }
  CHECK_THROWS_AS(r0.post_failure(std::string(zero3::comm::kMaxFailureNoticeBytes + 1, 'x')), zero3::UsageError);
  CHECK_THROWS_AS(r0.publish(std::string(zero3::comm::kMaxProgressRecordBytes + 1, 'x')), zero3::UsageError);
  CHECK(r0.publish(std::string(zero3::comm::kMaxProgressRecordBytes, 'x')));
  CHECK(r1.fetch()->ranks[0].record == std::string(zero3::comm::kMaxProgressRecordBytes, 'x'));
}

TEST_CASE("a client with the wrong secret is refused and counted; the job's clients are not disturbed",
          "[progress][security]") {
  ProgressServer server(local_options(2));
  ProgressClient good(server.endpoint(), 0, 2000ms);
  REQUIRE(good.publish("step 1"));
  ProgressEndpoint forged = server.endpoint();
  forged.secret[7] ^= std::byte{0x01};
  ProgressClient bad(forged, 1, 1000ms);
  CHECK_FALSE(bad.publish("step 666"));
  CHECK_THAT(bad.last_error(), Contains("secret"));
  CHECK_FALSE(bad.fetch());
  CHECK(eventually([&] { return server.stats().refused_bad_secret == 2; }));
  const auto snap = good.fetch();
  REQUIRE(snap);
  CHECK(snap->ranks[0].record == "step 1");
  CHECK_FALSE(snap->ranks[1].published);
  CHECK(server.stats().authenticated == 1);
}

TEST_CASE("a correct proof for a rank outside the world is refused", "[progress][security]") {
  ProgressServer server(local_options(2));
  const RawSession session = raw_authenticate(server.endpoint(), server.endpoint().secret, 9);
  CHECK(closed_by_server(session.fd));
  CHECK(eventually([&] { return server.stats().refused_bad_secret == 1; }));
  CHECK(server.stats().authenticated == 0);
}

TEST_CASE("on an open session, a forged, replayed or unknown frame closes the connection", "[progress][security]") {
  namespace d = zero3::comm::detail;
  ProgressServer server(local_options(2));
  const auto secret = server.endpoint().secret;
  const auto open_session = [&](d::SessionDirection& to_server, d::SessionDirection& from_server) {
    RawSession s = raw_authenticate(server.endpoint(), secret, 1);
    std::array<std::byte, 4 + 1 + d::kAuthOkBody> auth_ok;
    REQUIRE(::recv(s.fd.get(), auth_ok.data(), auth_ok.size(), MSG_WAITALL) == ssize_t(auth_ok.size()));
    const d::Proof expected = d::server_proof(secret, s.transcript);
    REQUIRE(std::equal(expected.begin(), expected.end(), auth_ok.begin() + 5));
    to_server = {d::session_key(secret, s.transcript), 'C', 0};
    from_server = {d::session_key(secret, s.transcript), 'S', 0};
    return std::move(s.fd);
  };
  const auto record = bytes_of("step 3");
  {
    // The harness speaks the protocol: a rightly tagged publish is acknowledged.
    d::SessionDirection to_server, from_server;
    const UniqueFd fd = open_session(to_server, from_server);
    std::vector<std::byte> frame;
    d::append_frame(frame, d::FrameType::publish, record, &to_server);
    send_raw(fd, frame);
    CHECK(raw_receive(fd, from_server) == int(d::FrameType::ack));
    // The same bytes again: the counter has moved on, so the tag no longer fits.
    send_raw(fd, frame);
    CHECK(raw_receive(fd, from_server) == -1);
  }
  {
    d::SessionDirection to_server, from_server;
    const UniqueFd fd = open_session(to_server, from_server);
    d::SessionDirection forger = to_server;
    forger.key[0] ^= std::byte{1};
    std::vector<std::byte> frame;
    d::append_frame(frame, d::FrameType::publish, bytes_of("forged"), &forger);
    send_raw(fd, frame);
    CHECK(raw_receive(fd, from_server) == -1);
  }
  {
    d::SessionDirection to_server, from_server;
    const UniqueFd fd = open_session(to_server, from_server);
    std::vector<std::byte> frame;
    d::append_frame(frame, d::FrameType(0x7f), record, &to_server);
    send_raw(fd, frame);
    CHECK(raw_receive(fd, from_server) == -1);
  }
  CHECK(eventually([&] { return server.stats().refused_garbage == 2; }));  // replay and forgery
  ProgressClient observer(server.endpoint(), 0, 2000ms);
  const auto snap = observer.fetch();
  REQUIRE(snap);
  CHECK(snap->ranks[1].record == "step 3");
}

TEST_CASE("random bytes from many connections never stop the server", "[progress][security]") {
  namespace d = zero3::comm::detail;
  ProgressServer server(local_options(2));
  ProgressClient good(server.endpoint(), 0, 2000ms);
  REQUIRE(good.connect());
  std::mt19937 rng(std::random_device{}());
  constexpr int kPeers = 120;
  for (int i = 0; i < kPeers; ++i) {
    const UniqueFd fd = raw_connect(server.endpoint());
    std::vector<std::byte> out;
    if (i % 2 == 0) out = preamble();  // half get past the preamble, so the framing sees the noise
    if (i % 4 == 0) d::put_u32(out, std::uniform_int_distribution<std::uint32_t>(0, 80)(rng));
    const std::size_t noise = std::uniform_int_distribution<std::size_t>(1, 300)(rng);
    for (std::size_t k = 0; k < noise; ++k) out.push_back(std::byte(rng() & 0xff));
    ::send(fd.get(), out.data(), out.size(), MSG_NOSIGNAL);
    if (i % 10 == 0) REQUIRE(good.publish(fmt::format("after {} noisy peers", i)));
  }
  CHECK(eventually([&] { return server.stats().refused_total() == kPeers; }));
  CHECK(server.stats().authenticated == 1);
  const auto snap = good.fetch();
  REQUIRE(snap);
  CHECK(snap->ranks[0].record == "after 110 noisy peers");
}

TEST_CASE("a client refuses a server that cannot prove the secret", "[progress][security]") {
  namespace d = zero3::comm::detail;
  // An impostor: speaks the protocol, answers the handshake with a made-up proof.
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(listener.get(), 4) == 0);
  socklen_t length = sizeof(addr);
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &length);
  std::thread impostor([&] {
    UniqueFd c(::accept(listener.get(), nullptr, nullptr));
    std::vector<std::byte> out = preamble();
    std::vector<std::byte> hello;
    d::put_u32(hello, 2);
    d::put_bytes(hello, repeated(0x42, d::kNonceBytes));
    d::append_frame(out, d::FrameType::hello, hello, nullptr);
    ::send(c.get(), out.data(), out.size(), MSG_NOSIGNAL);
    std::array<std::byte, 8 + 4 + 1 + d::kAuthBody> auth;
    ::recv(c.get(), auth.data(), auth.size(), MSG_WAITALL);
    out.clear();
    d::append_frame(out, d::FrameType::auth_ok, repeated(0x17, d::kProofBytes), nullptr);
    ::send(c.get(), out.data(), out.size(), MSG_NOSIGNAL);
    std::this_thread::sleep_for(200ms);
  });
  ProgressEndpoint e;
  e.host = "127.0.0.1";
  e.port = ntohs(addr.sin_port);
  d::fill_random(e.secret);
  ProgressClient client(e, 0, 2000ms);
  CHECK_FALSE(client.publish("step 1"));
  CHECK_THAT(client.last_error(), Contains("did not prove"));
  impostor.join();
}

TEST_CASE("garbage bytes, a 4 GB length and a bad frame tag are refused and counted", "[progress][security]") {
  namespace d = zero3::comm::detail;
  ProgressServer server(local_options(2));
  ProgressClient good(server.endpoint(), 0, 2000ms);
  REQUIRE(good.publish("step 1"));
  {
    const UniqueFd fd = raw_connect(server.endpoint());
    send_raw(fd, bytes_of("GET / HTTP/1.1\r\nHost: rank0\r\n\r\n"));
    CHECK(closed_by_server(fd));
    CHECK(eventually([&] { return server.stats().refused_garbage == 1; }));
  }
  {
    const UniqueFd fd = raw_connect(server.endpoint());
    std::vector<std::byte> out = preamble();
    d::put_u32(out, 0xffffffffu);
    send_raw(fd, out);
    CHECK(closed_by_server(fd));
    CHECK(eventually([&] { return server.stats().refused_oversize == 1; }));
  }
  {
    // The right preamble, then random bytes where the auth frame belongs.
    const UniqueFd fd = raw_connect(server.endpoint());
    std::vector<std::byte> out = preamble();
    d::put_u32(out, 1 + d::kAuthBody);
    std::mt19937 rng(std::random_device{}());
    for (std::size_t i = 0; i < 1 + d::kAuthBody; ++i) out.push_back(std::byte(rng() & 0xff));
    out[12] = std::byte(d::FrameType::auth);
    send_raw(fd, out);
    CHECK(closed_by_server(fd));
    CHECK(eventually([&] { return server.stats().refused_bad_secret == 1; }));
  }
  CHECK(server.stats().authenticated == 1);
  const auto snap = good.fetch();
  REQUIRE(snap);
  CHECK(snap->ranks[0].record == "step 1");
}

TEST_CASE("a connection that sends nothing is dropped at the handshake deadline", "[progress][security]") {
  auto o = local_options(2);
  o.auth_timeout = 300ms;
  ProgressServer server(o);
  ProgressClient good(server.endpoint(), 0, 2000ms);
  REQUIRE(good.publish("step 1"));
  const auto start = Clock::now();
  const UniqueFd silent = raw_connect(server.endpoint());
  const UniqueFd trickle = raw_connect(server.endpoint());
  const auto start_of_preamble = preamble();
  send_raw(trickle, std::span(start_of_preamble).first(5));  // a slow start that never finishes
  CHECK(closed_by_server(silent));
  CHECK(closed_by_server(trickle));
  const auto took = Clock::now() - start;
  CHECK(took >= 300ms);
  CHECK(took < 300ms + 3s);
  CHECK(eventually([&] { return server.stats().refused_timeout == 2; }));
  CHECK(good.publish("step 2"));  // the authenticated connection has no such deadline
}

TEST_CASE("a flood of 300 connections is refused while the job's clients publish and fetch without a miss",
          "[progress][security][flood]") {
  constexpr int kWorld = 4;
  constexpr int kFlood = 300;
  // The log lines go to a file for the length of the flood, to count them.
  char log_path[] = "/tmp/zero3-progress-flood-XXXXXX";
  const int log_fd = ::mkstemp(log_path);
  REQUIRE(log_fd >= 0);
  const int saved_stderr = ::dup(STDERR_FILENO);
  ::dup2(log_fd, STDERR_FILENO);
  std::uint64_t calls_failed = 0;
  std::uint64_t calls_made = 0;
  std::string late_client_error;
  ProgressServerStats st;
  {
    ProgressServer server(local_options(kWorld));
    std::atomic<bool> flooding{true};
    std::vector<std::thread> ranks;
    std::atomic<std::uint64_t> failed{0};
    std::atomic<std::uint64_t> made{0};
    std::atomic<int> connected{0};
    for (int r = 0; r < kWorld - 1; ++r) {
      ranks.emplace_back([&, r] {
        ProgressClient client(server.endpoint(), r, 2000ms);
        if (!client.connect()) ++failed;
        ++connected;
        for (int i = 0; flooding.load() || i < 20; ++i) {
          made += 2;
          if (!client.publish(fmt::format("rank {} step {}", r, i))) ++failed;
          const auto snap = client.fetch();
          if (!snap || snap->ranks[r].record != fmt::format("rank {} step {}", r, i)) ++failed;
        }
      });
    }
    // The ranks hold their sessions before the flood, as a job's ranks do from start-up.
    REQUIRE(eventually([&] { return connected.load() == kWorld - 1; }));
    std::vector<UniqueFd> flood;
    std::mt19937 rng(std::random_device{}());
    for (int i = 0; i < kFlood; ++i) {
      UniqueFd fd = raw_connect(server.endpoint());
      if (i % 3 == 1) {
        std::vector<std::byte> junk(64);
        for (auto& b : junk) b = std::byte(rng() & 0xff);
        ::send(fd.get(), junk.data(), junk.size(), MSG_NOSIGNAL);
      } else if (i % 3 == 2) {
        const auto p = preamble();
        ::send(fd.get(), p.data(), p.size(), MSG_NOSIGNAL);
      }
      flood.push_back(std::move(fd));
    }
    // With the handshake slots full of idle connections, a rank that connects now still gets in.
    ProgressClient late(server.endpoint(), kWorld - 1, 2000ms);
    if (!late.publish("late rank")) late_client_error = late.last_error();
    std::this_thread::sleep_for(300ms);
    flooding = false;
    for (auto& t : ranks) t.join();
    flood.clear();
    calls_failed = failed.load();
    calls_made = made.load();
    eventually([&] { return server.stats().refused_total() >= std::uint64_t(kFlood); });
    st = server.stats();
  }
  ::fflush(stderr);
  ::dup2(saved_stderr, STDERR_FILENO);
  ::close(saved_stderr);
  ::close(log_fd);
  std::ifstream log_in(log_path);
  int refusal_lines = 0;
  for (std::string line; std::getline(log_in, line);) refusal_lines += line.find("refused") != std::string::npos;
  std::remove(log_path);

  CHECK(calls_made >= std::uint64_t((kWorld - 1) * 40));
  CHECK(calls_failed == 0);
  CHECK(late_client_error.empty());
  CHECK(st.accepted == std::uint64_t(kFlood + kWorld));
  CHECK(st.authenticated == std::uint64_t(kWorld));
  CHECK(st.refused_total() == std::uint64_t(kFlood));
  // A third of the flood sends junk (refused at once); the other two thirds sit in the handshake, where all
  // but the newest max_unauthenticated give way to newer connections.
  CHECK(st.refused_too_many >= 100);
  CHECK(st.refused_garbage >= 50);
  // Rate-limited: the first refusal, perhaps one more, and the closing summary; not one line per connection.
  CHECK(refusal_lines >= 2);
  CHECK(refusal_lines <= 4);
}

TEST_CASE("a newer connection of a rank replaces the older; the older client reconnects on its next call",
          "[progress][store]") {
  ProgressServer server(local_options(2));
  ProgressClient first(server.endpoint(), 1, 2000ms);
  REQUIRE(first.publish("from the first client"));
  ProgressClient second(server.endpoint(), 1, 2000ms);
  REQUIRE(second.publish("from the second client"));
  CHECK(eventually([&] { return server.stats().replaced == 1; }));
  REQUIRE(first.publish("from the first client again"));
  CHECK(eventually([&] { return server.stats().replaced == 2; }));
  ProgressClient observer(server.endpoint(), 0, 2000ms);
  const auto snap = observer.fetch();
  REQUIRE(snap);
  CHECK(snap->ranks[1].record == "from the first client again");
  CHECK(snap->ranks[1].connected);
  CHECK(server.stats().refused_total() == 0);
}

TEST_CASE("a server that is gone makes every call fail within the timeout", "[progress][timeout]") {
  constexpr auto kTimeout = 300ms;
  auto server = std::make_unique<ProgressServer>(local_options(2));
  const ProgressEndpoint e = server->endpoint();
  ProgressClient client(e, 0, kTimeout);
  REQUIRE(client.publish("step 1"));
  const auto destroying = Clock::now();
  server.reset();
  // The server thread sleeps in poll() for up to a second when idle; the wake-up makes destruction prompt.
  CHECK(Clock::now() - destroying < 900ms);
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    CHECK_FALSE(client.fetch());
    CHECK_FALSE(client.publish("step 2"));
    CHECK(Clock::now() - start < 2 * kTimeout + 2s);
    CHECK_FALSE(client.last_error().empty());
  }
}

TEST_CASE("a listener that never answers makes every call fail within the timeout", "[progress][timeout]") {
  constexpr auto kTimeout = 300ms;
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(listener.get(), 4) == 0);  // connections complete in the kernel; nobody reads them
  socklen_t length = sizeof(addr);
  ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &length);
  ProgressEndpoint e;
  e.host = "127.0.0.1";
  e.port = ntohs(addr.sin_port);
  ProgressClient client(e, 0, kTimeout);
  const auto start = Clock::now();
  CHECK_FALSE(client.fetch());
  const auto took = Clock::now() - start;
  CHECK(took >= kTimeout - 10ms);
  CHECK(took < kTimeout + 2s);
  CHECK_THAT(client.last_error(), Contains("within 300 ms"));
}

TEST_CASE("a stopped server process (SIGSTOP) makes fetch fail within the timeout; it answers again once continued",
          "[progress][timeout]") {
  constexpr auto kTimeout = 400ms;
  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  // The server runs in a child process, so that stopping it stops its serving thread as SIGSTOP would stop
  // rank 0. Forked while this process runs no other thread.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    int status = 1;
    try {
      ProgressServer server(local_options(2));
      const auto bytes = server.endpoint().to_bytes();
      if (::write(pipe_fds[1], bytes.data(), bytes.size()) == ssize_t(bytes.size())) {
        for (;;) ::pause();
      }
    } catch (...) {
    }
    ::_exit(status);
  }
  ::close(pipe_fds[1]);
  std::vector<std::byte> bytes(ProgressEndpoint::kWireBytes);
  const ssize_t got = ::read(pipe_fds[0], bytes.data(), bytes.size());
  ::close(pipe_fds[0]);
  const auto stop_child = [&] {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  };
  if (got != ssize_t(bytes.size())) stop_child();
  REQUIRE(got == ssize_t(bytes.size()));
  const ProgressEndpoint e = ProgressEndpoint::from_bytes(bytes);
  ProgressClient client(e, 1, kTimeout);
  const bool published = client.publish("step 7");
  ::kill(child, SIGSTOP);
  ::waitpid(child, nullptr, WUNTRACED);  // returns once the child has stopped
  const auto start = Clock::now();
  const auto while_stopped = client.fetch();
  const auto took = Clock::now() - start;
  const bool published_while_stopped = client.publish("step 8");
  ::kill(child, SIGCONT);
  ::waitpid(child, nullptr, WCONTINUED);
  const auto after = client.fetch();
  stop_child();
  CHECK(published);
  CHECK_FALSE(while_stopped);
  CHECK(took < kTimeout + 2s);
  CHECK_FALSE(published_while_stopped);
  REQUIRE(after);
  CHECK(after->ranks[1].record == "step 7");
}
