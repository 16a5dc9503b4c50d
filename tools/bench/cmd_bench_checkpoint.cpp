// `zero3-bench checkpoint [--json]`: checkpoint save and load throughput of the engine's state (the host
// GPT of bench_trainer.hpp, fp32 params + master + Adam moments) next to a plain sequential write and read of the same
// bytes on the same disk, and the step-time cost of an async save (steps while a save is in flight vs
// steps without one). Meant for `mpirun -np N`; every rank writes and reads its own share, as a save does;
// rank 0 reports. The page cache is dropped for the files (posix_fadvise DONTNEED after fsync) before
// each read, for ours and the plain read alike.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "bench_trainer.hpp"
#include "zero3/ckpt/checkpointer.hpp"
#include "zero3/comm/typed_collectives.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::tools {
namespace {

namespace fs = std::filesystem;
using bench::Clock;
using bench::seconds_since;

struct CheckpointBenchOptions {
  bool json = false;
  std::string dir;  // default: a fresh directory under the system's temporary directory
  ModelShape shape{.d_model = 384, .layers = 6};
  int steps = 4;    // baseline steps for the async comparison
  int repeats = 2;  // save/write/read rounds; the best of each is reported
};

void drop_cache(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_cache_tree(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) drop_cache(e.path());
  }
}

void check_io(bool ok, const char* what, const fs::path& path) {
  if (!ok)
    throw Error(
        fmt::format("zero3-bench checkpoint: {} {}: {}", what, path.string(), std::generic_category().message(errno)));
}

// The plain reference: `bytes` written sequentially in 4 MiB writes and fsynced.
void raw_write(const fs::path& path, std::uint64_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check_io(fd >= 0, "open", path);
  std::vector<char> block(std::size_t{4} << 20, 'z');
  for (std::uint64_t done = 0; done < bytes;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), bytes - done));
    const ssize_t w = ::write(fd, block.data(), n);
    check_io(w > 0, "write", path);
    done += static_cast<std::uint64_t>(w);
  }
  check_io(::fsync(fd) == 0, "fsync", path);
  ::close(fd);
}

std::uint64_t raw_read(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  check_io(fd >= 0, "open", path);
  std::vector<char> block(std::size_t{4} << 20);
  std::uint64_t total = 0;
  for (;;) {
    const ssize_t r = ::read(fd, block.data(), block.size());
    check_io(r >= 0, "read", path);
    if (r == 0) break;
    total += static_cast<std::uint64_t>(r);
  }
  ::close(fd);
  return total;
}

config::Config bench_config(const ModelShape& shape, int world_size) {
  return bench::parse_builtin_config(
      fmt::format(R"({{"train_micro_batch_size_per_gpu": {}, "gradient_accumulation_steps": 1,
          "optimizer": {{"type": "AdamW", "params": {{"lr": 1e-3, "weight_decay": 0.01}}}},
          "zero_optimization": {{"stage": 3}}, "zero3": {}}})",
                  shape.micro_batch, zero3_block(shape)),
      world_size, "zero3-bench checkpoint");
}

