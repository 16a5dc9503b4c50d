// The NCCL communicator on CUDA devices, launched by mpirun (one GPU per rank: CUDA device = local rank),
// every collective checked against a reference computed on the host in float64. NCCL reduces fp16/bf16
// in the dtype itself (each hop rounds), so 16-bit reductions get a tolerance of one rounding per rank;
// fp32 sums of the exact inputs used here are exact in any order. Exits 77 (skipped) without NCCL or
// without enough CUDA devices, before MPI starts.
#define CATCH_CONFIG_RUNNER
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test_env.hpp"
#include "skip.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/log.hpp"

using namespace zero3;
using Catch::Matchers::Contains;
using comm::ReduceOp;

namespace {

struct NcclEnv {
  comm::World world;
  std::shared_ptr<comm::Bootstrap> bootstrap;  // declared first: outlives its users
  std::unique_ptr<Device> gpu;
  std::unique_ptr<comm::Communicator> comm;
};
NcclEnv* g_env = nullptr;
NcclEnv& env() {
  return *g_env;
}
Device& gpu() {
  return *env().gpu;
}

constexpr DType kDTypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max};
constexpr std::size_t kCounts[] = {0, 1, 7, 1001};

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank `rank`'s input for case `tag`: k / 64 with k in [-200, 200] (never all zero), exact in every dtype.
std::vector<float> input(std::uint64_t tag, int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t h = mix(mix(mix(tag) + static_cast<std::uint64_t>(rank)) + i);
    v[i] = static_cast<float>(static_cast<int>(h % 401) - 200) / 64.0f;
  }
  return v;
}

// Host <-> device through pinned staging, synchronously (the test's own stream).
Buffer upload(const std::vector<float>& v, DType t, Stream& s) {
  Buffer staging = gpu().allocate(v.size(), t, MemoryKind::pinned_host, MemCategory::staging);
  for (std::size_t i = 0; i < v.size(); ++i) store_from_float(staging.data(), t, i, v[i]);
  Buffer dev = gpu().allocate(v.size(), t, MemoryKind::device, MemCategory::workspace);
  if (!v.empty()) gpu().copy_async(dev.view(), staging.cview(), s);
  s.synchronize();
  return dev;
}
Buffer poisoned(std::size_t n, DType t, Stream& s) {
  Buffer staging = gpu().allocate(n, t, MemoryKind::pinned_host, MemCategory::staging);
  if (n > 0) std::memset(staging.data(), 0xff, staging.size_bytes());  // NaN in every dtype
  Buffer dev = gpu().allocate(n, t, MemoryKind::device, MemCategory::workspace);
  if (n > 0) gpu().copy_async(dev.view(), staging.cview(), s);
  s.synchronize();
  return dev;
}
std::vector<std::byte> download_bytes(const Buffer& dev, Stream& s) {
  Buffer staging = gpu().allocate(dev.count(), dev.dtype(), MemoryKind::pinned_host, MemCategory::staging);
  if (dev.count() > 0) gpu().copy_async(staging.view(), dev.cview(), s);
  s.synchronize();
  std::vector<std::byte> out(dev.size_bytes());
  if (!out.empty()) std::memcpy(out.data(), staging.data(), out.size());
  return out;
}
std::vector<float> download(const Buffer& dev, Stream& s) {
  const auto bytes = download_bytes(dev, s);
  std::vector<float> v(dev.count());
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = load_as_float(bytes.data(), dev.dtype(), i);
  return v;
}

// Empty when got[i] is within tol(i) of want[i] (and NaN-free); else the first mismatch.
template <typename Tol>
std::string compare(const std::vector<float>& got, const std::vector<double>& want, Tol tol) {
  if (got.size() != want.size()) return fmt::format("{} elements, expected {}", got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - want[i]) <= tol(i))) {
      return fmt::format("element {} of {}: got {}, expected {}", i, got.size(), got[i], want[i]);
    }
  }
  return {};
}
std::string compare_exact(const std::vector<float>& got, const std::vector<double>& want) {
  return compare(got, want, [](std::size_t) { return 0.0; });
}

// Relative precision of one rounding to t.
double unit_roundoff(DType t) {
  return t == DType::f32 ? 0x1.0p-24 : t == DType::f16 ? 0x1.0p-11 : 0x1.0p-8;
}

