// Differential tests of the MPI communicator at any world size. Every rank generates every rank's input
// from (seed, case, rank), computes each collective's expected result locally in float64, rounds it as
// the backend promises (fp32 arithmetic, avg divided in fp32, one rounding to the dtype) and compares
// bit for bit. Inputs are multiples of 1/64 below 200/64, exact in every dtype, so any fp32 summation
// order gives the exact sum; full-mantissa inputs are tested separately with named tolerances.
// Collectives are issued unconditionally and checked with CHECK afterwards, so a failure on one rank
// cannot leave the others waiting in a collective.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "mpi_test_env.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/core/dtype.hpp"

using namespace zero3;
using Catch::Matchers::Contains;
using comm::Communicator;
using comm::ReduceOp;

namespace {

constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};
constexpr std::size_t kCounts[] = {0, 1, 7, 1001};
// Host-device "device" memory and both host kinds: the mpi backend takes all three on the host device.
constexpr MemoryKind kKinds[] = {MemoryKind::device, MemoryKind::pageable_host, MemoryKind::pinned_host};

test::MpiTestEnv& env() {
  return test::mpi_env();
}
Device& dev() {
  return *env().host_device;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::uint64_t tag_of(const std::string& name) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Chosen by rank 0 (ZERO3_TEST_SEED, or the clock), the same on every rank: fresh inputs every run.
std::uint64_t session_seed() {
  static const std::uint64_t seed = [] {
    std::uint64_t s = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    if (const char* fixed = std::getenv("ZERO3_TEST_SEED")) s = std::strtoull(fixed, nullptr, 10);
    std::vector<std::byte> bytes(sizeof s);
    std::memcpy(bytes.data(), &s, sizeof s);
    env().bootstrap->broadcast(bytes, 0);
    std::memcpy(&s, bytes.data(), sizeof s);
    if (env().world.rank == 0)
      std::printf("comm tests: seed %llu (ZERO3_TEST_SEED repeats it)\n", static_cast<unsigned long long>(s));
    return s;
  }();
  return seed;
}

std::uint64_t hash3(std::uint64_t tag, int rank, std::size_t i) {
  return mix(mix(mix(session_seed() ^ tag) + static_cast<std::uint64_t>(rank)) + i);
}

// Rank `rank`'s input for case `tag`: k / 64 with k in [-200, 200], exact in fp32, fp16 and bf16.
std::vector<float> exact_input(std::uint64_t tag, int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(static_cast<int>(hash3(tag, rank, i) % 401) - 200) / 64.0f;
  return v;
}

// Full-mantissa values over 20 binades, rounded to `t`: fp32 sums of these depend on the order.
std::vector<float> wide_input(std::uint64_t tag, int rank, std::size_t n, DType t) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h = hash3(tag, rank, i);
    const double unit = static_cast<double>(h >> 11) * 0x1.0p-53 * 2.0 - 1.0;  // [-1, 1)
    const int binade = static_cast<int>(h % 21) - 10;
    const auto x = static_cast<float>(std::ldexp(unit, binade));
    std::uint32_t storage = 0;  // room for any dtype
    store_from_float(&storage, t, 0, x);
    v[i] = load_as_float(&storage, t, 0);
  }
  return v;
}

Buffer alloc(std::size_t n, DType t, MemoryKind kind = MemoryKind::device) {
  return dev().allocate(n, t, kind, MemCategory::workspace);
}
void write(const Buffer& b, const std::vector<float>& v) {
  for (std::size_t i = 0; i < v.size(); ++i) store_from_float(b.data(), b.dtype(), i, v[i]);
}
void poison(const Buffer& b) {
  if (b.size_bytes() > 0) std::memset(b.data(), 0xff, b.size_bytes());  // NaN in every dtype
}
Buffer filled(const std::vector<float>& v, DType t, MemoryKind kind = MemoryKind::device) {
  Buffer b = alloc(v.size(), t, kind);
  write(b, v);
  return b;
}
std::vector<float> read(const Buffer& b) {
  std::vector<float> v(b.count());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = load_as_float(b.data(), b.dtype(), i);
  return v;
}
std::vector<std::byte> bytes_of(const Buffer& b) {
  std::vector<std::byte> out(b.size_bytes());
  if (!out.empty()) std::memcpy(out.data(), b.data(), out.size());
  return out;
}