void run(const CheckpointBenchOptions& o) {
  const comm::World world = bench::bench_world();
  const std::shared_ptr<comm::Bootstrap> bootstrap = comm::make_mpi_bootstrap(world);
  Zero3Trainer trainer(bench_config(o.shape, world.size), world, o.shape, bootstrap);
  Engine& engine = trainer.engine();
  fs::path root =
      o.dir.empty() ? fs::temp_directory_path() / fmt::format("zero3-bench-checkpoint-{}", getpid()) : fs::path(o.dir);
  root = fs::path(comm::broadcast_string(*bootstrap, root.string(), 0));  // rank 0's choice, for every rank
  if (world.rank == 0) fs::create_directories(root);
  bootstrap->barrier();

  std::int64_t step = 0;
  trainer.step(step++);  // warm-up: trace, first touches
  ckpt::CheckpointerOptions sync_options;
  sync_options.async = false;
  ckpt::Checkpointer sync_saver(engine, bootstrap, sync_options);

  // Save (synchronous: snapshot, write, fsync, commit) and the plain write of the same bytes, then the
  // cold reads, alternating ours and plain `repeats` times; each figure is the best of its repeats.
  double save_s = 1e300;
  double raw_write_s = 1e300;
  double raw_read_s = 1e300;
  double load_s = 1e300;
  std::uint64_t total_bytes = 0;
  std::uint64_t bytes_read = 0;
  const fs::path raw = root / fmt::format("raw_{:05d}.bin", world.rank);
  const auto timed = [&](auto&& body) {
    bootstrap->barrier();
    const Clock::time_point t0 = Clock::now();
    body();
    bootstrap->barrier();
    return seconds_since(t0);
  };
  for (int r = 0; r < o.repeats; ++r) {
    save_s = std::min(save_s, timed([&] {
                        sync_saver.save(root / "ours", fmt::format("bench{}", r), step, nlohmann::json::object());
                        const std::vector<ckpt::SaveReport> saved = sync_saver.wait();
                        if (saved.empty() || !saved.front().ok) {
                          throw Error(fmt::format("zero3-bench checkpoint: the save failed: {}",
                                                  saved.empty() ? "no report" : saved.front().error));
                        }
                        total_bytes = saved.front().bytes;
                      }));
    const std::uint64_t my_bytes =
        fs::file_size(root / "ours" / fmt::format("bench{}", r) / fmt::format("rank_{:05d}.bin", world.rank));
    raw_write_s = std::min(raw_write_s, timed([&] { raw_write(raw, my_bytes); }));
    drop_cache(raw);
    if (world.rank == 0) drop_cache_tree(root / "ours");
    load_s = std::min(
        load_s, timed([&] { bytes_read = sync_saver.load(root / "ours", fmt::format("bench{}", r)).bytes_read; }));
    raw_read_s = std::min(raw_read_s, timed([&] { raw_read(raw); }));
  }
  bytes_read = comm::sum_over_ranks(*bootstrap, bytes_read);  // every rank's bytes read

  // Async save's cost to the steps: steps without a save, then steps from save() until it has committed.
  ckpt::Checkpointer async_saver(engine, bootstrap, ckpt::CheckpointerOptions{});
  bootstrap->barrier();
  Clock::time_point t0 = Clock::now();
  for (int i = 0; i < o.steps; ++i) trainer.step(step++);
  const double plain_step_s = seconds_since(t0) / o.steps;
  t0 = Clock::now();
  async_saver.save(root / "ours", "async", step, nlohmann::json::object());
  int steps_in_flight = 0;
  std::vector<ckpt::SaveReport> done;
  while (done.empty()) {
    trainer.step(step++);
    ++steps_in_flight;
    done = async_saver.poll();
  }
  const double flight_step_s = seconds_since(t0) / steps_in_flight;
  if (!done.front().ok)
    throw Error(fmt::format("zero3-bench checkpoint: the async save failed: {}", done.front().error));
  fs::remove(raw);
  bootstrap->barrier();
  if (world.rank != 0) return;
  if (o.dir.empty()) fs::remove_all(root);

  const double gb = static_cast<double>(total_bytes) / 1e9;
  const double save_gbps = gb / save_s;
  const double load_gbps = static_cast<double>(bytes_read) / 1e9 / load_s;
  const double raw_write_gbps = gb / raw_write_s;
  const double raw_read_gbps = gb / raw_read_s;
  const double ratio = flight_step_s / plain_step_s;
  if (o.json) {
    fmt::print(
        "{{\"world_size\": {}, \"params\": {}, \"checkpoint_bytes\": {}, \"save_gbps\": {:.4f}, \"load_gbps\": "
        "{:.4f}, \"raw_write_gbps\": {:.4f}, \"raw_read_gbps\": {:.4f}, \"save_over_raw_write\": {:.4f}, "
        "\"load_over_raw_read\": {:.4f}, \"step_ms\": {:.3f}, \"step_ms_save_in_flight\": {:.3f}, "
        "\"steps_in_flight\": {}, \"async_step_ratio\": {:.4f}}}\n",
        world.size, engine.stats().total_elems, total_bytes, save_gbps, load_gbps, raw_write_gbps, raw_read_gbps,
        save_gbps / raw_write_gbps, load_gbps / raw_read_gbps, plain_step_s * 1e3, flight_step_s * 1e3, steps_in_flight,
        ratio);
    return;
  }
  fmt::print("zero3-bench checkpoint: {}, {} params, {} ranks; {:.1f} MB of state in {}\n", trainer.model().describe(),
             engine.stats().total_elems, world.size, gb * 1e3, root.string());
  fmt::print("| | GB/s | vs plain |\n|---|---|---|\n");
  fmt::print("| save (snapshot, write, fsync, commit) | {:.3f} | {:.2f} |\n", save_gbps, save_gbps / raw_write_gbps);
  fmt::print("| plain sequential write + fsync | {:.3f} | 1.00 |\n", raw_write_gbps);
  fmt::print("| load (cold cache, checksums verified) | {:.3f} | {:.2f} |\n", load_gbps, load_gbps / raw_read_gbps);
  fmt::print("| plain sequential read (cold cache) | {:.3f} | 1.00 |\n", raw_read_gbps);
  fmt::print(
      "step time: {:.2f} ms without a save, {:.2f} ms while an async save is in flight ({} steps): ratio {:.3f}\n",
      plain_step_s * 1e3, flight_step_s * 1e3, steps_in_flight, ratio);
}

}  // namespace

void add_bench_checkpoint_command(CLI::App& app) {
  auto opt = std::make_shared<CheckpointBenchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "checkpoint", "Checkpoint save/load GB/s vs plain sequential I/O, and the step-time cost of an async save");
  bench::add_json_flag(*cmd, opt->json);
  cmd->add_option("--dir", opt->dir, "Where to write (default: a fresh temporary directory, removed after)");
  add_model_shape_options(*cmd, opt->shape, false);
  bench::add_repeats_option(*cmd, opt->repeats, "Rounds of save, plain write, load, plain read (best of each)", 1000);
  bench::add_steps_option(*cmd, opt->steps, "Steps timed without a save", 100000);
  cmd->callback([opt] { run(*opt); });
}

}  // namespace zero3::tools
