// `zero3 demo`: sharded collectives over the ranks of the job, each checked against a reference every
// rank computes on its own. It shards a parameter vector ZeRO-3 style (padded to world size x
// alignment, rank r owning slice r), all-gathers it in bf16, reduce-scatters fp32 gradients (mean),
// and all-reduces the squared gradient norm, then prints timings and the memory accounting.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "commands.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/device/device.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::tools {
namespace {

struct DemoOptions {
  std::size_t num_params = 1'000'003;  // deliberately not a multiple of anything
  std::size_t alignment = 64;
  int repeats = 5;
  std::string device = "auto";
  std::uint64_t seed = 42;
};

double param_value(std::uint64_t seed, std::size_t i) {
  return 0.02 * CounterRng(seed, hash_name("demo.weight")).normal(i);
}
double grad_value(std::uint64_t seed, int rank, std::size_t i) {
  return CounterRng(seed + 1 + static_cast<std::uint64_t>(rank), hash_name("demo.weight.grad")).normal(i);
}

struct Timing {
  std::string op;
  std::size_t bytes_per_rank;
  double best_ms;
};

template <typename Fn>
double time_best_ms(int repeats, Fn&& fn) {
  double best = 1e300;
  for (int r = 0; r < repeats; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  return best;
}

void run_demo(const DemoOptions& opt) {
  const comm::World world = comm::World::from_environment();
  log::set_rank(world.rank, world.size);
  auto bootstrap = comm::make_mpi_bootstrap(world);

  const bool want_cuda = opt.device == "cuda" || (opt.device == "auto" && cuda_device_count() > 0);
  std::unique_ptr<Device> device =
      want_cuda ? make_cuda_device(world.local_rank % std::max(1, cuda_device_count())) : make_host_device();
  auto communicator =
      want_cuda ? comm::make_nccl_communicator(bootstrap, *device) : comm::make_mpi_communicator(bootstrap, *device);
  auto stream = device->create_stream("demo");

  const auto W = static_cast<std::size_t>(world.size);
  const std::size_t unit = W * opt.alignment;
  const std::size_t padded = (opt.num_params + unit - 1) / unit * unit;
  const std::size_t shard = padded / W;
  const std::size_t first = shard * static_cast<std::size_t>(world.rank);
  if (world.rank == 0) {
    log::info("demo: {} params over {} ranks ({}), padded to {} = {} x {} per rank; device {}, comm {}", opt.num_params,
              world.size, world.source, padded, W, shard, device->description(), communicator->backend_name());
  }

  // Host staging for inputs and results, device buffers for the sharded state.
  Buffer host_shard = device->allocate(shard, DType::bf16, MemoryKind::pageable_host, MemCategory::staging);
  for (std::size_t i = 0; i < shard; ++i) {
    const std::size_t g = first + i;
    host_shard.view().as<bf16_t>()[i] =
        float_to_bf16(g < opt.num_params ? static_cast<float>(param_value(opt.seed, g)) : 0.0f);
  }
  Buffer param_shard = device->allocate(shard, DType::bf16, MemoryKind::device, MemCategory::param_shard);
  Buffer gathered = device->allocate(padded, DType::bf16, MemoryKind::device, MemCategory::param_gathered);
  Buffer grads = device->allocate(padded, DType::f32, MemoryKind::device, MemCategory::grad_buffer);
  Buffer grad_shard = device->allocate(shard, DType::f32, MemoryKind::device, MemCategory::grad_shard);
  Buffer norm_sq = device->allocate(1, DType::f32, MemoryKind::device, MemCategory::workspace);
  device->copy_async(param_shard.view(), host_shard.cview(), *stream);

  Buffer host_grads = device->allocate(padded, DType::f32, MemoryKind::pageable_host, MemCategory::staging);
  for (std::size_t i = 0; i < padded; ++i)
    host_grads.view().as<float>()[i] =
        i < opt.num_params ? static_cast<float>(grad_value(opt.seed, world.rank, i)) : 0.0f;
  device->copy_async(grads.view(), host_grads.cview(), *stream);
  stream->synchronize();

  std::vector<Timing> timings;
  timings.push_back({"all_gather bf16", shard * 2, time_best_ms(opt.repeats, [&] {
                       communicator->all_gather(param_shard.cview(), gathered.view(), *stream)->wait();
                     })});
  timings.push_back(
      {"reduce_scatter fp32 avg", padded * 4, time_best_ms(opt.repeats, [&] {
         communicator->reduce_scatter(grads.cview(), grad_shard.view(), comm::ReduceOp::avg, *stream)->wait();
       })});
  kernels::sum_squares(*stream, grad_shard.cview(), norm_sq.view(), false);
  timings.push_back({"all_reduce fp32 sum", 4, time_best_ms(1, [&] {
                       communicator->all_reduce(norm_sq.view(), comm::ReduceOp::sum, *stream)->wait();
                     })});

  // Check every result against references computed here, independently of the collectives.
  Buffer host_full = device->allocate(padded, DType::bf16, MemoryKind::pageable_host, MemCategory::staging);
  Buffer host_gshard = device->allocate(shard, DType::f32, MemoryKind::pageable_host, MemCategory::staging);
  Buffer host_norm = device->allocate(1, DType::f32, MemoryKind::pageable_host, MemCategory::staging);
  device->copy_async(host_full.view(), gathered.cview(), *stream);
  device->copy_async(host_gshard.view(), grad_shard.cview(), *stream);
  device->copy_async(host_norm.view(), norm_sq.cview(), *stream);
  stream->synchronize();

  std::size_t gather_mismatch = 0;
  for (std::size_t g = 0; g < padded; ++g) {
    const bf16_t want = float_to_bf16(g < opt.num_params ? static_cast<float>(param_value(opt.seed, g)) : 0.0f);
    if (host_full.view().as<bf16_t>()[g].bits != want.bits) ++gather_mismatch;
  }
  double max_rel = 0.0;
  for (std::size_t i = 0; i < shard; ++i) {
    const std::size_t g = first + i;
    double want = 0.0;
    double magnitude = 0.0;  // mean |g_r|: the scale of fp32 rounding in the sum, whatever the cancellation
    if (g < opt.num_params) {
      for (int r = 0; r < world.size; ++r) {
        const double v = static_cast<float>(grad_value(opt.seed, r, g));
        want += v;
        magnitude += std::abs(v);
      }
      want /= static_cast<double>(world.size);
      magnitude /= static_cast<double>(world.size);
    }
    const double got = host_gshard.view().as<float>()[i];
    if (magnitude > 0.0)
      max_rel = std::max(max_rel, std::abs(got - want) / magnitude);
    else
      max_rel = std::max(max_rel, std::abs(got));
  }
  // Reference squared norm of the mean gradient over the whole (unpadded) vector, in float64.
  double norm_ref = 0.0;
  for (std::size_t g = 0; g < opt.num_params; ++g) {
    double m = 0.0;
    for (int r = 0; r < world.size; ++r) m += static_cast<double>(static_cast<float>(grad_value(opt.seed, r, g)));
    m /= static_cast<double>(world.size);
    norm_ref += m * m;
  }
  const double norm_rel = std::abs(host_norm.view().as<float>()[0] - norm_ref) / norm_ref;

  const bool ok = gather_mismatch == 0 && max_rel < 1e-5 && norm_rel < 1e-4;
  if (world.rank == 0) {
    std::string table = fmt::format("\n{:<26} {:>14} {:>10} {:>10}\n", "collective", "bytes/rank", "best_ms", "GB/s");
    for (const auto& t : timings)
      table += fmt::format("{:<26} {:>14} {:>10.3f} {:>10.3f}\n", t.op, t.bytes_per_rank, t.best_ms,
                           static_cast<double>(t.bytes_per_rank) / (t.best_ms * 1e6));
    table += fmt::format(
        "\ncheck: all_gather bitwise mismatches {} | reduce_scatter max err/|g| {:.2e} (< 1e-5) | "
        "norm^2 rel err {:.2e} (< 1e-4) -> {}\n",
        gather_mismatch, max_rel, norm_rel, ok ? "OK" : "FAILED");
    table += "\nmemory (rank 0):\n" + device->memory().report();
    std::fputs(table.c_str(), stdout);
    std::fflush(stdout);
  }
  if (!ok) {
    throw Error(
        fmt::format("demo: rank {} found wrong collective results (gather mismatches {}, reduce-scatter rel err "
                    "{:.2e}, norm rel err {:.2e})",
                    world.rank, gather_mismatch, max_rel, norm_rel));
  }
}

}  // namespace

void add_demo_command(CLI::App& app) {
  auto opt = std::make_shared<DemoOptions>();
  CLI::App* cmd = app.add_subcommand("demo", "Shard a parameter vector over the job's ranks and check the collectives");
  cmd->add_option("--params", opt->num_params, "Number of parameters to shard")->check(CLI::Range(1ul, 1ul << 32));
  cmd->add_option("--repeats", opt->repeats, "Timed repetitions of each collective")->check(CLI::Range(1, 1000));
  cmd->add_option("--device", opt->device, "Device backend")->check(CLI::IsMember({"auto", "host", "cuda"}));
  cmd->add_option("--seed", opt->seed, "Seed of the generated parameters and gradients");
  cmd->callback([opt] { run_demo(*opt); });
}

}  // namespace zero3::tools
