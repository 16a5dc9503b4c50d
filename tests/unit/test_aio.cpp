// Direct asynchronous file I/O (zero3/offload/aio.hpp) on this machine's disk, in a scratch directory under
// $TMPDIR: round trips through io_uring and the forced pread/pwrite threads at several queue depths, many
// tickets in flight, the UsageErrors, a file truncated under the queue, a missing directory, a full disk
// (a file size limit in a child process), and check_nvme_path's refusals.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "scratch_dir.hpp"
#include "zero3/core/error.hpp"
#include "zero3/offload/aio.hpp"

using namespace zero3;
using namespace zero3::offload;

namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = kKiB * 1024;
const std::string kKey = "zero_optimization.offload_optimizer.nvme_path";

// Bytes that differ from block to block and seed to seed (splitmix64), so a misplaced block shows.
void fill(AlignedBuffer& buf, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9e3779b97f4a7c15ULL;
  for (std::size_t i = 0; i + 8 <= buf.size(); i += 8) {
    x += 0x9e3779b97f4a7c15ULL;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    std::memcpy(buf.data() + i, &z, 8);
  }
}

bool same(const AlignedBuffer& a, const AlignedBuffer& b, std::size_t bytes) {
  return std::memcmp(a.data(), b.data(), bytes) == 0;
}

AioOptions options(std::size_t block, int depth, bool force_threads, int threads = 2) {
  AioOptions o;
  o.block_size = block;
  o.queue_depth = depth;
  o.intra_op_parallelism = threads;
  o.force_threads = force_threads;
  return o;
}

// The message of the IoError (or ConfigError) `f` throws; fails the test when it throws nothing.
template <typename Exception, typename F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Exception& e) {
    return e.what();
  }
  FAIL("expected an exception");
  return "";
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

void check_backend(const AioQueue& q, bool force_threads) {
  INFO(q.backend());
  if (force_threads) {
    CHECK(q.backend() == "pread/pwrite threads (io_uring: not used (AioOptions::force_threads))");
  } else if (q.backend() != "io_uring") {
    // A container whose seccomp profile forbids io_uring: the fallback is what runs, and is still tested.
    WARN("io_uring is not usable here; the queue runs on " << q.backend());
    CHECK(q.backend().rfind("pread/pwrite threads (io_uring: ", 0) == 0);
  }
}

}  // namespace

TEST_CASE("AlignedBuffer: aligned, zero-filled, rounded up, movable") {
  AlignedBuffer b(5000);
  CHECK(b.size() == 8192);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % kDirectAlign == 0);
  CHECK(std::all_of(b.data(), b.data() + b.size(), [](std::byte x) { return x == std::byte{0}; }));
  AlignedBuffer moved(std::move(b));
  CHECK(moved.size() == 8192);
  // NOLINTNEXTLINE(bugprone-use-after-move,clang-analyzer-cplusplus.Move): the moved-from state is the contract
  CHECK(b.data() == nullptr);
  CHECK(AlignedBuffer(0).data() == nullptr);
  CHECK(direct_align_up(1) == kDirectAlign);
  CHECK(direct_align_up(kDirectAlign) == kDirectAlign);
}