// Reference for element-wise reduction of (rank r's input)[offset + i], with NCCL's tolerance.
struct Reference {
  std::vector<double> value;
  std::vector<double> tolerance;
};
Reference reference(std::uint64_t tag, std::size_t n_per_rank, std::size_t offset, std::size_t n, ReduceOp op,
                    DType t) {
  const int p = env().comm->size();
  std::vector<std::vector<float>> inputs;
  for (int r = 0; r < p; ++r) inputs.push_back(input(tag, r, n_per_rank));
  Reference ref{std::vector<double>(n), std::vector<double>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    double acc = op == ReduceOp::max ? -INFINITY : 0.0;
    double magnitude = 0.0;
    for (const auto& in : inputs) {
      const double x = in[offset + i];
      acc = op == ReduceOp::max ? std::max(acc, x) : acc + x;
      magnitude += std::fabs(x);
    }
    if (op == ReduceOp::avg) {
      acc /= p;
      magnitude /= p;
    }
    ref.value[i] = acc;
    // max is exact; sums round at most once per hop plus once at the end (avg may scale first).
    ref.tolerance[i] = op == ReduceOp::max ? 0.0 : (p + 1) * unit_roundoff(t) * magnitude;
  }
  return ref;
}

std::vector<double> widen(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

}  // namespace

TEST_CASE("nccl all_gather concatenates every rank's input", "[nccl]") {
  auto& c = *env().comm;
  auto s = gpu().create_stream("test");
  const auto up = static_cast<std::size_t>(c.size());
  for (DType t : kDTypes) {
    for (std::size_t n : kCounts) {
      const std::uint64_t tag = 1000 + n * 3 + static_cast<std::size_t>(t);
      Buffer send = upload(input(tag, c.rank(), n), t, *s);
      Buffer recv = poisoned(n * up, t, *s);
      auto work = c.all_gather(send.cview(), recv.view(), *s);
      work->wait();
      CHECK(work->is_completed());
      std::vector<double> want;
      for (int r = 0; r < c.size(); ++r) {
        const auto in = input(tag, r, n);
        want.insert(want.end(), in.begin(), in.end());
      }
      INFO(fmt::format("{} x {}", dtype_name(t), n));
      CHECK(compare_exact(download(recv, *s), want) == "");
    }
  }
}

TEST_CASE("nccl reduce_scatter and all_reduce match the float64 reference", "[nccl]") {
  auto& c = *env().comm;
  auto s = gpu().create_stream("test");
  const auto up = static_cast<std::size_t>(c.size());
  for (DType t : kDTypes) {
    for (ReduceOp op : kOps) {
      for (std::size_t n : kCounts) {
        const std::uint64_t tag = 2000 + n * 9 + static_cast<std::size_t>(t) * 3 + static_cast<std::size_t>(op);
        INFO(fmt::format("{} x {} {}", dtype_name(t), n, reduce_op_name(op)));
        Buffer send = upload(input(tag, c.rank(), n * up), t, *s);
        Buffer recv = poisoned(n, t, *s);
        c.reduce_scatter(send.cview(), recv.view(), op, *s)->wait();
        const Reference rs = reference(tag, n * up, static_cast<std::size_t>(c.rank()) * n, n, op, t);
        CHECK(compare(download(recv, *s), rs.value, [&](std::size_t i) { return rs.tolerance[i]; }) == "");

        Buffer data = upload(input(tag, c.rank(), n), t, *s);
        auto work = c.all_reduce(data.view(), op, *s);
        work->wait();
        const Reference ar = reference(tag, n, 0, n, op, t);
        CHECK(compare(download(data, *s), ar.value, [&](std::size_t i) { return ar.tolerance[i]; }) == "");
        // Every rank holds the same bits.
        const auto mine = download_bytes(data, *s);
        const auto all = env().bootstrap->all_gather(mine);
        for (std::size_t off = 0; off < all.size(); off += mine.size() == 0 ? all.size() : mine.size()) {
          CHECK(std::memcmp(all.data() + off, mine.data(), mine.size()) == 0);
        }
      }
    }
  }
}

TEST_CASE("nccl broadcast from every root", "[nccl]") {
  auto& c = *env().comm;
  auto s = gpu().create_stream("test");
  for (DType t : kDTypes) {
    for (int root = 0; root < c.size(); ++root) {
      const std::size_t n = 1001;
      const std::uint64_t tag = 3000 + static_cast<std::size_t>(root) * 3 + static_cast<std::size_t>(t);
      Buffer data = c.rank() == root ? upload(input(tag, root, n), t, *s) : poisoned(n, t, *s);
      auto work = c.broadcast(data.view(), root, *s);
      work->wait();
      CHECK(work->info().root == root);
      CHECK(compare_exact(download(data, *s), widen(input(tag, root, n))) == "");
    }
  }
}