// Empty when `b` holds exactly `expected` rounded to b's dtype; else the first mismatch.
std::string mismatch(const Buffer& b, const std::vector<float>& expected) {
  if (b.count() != expected.size()) return fmt::format("{} elements, expected {}", b.count(), expected.size());
  const std::size_t elem = size_of(b.dtype());
  std::vector<std::byte> want(expected.size() * elem);
  for (std::size_t i = 0; i < expected.size(); ++i) store_from_float(want.data(), b.dtype(), i, expected[i]);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    if (std::memcmp(static_cast<const std::byte*>(b.data()) + i * elem, want.data() + i * elem, elem) != 0) {
      return fmt::format("element {} of {}: got {}, expected {}", i, expected.size(),
                         load_as_float(b.data(), b.dtype(), i), load_as_float(want.data(), b.dtype(), i));
    }
  }
  return {};
}

// The backend's promise for element-wise reductions of `values` (one per rank).
float reduce_expected(ReduceOp op, const std::vector<float>& values) {
  double acc = op == ReduceOp::max ? -INFINITY : 0.0;
  for (float v : values) acc = op == ReduceOp::max ? std::max(acc, static_cast<double>(v)) : acc + v;
  const auto f = static_cast<float>(acc);  // exact for exact_input
  return op == ReduceOp::avg ? f / static_cast<float>(values.size()) : f;
}

// Element i of the reduction over ranks of exact_input(tag, r, n)[offset + i].
std::vector<float> expected_reduction(std::uint64_t tag, std::size_t n_per_rank, std::size_t offset, std::size_t n,
                                      ReduceOp op, int p) {
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < p; ++r) inputs.push_back(exact_input(tag, r, n_per_rank));
  std::vector<float> out(n);
  std::vector<float> column(static_cast<std::size_t>(p));
  for (std::size_t i = 0; i < n; ++i) {
    for (int r = 0; r < p; ++r) column[static_cast<std::size_t>(r)] = inputs[static_cast<std::size_t>(r)][offset + i];
    out[i] = reduce_expected(op, column);
  }
  return out;
}

std::string case_name(std::string_view op, DType t, std::size_t n, std::string_view extra = "") {
  return fmt::format("{} {} x {}{}", op, dtype_name(t), n, extra);
}

// Every rank's copy of `mine` (via the bootstrap), for cross-rank comparisons.
std::vector<std::vector<std::byte>> gather_all(const std::vector<std::byte>& mine) {
  const std::vector<std::byte> all = env().bootstrap->all_gather(mine);
  std::vector<std::vector<std::byte>> out;
  for (std::size_t off = 0; off < all.size(); off += mine.size()) {
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(off),
                     all.begin() + static_cast<std::ptrdiff_t>(off + mine.size()));
  }
  if (mine.empty()) out.resize(static_cast<std::size_t>(env().world.size));
  return out;
}

void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// ---------------------------------------------------------------- checks shared by several communicators

void check_all_reduce(Communicator& c, Stream& s, std::initializer_list<std::size_t> counts) {
  const int p = c.size();
  for (DType t : kDTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t n : counts) {
        const std::string name = case_name("all_reduce", t, n, fmt::format(" {}", reduce_op_name(op)));
        const auto tag = tag_of(name);
        Buffer data = filled(exact_input(tag, c.rank(), n), t, kKinds[n % 3]);
        auto work = c.all_reduce(data.view(), op, s);
        work->wait();
        INFO(name);
        CHECK(work->is_completed());
        CHECK(mismatch(data, expected_reduction(tag, n, 0, n, op, p)) == "");
      }
    }
  }
}