TEST_CASE("round trips of several MiB in block-sized requests, on io_uring and on the threads") {
  test::ScratchDir dir;
  const std::size_t bytes = 6 * kMiB + 12 * kKiB;  // not a multiple of the block: the last request is short
  AlignedBuffer source(bytes);
  fill(source, 1);
  for (const bool force_threads : {false, true}) {
    for (const int depth : {2, 4, 8}) {
      INFO("force_threads " << force_threads << ", queue_depth " << depth);
      AioQueue q(options(256 * kKiB, depth, force_threads));
      check_backend(q, force_threads);
      DirectFile f =
          DirectFile::create((dir / ("rt" + std::to_string(depth) + std::to_string(force_threads))).string(), bytes);
      CHECK(f.size() == bytes);
      q.wait(q.write(f, 0, source.data(), bytes));
      AlignedBuffer back(bytes);
      q.wait(q.read(f, 0, back.data(), bytes));
      CHECK(same(back, source, bytes));
    }
  }
  SECTION("written by one backend, read by the other, and io_uring's batch modes") {
    const std::string path = (dir / "cross").string();
    DirectFile f = DirectFile::create(path, bytes);
    AioOptions batch = options(128 * kKiB, 4, false);
    batch.overlap_events = false;
    AioQueue uring(batch);
    uring.wait(uring.write(f, 0, source.data(), bytes));
    AioQueue threads(options(128 * kKiB, 4, true, 3));
    AlignedBuffer back(bytes);
    threads.wait(threads.read(f, 0, back.data(), bytes));
    CHECK(same(back, source, bytes));

    AlignedBuffer other(bytes);
    fill(other, 2);
    threads.wait(threads.write(f, 0, other.data(), bytes));
    AioOptions single = options(64 * kKiB, 3, false);
    single.single_submit = true;
    AioQueue uring_single(single);
    uring_single.wait(uring_single.read(f, 0, back.data(), bytes));
    CHECK(same(back, other, bytes));
  }
}

TEST_CASE("many tickets in flight, then waited in order") {
  test::ScratchDir dir;
  constexpr int kTickets = 64;
  constexpr std::size_t kEach = 64 * kKiB;
  const std::size_t bytes = kTickets * kEach;
  AlignedBuffer source(bytes);
  fill(source, 3);
  for (const bool force_threads : {false, true}) {
    INFO("force_threads " << force_threads);
    DirectFile f = DirectFile::create((dir / ("many" + std::to_string(force_threads))).string(), bytes);
    AioQueue q(options(16 * kKiB, 4, force_threads));
    std::vector<AioQueue::Ticket> writes;
    writes.reserve(kTickets);
    for (int i = 0; i < kTickets; ++i) writes.push_back(q.write(f, i * kEach, source.data() + i * kEach, kEach));
    for (std::size_t i = 1; i < writes.size(); ++i) CHECK(writes[i] == writes[i - 1] + 1);
    for (const AioQueue::Ticket t : writes) q.wait(t);

    AlignedBuffer back(bytes);
    std::vector<AioQueue::Ticket> reads;
    reads.reserve(kTickets);
    // Backwards through the file, so that the blocks complete in no particular order of tickets.
    for (int i = kTickets - 1; i >= 0; --i) reads.push_back(q.read(f, i * kEach, back.data() + i * kEach, kEach));
    q.wait(reads[kTickets / 2]);  // the earlier ones are complete too, and waiting for them returns at once
    for (const AioQueue::Ticket t : reads) q.wait(t);
    CHECK(same(back, source, bytes));
    q.wait_all();  // nothing left: returns at once
    CHECK_THROWS_AS(q.wait(reads.back() + 1), UsageError);
  }
}

TEST_CASE("misalignment, reads past the reservation and bad options are UsageErrors") {
  test::ScratchDir dir;
  DirectFile f = DirectFile::create((dir / "usage").string(), 64 * kKiB);
  AioQueue q(options(16 * kKiB, 2, false));
  AlignedBuffer buf(128 * kKiB);
  CHECK_THROWS_AS(q.read(f, 512, buf.data(), 4096), UsageError);
  CHECK_THROWS_AS(q.read(f, 0, buf.data(), 1000), UsageError);
  CHECK_THROWS_AS(q.write(f, 0, buf.data() + 512, 4096), UsageError);
  const std::string past = message_of<UsageError>([&] { q.read(f, 60 * kKiB, buf.data(), 8 * kKiB); });
  CHECK(contains(past, f.path()));
  CHECK(contains(past, "65536 bytes reserved"));
  CHECK_THROWS_AS(q.read(DirectFile(), 0, buf.data(), 4096), UsageError);
  q.wait(q.read(f, 0, buf.data(), 64 * kKiB));  // the whole reservation is fine, and so is nothing
  q.wait(q.read(f, 64 * kKiB, buf.data(), 0));
  CHECK_THROWS_AS(AioQueue(options(1000, 2, false)), UsageError);
  CHECK_THROWS_AS(AioQueue(options(0, 2, false)), UsageError);
  CHECK_THROWS_AS(AioQueue(options(4096, 0, false)), UsageError);
  CHECK_THROWS_AS(AioQueue(options(4096, 2, true, 0)), UsageError);
}