TEST_CASE("nccl collectives follow stream order and events; Work outlives nothing it needs", "[nccl]") {
  auto& c = *env().comm;
  const auto up = static_cast<std::size_t>(c.size());
  auto a = gpu().create_stream("a");
  auto b = gpu().create_stream("b");
  auto event = gpu().create_event();
  const std::size_t n = 4099;
  Buffer x = upload(input(4000, c.rank(), n), DType::f32, *a);
  Buffer gathered = poisoned(n * up, DType::f32, *b);
  // Nothing waits on the host between these.
  auto w1 = c.all_reduce(x.view(), ReduceOp::sum, *a);
  a->record(*event);
  b->wait(*event);
  auto w2 = c.all_gather(x.cview(), gathered.view(), *b);
  auto w3 = c.barrier(*b);
  w3->wait();
  CHECK(w1->is_completed());
  CHECK(w2->is_completed());
  CHECK(w2->info().seq == w1->info().seq + 1);
  CHECK(w3->info().seq == w1->info().seq + 2);
  const Reference sum = reference(4000, n, 0, n, ReduceOp::sum, DType::f32);
  std::vector<double> copies;
  for (std::size_t r = 0; r < up; ++r) copies.insert(copies.end(), sum.value.begin(), sum.value.end());
  CHECK(compare_exact(download(x, *a), sum.value) == "");
  CHECK(compare_exact(download(gathered, *b), copies) == "");
}

TEST_CASE("a fresh nccl communicator numbers from 1; its Work survives it", "[nccl]") {
  auto s = gpu().create_stream("test");
  Buffer x = upload(input(5000, env().world.rank, 33), DType::bf16, *s);
  std::shared_ptr<comm::Work> work;
  {
    auto fresh = comm::make_nccl_communicator(env().bootstrap, gpu());
    CHECK(fresh->backend_name() == "nccl");
    work = fresh->all_reduce(x.view(), ReduceOp::max, *s);
    CHECK(work->info().seq == 1);
  }
  work->wait();
  const Reference want = reference(5000, 33, 0, 33, ReduceOp::max, DType::bf16);
  CHECK(compare_exact(download(x, *s), want.value) == "");
}

TEST_CASE("nccl rejects host memory and host streams", "[nccl]") {
  auto& c = *env().comm;
  auto s = gpu().create_stream("test");
  Buffer host = gpu().allocate(8, DType::f32, MemoryKind::pinned_host, MemCategory::workspace);
  CHECK_THROWS_WITH(c.all_reduce(host.view(), ReduceOp::sum, *s),
                    Contains("all_reduce") && Contains("pinned_host memory") && Contains("device memory"));
  auto host_device = make_host_device();
  auto host_stream = host_device->create_stream("host");
  CHECK_THROWS_AS(c.barrier(*host_stream), UsageError);
  CHECK_THROWS_AS(comm::make_nccl_communicator(env().bootstrap, *host_device), UsageError);
}

int main(int argc, char** argv) {
  if (!comm::built_with_nccl() || !built_with_cuda()) zero3::test::skip("this build has no CUDA/NCCL backend");
  NcclEnv nccl;
  try {
    nccl.world = comm::World::from_environment();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  const int devices = cuda_device_count();
  if (devices <= nccl.world.local_rank) {
    zero3::test::skip(fmt::format("local rank {} needs CUDA device {}, but {} are visible", nccl.world.local_rank,
                                  nccl.world.local_rank, devices));
  }
  try {
    zero3::log::set_rank(nccl.world.rank, nccl.world.size);
    nccl.bootstrap = comm::make_mpi_bootstrap(nccl.world);
    nccl.gpu = make_cuda_device(nccl.world.local_rank);
    nccl.comm = comm::make_nccl_communicator(nccl.bootstrap, *nccl.gpu);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "NCCL test set-up failed: %s\n", e.what());
    return 2;
  }
  g_env = &nccl;
  const int status = Catch::Session().run(argc, argv);
  g_env = nullptr;
  std::uint32_t failed_ranks = 1;
  try {
    failed_ranks = test::count_failed_ranks(*nccl.bootstrap, status != 0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collecting the test verdicts failed: %s\n", e.what());
  }
  nccl.comm.reset();
  nccl.gpu.reset();
  nccl.bootstrap.reset();
  return failed_ranks != 0 ? 1 : 0;
}