void check_reduce_scatter(Communicator& c, Stream& s) {
  const int p = c.size();
  const auto up = static_cast<std::size_t>(p);
  for (DType t : kDTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t n : kCounts) {
        const std::string name = case_name("reduce_scatter", t, n, fmt::format(" {}", reduce_op_name(op)));
        const auto tag = tag_of(name);
        Buffer send = filled(exact_input(tag, c.rank(), n * up), t, kKinds[n % 3]);
        Buffer recv = alloc(n, t, kKinds[(n + 1) % 3]);
        poison(recv);
        auto work = c.reduce_scatter(send.cview(), recv.view(), op, s);
        work->wait();
        INFO(name);
        CHECK(mismatch(recv, expected_reduction(tag, n * up, static_cast<std::size_t>(c.rank()) * n, n, op, p)) == "");
        CHECK(mismatch(send, exact_input(tag, c.rank(), n * up)) == "");  // send is left alone
      }
    }
  }
}

// Two collectives on two streams, reached in opposite orders on even and odd ranks: the MPI thread must
// still call MPI in issue order. Then a third on stream b reads the first's result through an event.
void check_two_streams(Communicator& c) {
  const int p = c.size();
  auto a = dev().create_stream("a");
  auto b = dev().create_stream("b");
  auto event = dev().create_event();
  const std::size_t n = 1001;
  const auto tag_x = tag_of("two streams x");
  const auto tag_y = tag_of("two streams y");
  Buffer x = filled(exact_input(tag_x, c.rank(), n), DType::bf16);
  Buffer y = filled(exact_input(tag_y, c.rank(), n), DType::f32);
  Buffer z = alloc(n * static_cast<std::size_t>(p), DType::bf16);
  poison(z);

  (c.rank() % 2 == 0 ? *a : *b).launch_host([] { sleep_ms(30); });
  auto wx = c.all_reduce(x.view(), ReduceOp::sum, *a);
  auto wy = c.all_reduce(y.view(), ReduceOp::max, *b);
  a->record(*event);
  b->wait(*event);
  auto wz = c.all_gather(x.cview(), z.view(), *b);
  wz->wait();
  CHECK(wx->is_completed());
  wx->wait();
  wy->wait();
  CHECK(wy->info().seq == wx->info().seq + 1);
  CHECK(wz->info().seq == wx->info().seq + 2);
  CHECK(mismatch(x, expected_reduction(tag_x, n, 0, n, ReduceOp::sum, p)) == "");
  CHECK(mismatch(y, expected_reduction(tag_y, n, 0, n, ReduceOp::max, p)) == "");
  const std::vector<float> sum_x = read(x);  // as rounded to bf16
  std::vector<float> copies;
  for (int r = 0; r < p; ++r) copies.insert(copies.end(), sum_x.begin(), sum_x.end());
  CHECK(mismatch(z, copies) == "");
}

}  // namespace

// ---------------------------------------------------------------- tests

TEST_CASE("the World, MPI and the communicator agree", "[world]") {
  const auto& w = env().world;
  CHECK(env().comm->rank() == w.rank);
  CHECK(env().comm->size() == w.size);
  CHECK(env().bootstrap->rank() == w.rank);
  CHECK(env().comm->backend_name() == "mpi");
  CHECK(w.local_rank < w.local_size);
  CHECK_THAT(w.source, Contains("mpirun"));

  comm::World wrong = w;
  wrong.size = w.size + 1;
  CHECK_THROWS_AS(comm::make_mpi_bootstrap(wrong), ConfigError);
  CHECK_THROWS_WITH(comm::make_mpi_bootstrap(wrong),
                    Contains("MPI_COMM_WORLD has rank") && Contains(fmt::format("of {}", w.size + 1)));
}

TEST_CASE("a world that is wrong on one rank is a ConfigError on every rank", "[world]") {
  const auto& w = env().world;
  if (w.size < 2) return;  // needs a rank that is right to be told about the one that is wrong
  comm::World wrong = w;
  if (w.rank == w.size - 1) wrong.rank = 0;  // the last rank's environment says it is rank 0
  const std::string named = fmt::format("MPI rank {} has environment rank 0 of {}", w.size - 1, w.size);
  CHECK_THROWS_AS(comm::make_mpi_bootstrap(wrong), ConfigError);
  CHECK_THROWS_WITH(comm::make_mpi_bootstrap(wrong),
                    Contains(named) && Contains(fmt::format("1 of {} ranks", w.size)) && Contains(w.source));
  // Nothing is left half-made: a right world still starts.
  CHECK(comm::make_mpi_bootstrap(w)->rank() == w.rank);
}

