// What the MPI engine tests build their engines from: ConfigText, a DeepSpeed config assembled from a few
// fields for this job's world size and the device ZERO3_TEST_DEVICE names (device_staging.hpp), and
// make_engine, an engine on the job's world and bootstrap (mpi_test_env.hpp) with the test's units
// declared; and this rank's optimizer state read back whole. A test sets only the fields it is about.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero3/config/config.hpp"
#include "zero3/engine/engine.hpp"

namespace zero3::test {

struct ConfigText {
  int train_batch = 0;  // train_batch_size over all ranks; 0 leaves it out: one sample per rank and micro-step
  int gas = 1;          // gradient_accumulation_steps
  std::string optimizer = R"({"type": "AdamW", "params": {"lr": 0.001}})";  // empty: no "optimizer" block
  std::string scheduler;                                                    // a "scheduler" object, or empty for none
  std::string precision;    // a precision block, e.g. R"("bf16": {"enabled": true})"
  std::string top;          // more top-level keys, e.g. R"("wall_clock_breakdown": true)"
  double clipping = 0.0;    // gradient_clipping
  int stage = 3;            // zero_optimization.stage
  std::string zero;         // more zero_optimization keys, e.g. R"("stage3_param_persistence_threshold": 200)"
  std::string zero3_extra;  // more keys of the "zero3" block, e.g. R"("pinned_memory_budget_gb": 1)"
  std::uint64_t seed = 42;  // zero3.seed: the params' initial values
  // Keys the parser knows but zero3 does not implement are refused here unless this is set, for the tests
  // of the engine's own refusal.
  bool allow_not_implemented = false;

  // The config as JSON, for this job's world size.
  std::string json() const;
  // Parsed as a user's file would be; a config the parser rejects is the test's mistake (std::runtime_error
  // with the diagnostics and the text).
  config::Config parse() const;
};

struct EngineOptions {
  // Added in this order, then the engine is finalized; empty: the engine comes back unfinalized, for the
  // test to declare its units itself.
  std::vector<UnitSpec> units = {};
  // true: the test makes the device (CUDA device local_rank modulo the visible ones, or the host) and hands
  // it over in EngineResources, as an embedder may; false: the engine makes the one its config names.
  bool device_from_test = false;
};

// An engine for `config` on the job's world and bootstrap.
std::unique_ptr<Engine> make_engine(const config::Config& config, const EngineOptions& options = {});

// Every byte of this rank's params, master and moments (read_state over the slices it keeps), for checks
// that a step changed nothing, or something.
std::vector<std::byte> state_bytes(Engine& e);
// This rank's kept elements of an fp32 kind (master, exp_avg, exp_avg_sq), in local_slices order.
std::vector<float> local_floats(Engine& e, TensorKind kind);

// A directory for NVMe offload's files, shared by the job's ranks (each makes its own directory inside),
// under the working directory (the build tree: a disk, where /tmp may be a tmpfs without O_DIRECT).
std::string nvme_test_directory();
// Whether every directory NVMe offload made for `rank` of this process (zero3-<host>-<pid>-<n>-rank<r>) is gone.
bool nvme_rank_directory_removed(const std::string& dir, int rank);

}  // namespace zero3::test