TEST_CASE("reading a region truncated under the queue is an IoError naming the file and the offset") {
  test::ScratchDir dir;
  const std::size_t bytes = 8 * kMiB;
  AlignedBuffer source(bytes);
  fill(source, 4);
  for (const bool force_threads : {false, true}) {
    INFO("force_threads " << force_threads);
    const std::string path = (dir / ("trunc" + std::to_string(force_threads))).string();
    DirectFile f = DirectFile::create(path, bytes);
    AioQueue q(options(kMiB, 4, force_threads));
    q.wait(q.write(f, 0, source.data(), bytes));
    AlignedBuffer back(bytes);

    // Three blocks into the fifth request: that one comes back short, is retried for its remainder and gets
    // 0 bytes (end of file); the later requests get 0 at once. The first by offset is reported.
    REQUIRE(::ftruncate(f.fd(), static_cast<off_t>(4 * kMiB + 12 * kKiB)) == 0);
    std::string message = message_of<IoError>([&] { q.wait(q.read(f, 0, back.data(), bytes)); });
    INFO(message);
    CHECK(contains(message, path));
    CHECK(contains(message, "byte offset 4194304 "));
    CHECK(contains(message, "short read: got 12288 of 1048576 bytes"));

    // The queue stays usable, and what is left of the file is intact.
    q.wait(q.read(f, 0, back.data(), 4 * kMiB));
    CHECK(same(back, source, 4 * kMiB));

    // Truncated through the path, at a block boundary: the request at the boundary gets nothing at all.
    REQUIRE(::truncate(path.c_str(), static_cast<off_t>(2 * kMiB)) == 0);
    message = message_of<IoError>([&] { q.wait(q.read(f, 2 * kMiB, back.data(), kMiB)); });
    CHECK(contains(message, path));
    CHECK(contains(message, "byte offset 2097152 "));
    CHECK(contains(message, "short read: got 0 of 1048576 bytes"));
  }
}

TEST_CASE("DirectFile: a missing directory names the path; reserve grows and never shrinks") {
  test::ScratchDir dir;
  const std::string missing = (dir / "no-such-dir" / "master.f32").string();
  const std::string message = message_of<IoError>([&] { (void)DirectFile::create(missing, kMiB); });
  CHECK(contains(message, missing));
  CHECK(contains(message, "No such file or directory"));

  DirectFile f = DirectFile::create((dir / "grow").string(), 5000);
  CHECK(f.size() == 8192);
  f.reserve(kMiB);
  CHECK(f.size() == kMiB);
  CHECK(std::filesystem::file_size(f.path()) == kMiB);
  f.reserve(4096);
  CHECK(f.size() == kMiB);
  DirectFile moved = std::move(f);
  CHECK(moved.fd() >= 0);
  // NOLINTNEXTLINE(bugprone-use-after-move,clang-analyzer-cplusplus.Move): the moved-from state is the contract
  CHECK(f.fd() == -1);
}