TEST_CASE("bootstrap broadcast, all_gather and barrier", "[bootstrap]") {
  auto& bs = *env().bootstrap;
  const int p = bs.size();
  for (int root = 0; root < p; ++root) {
    std::vector<std::byte> bytes(37, std::byte{0xee});
    if (bs.rank() == root) {
      for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(root * 31 + static_cast<int>(i));
    }
    bs.broadcast(bytes, root);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      CHECK(bytes[i] == static_cast<std::byte>(root * 31 + static_cast<int>(i)));
    }
  }
  std::vector<std::byte> mine(5, static_cast<std::byte>(bs.rank() + 1));
  const auto all = bs.all_gather(mine);
  CHECK(all.size() == 5 * static_cast<std::size_t>(p));
  for (std::size_t i = 0; i < all.size(); ++i) CHECK(all[i] == static_cast<std::byte>(i / 5 + 1));
  CHECK(bs.all_gather({}).empty());
  bs.barrier();

  if (p > 1) {  // sizes that differ between ranks are an error on every rank, not a truncation on some
    std::vector<std::byte> uneven(bs.rank() == 0 ? 8 : 4);
    CHECK_THROWS_AS(bs.all_gather(uneven), UsageError);
    CHECK_THROWS_WITH(bs.broadcast(uneven, 0), Contains("different sizes"));
  }
  std::vector<std::byte> one(1);
  CHECK_THROWS_AS(bs.broadcast(one, p), UsageError);
}

TEST_CASE("all_gather concatenates every rank's input", "[all_gather]") {
  auto& c = *env().comm;
  const auto up = static_cast<std::size_t>(c.size());
  auto s = dev().create_stream("test");
  for (DType t : kDTypes) {
    for (std::size_t n : kCounts) {
      const std::string name = case_name("all_gather", t, n);
      const auto tag = tag_of(name);
      Buffer send = filled(exact_input(tag, c.rank(), n), t, kKinds[n % 3]);
      Buffer recv = alloc(n * up, t, kKinds[(n + 2) % 3]);
      poison(recv);
      auto work = c.all_gather(send.cview(), recv.view(), *s);
      work->wait();
      std::vector<float> expected;
      for (int r = 0; r < c.size(); ++r) {
        const auto in = exact_input(tag, r, n);
        expected.insert(expected.end(), in.begin(), in.end());
      }
      INFO(name);
      CHECK(mismatch(recv, expected) == "");
      CHECK(work->info().op == "all_gather");
      CHECK(work->info().count == n);
      CHECK(work->info().dtype == t);

      // In place: send is this rank's block of recv.
      Buffer inplace = alloc(n * up, t);
      poison(inplace);
      BufferView block = inplace.view().slice(static_cast<std::size_t>(c.rank()) * n, n);
      for (std::size_t i = 0; i < n; ++i) store_from_float(block.data, t, i, exact_input(tag, c.rank(), n)[i]);
      c.all_gather(block, inplace.view(), *s)->wait();
      CHECK(mismatch(inplace, expected) == "");
    }
  }
}

TEST_CASE("reduce_scatter reduces block r onto rank r", "[reduce_scatter]") {
  auto s = dev().create_stream("test");
  check_reduce_scatter(*env().comm, *s);

  // In place: recv is this rank's block of send.
  auto& c = *env().comm;
  const std::size_t n = 7;
  const auto up = static_cast<std::size_t>(c.size());
  const auto tag = tag_of("reduce_scatter in place");
  Buffer buf = filled(exact_input(tag, c.rank(), n * up), DType::f32);
  BufferView mine = buf.view().slice(static_cast<std::size_t>(c.rank()) * n, n);
  c.reduce_scatter(buf.cview(), mine, ReduceOp::sum, *s)->wait();
  std::vector<float> got(n);
  for (std::size_t i = 0; i < n; ++i) got[i] = mine.as<float>()[i];
  const auto want = expected_reduction(tag, n * up, static_cast<std::size_t>(c.rank()) * n, n, ReduceOp::sum, c.size());
  CHECK(got == want);
}