TEST_CASE("a full disk (a file size limit, in a child process) says not enough space and names the file") {
  test::ScratchDir dir;
  const std::string path = (dir / "full.f32").string();
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child: past the limit fallocate fails with EFBIG (and would raise SIGXFSZ, which would end it).
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{kMiB, kMiB};
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(10);
    try {
      (void)DirectFile::create(path, 64 * kMiB);
    } catch (const IoError& e) {
      const std::string m = e.what();
      if (!contains(m, "not enough space")) ::_exit(11);
      if (!contains(m, path)) ::_exit(12);
      if (!contains(m, "67108864 bytes needed")) ::_exit(13);
      ::_exit(0);
    } catch (...) {
      ::_exit(14);
    }
    ::_exit(15);  // no error at all
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  INFO("child exit code " << WEXITSTATUS(status) << " (11: not 'not enough space', 12: no path, 13: no size, "
                          << "14: another exception, 15: no error)");
  CHECK(WEXITSTATUS(status) == 0);
  CHECK_FALSE(std::filesystem::exists(path));  // a failed create removes the file it made
}

TEST_CASE("check_nvme_path") {
  test::ScratchDir dir;
  const std::string good = dir.path().string();

  SECTION("a usable directory passes and keeps no probe file") {
    CHECK_NOTHROW(check_nvme_path(good, kMiB, kKey));
    CHECK(std::filesystem::is_empty(dir.path()));
  }
  SECTION("a missing directory") {
    const std::string path = (dir / "missing").string();
    const std::string m = message_of<ConfigError>([&] { check_nvme_path(path, 0, kKey); });
    CHECK(contains(m, kKey));
    CHECK(contains(m, path));
    CHECK(contains(m, "does not exist"));
  }
  SECTION("a file instead of a directory") {
    const std::string path = (dir / "a-file").string();
    DirectFile f = DirectFile::create(path, 4096);
    const std::string m = message_of<ConfigError>([&] { check_nvme_path(path, 0, kKey); });
    CHECK(contains(m, kKey));
    CHECK(contains(m, "is not a directory"));
  }
  SECTION("a read-only directory") {
    const std::filesystem::path ro = dir / "read-only";
    std::filesystem::create_directory(ro);
    REQUIRE(::chmod(ro.c_str(), 0555) == 0);
    if (::geteuid() != 0) {
      const std::string m = message_of<ConfigError>([&] { check_nvme_path(ro.string(), 0, kKey); });
      CHECK(contains(m, kKey));
      CHECK(contains(m, "is not writable"));
    } else {
      // root writes into a 0555 directory (permission checks are bypassed): nothing to refuse here.
      WARN("running as root: a read-only directory is writable to root, not checked");
      CHECK_NOTHROW(check_nvme_path(ro.string(), 0, kKey));
    }
    ::chmod(ro.c_str(), 0755);
  }
  SECTION("more bytes needed than free") {
    const std::uint64_t need = std::uint64_t{1} << 62;
    const std::string m = message_of<ConfigError>([&] { check_nvme_path(good, need, kKey); });
    CHECK(contains(m, kKey));
    CHECK(contains(m, good));
    CHECK(contains(m, "4611686018427387904 bytes needed"));
    CHECK(contains(m, "bytes free"));
  }
  SECTION("/dev/shm agrees with an O_DIRECT open of our own") {
    if (!std::filesystem::is_directory("/dev/shm") || ::access("/dev/shm", W_OK) != 0) {
      WARN("no writable /dev/shm: not checked");
      return;
    }
    // tmpfs refuses O_DIRECT before Linux 6.6 and takes it since.
    std::string probe = "/dev/shm/zero3-test-direct-XXXXXX";
    const int created = ::mkstemp(probe.data());
    REQUIRE(created >= 0);
    const int fd = ::open(probe.c_str(), O_RDWR | O_DIRECT);
    const bool direct = fd >= 0;
    if (fd >= 0) ::close(fd);
    ::close(created);
    ::unlink(probe.c_str());
    INFO("O_DIRECT on /dev/shm: " << direct);
    if (direct) {
      CHECK_NOTHROW(check_nvme_path("/dev/shm", 0, kKey));
    } else {
      const std::string m = message_of<ConfigError>([&] { check_nvme_path("/dev/shm", 0, kKey); });
      CHECK(contains(m, "does not support O_DIRECT"));
    }
  }
}