TEST_CASE("all_reduce matches the float64 reference for every dtype and op", "[all_reduce]") {
  auto s = dev().create_stream("test");
  check_all_reduce(*env().comm, *s, {0, 1, 7, 1001, 4099});

  // Large and padded: 100003 is odd and prime, so no world size divides it.
  auto& c = *env().comm;
  const std::size_t n = 100003;
  const auto tag = tag_of("all_reduce large");
  Buffer data = filled(exact_input(tag, c.rank(), n), DType::bf16);
  c.all_reduce(data.view(), ReduceOp::avg, *s)->wait();
  CHECK(mismatch(data, expected_reduction(tag, n, 0, n, ReduceOp::avg, c.size())) == "");
}

TEST_CASE("all_reduce is bitwise identical across ranks and runs, and close to the float64 sum", "[all_reduce]") {
  auto& c = *env().comm;
  const int p = c.size();
  auto s = dev().create_stream("test");
  const std::size_t n = 10007;
  for (DType t : kDTypes) {
    for (ReduceOp op : kOps) {
      const std::string name = case_name("all_reduce wide", t, n, fmt::format(" {}", reduce_op_name(op)));
      const auto tag = tag_of(name);
      const auto input = wide_input(tag, c.rank(), n, t);
      Buffer first = filled(input, t);
      Buffer second = filled(input, t);
      c.all_reduce(first.view(), op, *s);
      c.all_reduce(second.view(), op, *s);
      s->synchronize();
      INFO(name);
      CHECK(bytes_of(first) == bytes_of(second));  // rerun: same bits
      const auto everyone = gather_all(bytes_of(first));
      for (int r = 0; r < p; ++r) CHECK(everyone[static_cast<std::size_t>(r)] == everyone[0]);

      // fp32 accumulation error grows with the number of additions (p - 1), plus one rounding to t.
      // Plus fp16's subnormal step: tiny sums round to it absolutely, not relatively.
      const double eps = t == DType::f32 ? 0x1.0p-24 : t == DType::f16 ? 0x1.0p-11 : 0x1.0p-8;
      const double absolute = t == DType::f16 ? 0x1.0p-25 : 0.0;
      std::vector<std::vector<float>> inputs;
      for (int r = 0; r < p; ++r) inputs.push_back(wide_input(tag, r, n, t));
      const auto got = read(first);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        double exact = op == ReduceOp::max ? -INFINITY : 0.0;
        double magnitude = 0.0;
        for (const auto& in : inputs) {
          exact = op == ReduceOp::max ? std::max(exact, static_cast<double>(in[i])) : exact + in[i];
          magnitude += std::fabs(in[i]);
        }
        if (op == ReduceOp::avg) {
          exact /= p;
          magnitude /= p;
        }
        const double tolerance = op == ReduceOp::max ? 0.0 : (p * 0x1.0p-24 + eps) * magnitude + absolute;
        if (std::fabs(got[i] - exact) > tolerance) ++bad;
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("max keeps a NaN from any rank", "[all_reduce]") {
  auto& c = *env().comm;
  auto s = dev().create_stream("test");
  for (DType t : kDTypes) {
    std::vector<float> v = {1.0f, -2.0f, 3.0f, 0.5f};
    v[static_cast<std::size_t>(c.rank()) % v.size()] = NAN;  // a different position per rank
    Buffer data = filled(v, t);
    c.all_reduce(data.view(), ReduceOp::max, *s)->wait();
    const auto got = read(data);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const bool some_rank_nan = i < std::min<std::size_t>(static_cast<std::size_t>(c.size()), v.size());
      INFO(fmt::format("{} element {}", dtype_name(t), i));
      CHECK(std::isnan(got[i]) == some_rank_nan);
    }
  }
}

TEST_CASE("broadcast from every root", "[broadcast]") {
  auto& c = *env().comm;
  auto s = dev().create_stream("test");
  for (DType t : kDTypes) {
    for (std::size_t n : kCounts) {
      for (int root = 0; root < c.size(); ++root) {
        const std::string name = case_name("broadcast", t, n, fmt::format(" root {}", root));
        const auto tag = tag_of(name);
        Buffer data = alloc(n, t, kKinds[static_cast<std::size_t>(root) % 3]);
        poison(data);
        if (c.rank() == root) write(data, exact_input(tag, root, n));
        auto work = c.broadcast(data.view(), root, *s);
        work->wait();
        INFO(name);
        CHECK(mismatch(data, exact_input(tag, root, n)) == "");
        CHECK(work->info().root == root);
      }
    }
  }
}

TEST_CASE("collectives queued on one stream see each other's results", "[stream]") {
  auto& c = *env().comm;
  const int p = c.size();
  const auto up = static_cast<std::size_t>(p);
  auto s = dev().create_stream("test");
  for (DType t : kDTypes) {
    const std::size_t n = 1001;
    const auto tag = tag_of(case_name("chain", t, n));
    Buffer x = filled(exact_input(tag, c.rank(), n), t);
    Buffer y = alloc(n, t);
    Buffer gathered = alloc(n * up, t);
    Buffer out = alloc(n, t);
    poison(y);
    poison(gathered);
    poison(out);
    // Nothing waits in between: only stream order makes each step read the previous one's result.
    auto w1 = c.all_reduce(x.view(), ReduceOp::sum, *s);
    dev().copy_async(y.view(), x.cview(), *s);
    auto w2 = c.all_gather(y.cview(), gathered.view(), *s);
    auto w3 = c.reduce_scatter(gathered.cview(), out.view(), ReduceOp::avg, *s);
    auto w4 = c.broadcast(out.view(), p - 1, *s);
    auto w5 = c.barrier(*s);
    s->synchronize();
    for (const auto& w : {w1, w2, w3, w4, w5}) CHECK(w->is_completed());
    CHECK(w5->info().seq == w1->info().seq + 4);
    CHECK(w5->info().op == "barrier");

    INFO(dtype_name(t));
    CHECK(mismatch(x, expected_reduction(tag, n, 0, n, ReduceOp::sum, p)) == "");
    const std::vector<float> sum = read(x);  // as rounded to t
    std::vector<float> copies;
    for (int r = 0; r < p; ++r) copies.insert(copies.end(), sum.begin(), sum.end());
    CHECK(mismatch(gathered, copies) == "");
    CHECK(mismatch(out, sum) == "");  // the average of p equal blocks is the block
  }

  // Many in flight at once, on two streams, issued alternately.
  auto s2 = dev().create_stream("test2");
  std::vector<Buffer> bufs;
  std::vector<std::shared_ptr<comm::Work>> works;
  for (int k = 0; k < 24; ++k) {
    bufs.push_back(filled(exact_input(tag_of(fmt::format("many {}", k)), c.rank(), 33), DType::f16));
    works.push_back(c.all_reduce(bufs.back().view(), ReduceOp::sum, k % 2 == 0 ? *s : *s2));
  }
  for (std::size_t k = works.size(); k-- > 0;) works[k]->wait();  // waiting out of order is fine
  for (int k = 0; k < 24; ++k) {
    const auto tag = tag_of(fmt::format("many {}", k));
    CHECK(mismatch(bufs[static_cast<std::size_t>(k)], expected_reduction(tag, 33, 0, 33, ReduceOp::sum, p)) == "");
  }
}

TEST_CASE("collectives on two streams run in issue order whatever order the streams reach them", "[stream]") {
  check_two_streams(*env().comm);
}

TEST_CASE("a communicator on the shared MPI thread gives the same results", "[shared]") {
  comm::MpiCommunicatorOptions options;
  options.shared_mpi_thread = true;
  auto shared = comm::make_mpi_communicator(env().bootstrap, dev(), options);
  auto s = dev().create_stream("test");
  check_all_reduce(*shared, *s, {1, 7, 1001});
  check_reduce_scatter(*shared, *s);
  check_two_streams(*shared);
}

TEST_CASE("two communicators progress independently", "[stream]") {
  auto& c1 = *env().comm;
  auto c2 = comm::make_mpi_communicator(env().bootstrap, dev());
  auto a = dev().create_stream("a");
  auto b = dev().create_stream("b");
  const std::size_t n = 77;
  const auto tag = tag_of("two communicators");
  Buffer x = filled(exact_input(tag, c1.rank(), n), DType::f32);
  Buffer y = filled(exact_input(tag, c1.rank(), n), DType::f32);
  // Each communicator has its own MPI thread and MPI communicator, so reaching them in different orders
  // on different ranks cannot deadlock.
  (c1.rank() % 2 == 0 ? *a : *b).launch_host([] { sleep_ms(30); });
  auto wx = c1.all_reduce(x.view(), ReduceOp::sum, *a);
  auto wy = c2->all_reduce(y.view(), ReduceOp::sum, *b);
  wx->wait();
  wy->wait();
  CHECK(wy->info().seq == 1);
  const auto want = expected_reduction(tag, n, 0, n, ReduceOp::sum, c1.size());
  CHECK(mismatch(x, want) == "");
  CHECK(mismatch(y, want) == "");
}

TEST_CASE("sequence numbers start at 1, count collectives and agree across ranks", "[seq]") {
  auto fresh = comm::make_mpi_communicator(env().bootstrap, dev());
  auto s = dev().create_stream("test");
  Buffer data = filled(exact_input(1, fresh->rank(), 5), DType::f16);
  auto w1 = fresh->barrier(*s);
  auto w2 = fresh->all_reduce(data.view(), ReduceOp::avg, *s);
  auto w3 = fresh->broadcast(data.view(), fresh->size() - 1, *s);
  w3->wait();
  CHECK(w1->info().seq == 1);
  CHECK(w2->info().seq == 2);
  CHECK(w3->info().seq == 3);
  CHECK(w2->info().reduce_op == ReduceOp::avg);
  CHECK(w2->info().dtype == DType::f16);
  CHECK(w2->info().count == 5);
  CHECK(w3->info().root == fresh->size() - 1);
  CHECK(comm::describe(w2->info()) == "all_reduce #2 (fp16 x 5, avg)");
  CHECK(comm::fingerprint(w2->info()) != comm::fingerprint(w3->info()));

  auto wg = env().comm->barrier(*s);
  wg->wait();
  std::vector<std::uint64_t> mine = {w3->info().seq, comm::fingerprint(w3->info()), wg->info().seq,
                                     comm::fingerprint(wg->info())};
  std::vector<std::byte> bytes(mine.size() * sizeof(std::uint64_t));
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  const auto everyone = gather_all(bytes);
  for (const auto& other : everyone) CHECK(other == bytes);
}

TEST_CASE("invalid arguments throw UsageError naming the op and consume no sequence number", "[errors]") {
  auto fresh = comm::make_mpi_communicator(env().bootstrap, dev());
  const auto up = static_cast<std::size_t>(fresh->size());
  auto s = dev().create_stream("test");
  Buffer seven = alloc(7, DType::f32);
  Buffer seven16 = alloc(7, DType::bf16);
  Buffer wrong = alloc(7 * up + 1, DType::f32);
  Buffer right = alloc(7 * up, DType::f32);

  CHECK_THROWS_AS(fresh->all_gather(seven.cview(), wrong.view(), *s), UsageError);
  CHECK_THROWS_WITH(fresh->all_gather(seven.cview(), wrong.view(), *s),
                    Contains("all_gather") && Contains(fmt::format("recv has {} elements", 7 * up + 1)) &&
                        Contains(fmt::format("rank {} of {}", fresh->rank(), fresh->size())));
  CHECK_THROWS_WITH(fresh->all_gather(seven16.cview(), right.view(), *s),
                    Contains("all_gather") && Contains("send is bf16 but recv is fp32"));
  CHECK_THROWS_WITH(fresh->reduce_scatter(wrong.cview(), seven.view(), ReduceOp::sum, *s),
                    Contains("reduce_scatter") && Contains("send has"));
  CHECK_THROWS_WITH(fresh->reduce_scatter(right.cview(), seven16.view(), ReduceOp::sum, *s),
                    Contains("reduce_scatter") && Contains("send is fp32 but recv is bf16"));
  CHECK_THROWS_WITH(fresh->broadcast(seven.view(), -1, *s), Contains("broadcast") && Contains("root -1"));
  CHECK_THROWS_WITH(fresh->broadcast(seven.view(), fresh->size(), *s), Contains("is not a rank"));
  CHECK_THROWS_WITH(fresh->all_reduce(BufferView{nullptr, 3, DType::f32, MemoryKind::device}, ReduceOp::sum, *s),
                    Contains("all_reduce") && Contains("null pointer"));
  // Never dereferenced: the count is rejected first.
  BufferView huge{reinterpret_cast<void*>(std::uintptr_t{4096}), std::size_t{INT_MAX} + 1, DType::f16,
                  MemoryKind::device};
  CHECK_THROWS_WITH(fresh->all_reduce(huge, ReduceOp::sum, *s), Contains("limit"));
  // Partial overlap is neither out of place nor the in-place form.
  Buffer big = alloc(7 * up + 8, DType::f32);
  CHECK_THROWS_WITH(fresh->all_gather(big.view().slice(1, 7), big.view().slice(0, 7 * up), *s), Contains("overlaps"));
  auto other_device = make_host_device();
  auto foreign = other_device->create_stream("foreign");
  CHECK_THROWS_WITH(fresh->barrier(*foreign), Contains("another device"));

  auto w = fresh->barrier(*s);
  CHECK(w->info().seq == 1);
  w->wait();

  struct NotMpi final : comm::Bootstrap {
    int rank() const override { return 0; }
    int size() const override { return 1; }
    void broadcast(std::vector<std::byte>&, int) override {}
    std::vector<std::byte> all_gather(const std::vector<std::byte>& b) override { return b; }
    void barrier() override {}
  };
  CHECK_THROWS_AS(comm::make_mpi_communicator(std::make_shared<NotMpi>(), dev()), UsageError);
}

TEST_CASE("a collective its stream skipped fails its Work and breaks the communicator", "[errors]") {
  // Every rank injects the same failure, so no rank enters MPI for the skipped collective.
  auto fresh = comm::make_mpi_communicator(env().bootstrap, dev());
  auto failing = dev().create_stream("failing");
  auto healthy = dev().create_stream("healthy");
  failing->launch_host([] { throw std::runtime_error("injected failure"); });
  Buffer x = filled({1.0f, 2.0f, 3.0f}, DType::f32);
  auto w1 = fresh->all_reduce(x.view(), ReduceOp::sum, *failing);
  CHECK_THROWS_AS(w1->wait(), CommError);
  CHECK_THROWS_WITH(w1->wait(), Contains("all_reduce #1 (fp32 x 3, sum)") && Contains("not executed") &&
                                    Contains("'failing'") && Contains(fmt::format("rank {}", fresh->rank())));
  CHECK_THROWS_WITH(failing->synchronize(), Contains("injected failure"));

  auto w2 = fresh->barrier(*healthy);
  CHECK_THROWS_WITH(w2->wait(), Contains("barrier #2") && Contains("unusable") && Contains("all_reduce #1"));
  CHECK_THROWS_AS(healthy->synchronize(), CommError);  // the failed collective failed its stream too
  CHECK(read(x) == std::vector<float>{1.0f, 2.0f, 3.0f});
}

TEST_CASE("destroying a communicator waits for its collectives", "[lifetime]") {
  auto s = dev().create_stream("test");
  const auto tag = tag_of("lifetime");
  Buffer x = filled(exact_input(tag, env().world.rank, 9), DType::f32);
  std::shared_ptr<comm::Work> work;
  {
    auto fresh = comm::make_mpi_communicator(env().bootstrap, dev());
    s->launch_host([] { sleep_ms(20); });
    work = fresh->all_reduce(x.view(), ReduceOp::sum, *s);
  }
  CHECK(work->is_completed());
  work->wait();
  CHECK(mismatch(x, expected_reduction(tag, 9, 0, 9, ReduceOp::sum, env().world.size)) == "");
}
