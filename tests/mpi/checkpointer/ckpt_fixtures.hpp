// What the Checkpointer tests share: a directory every rank sees, snapshots of every tensor an engine holds
// (through gather_tensor) compared bit for bit, values computed here for read_state/write_state, the
// transformer's units (some frozen, or re-initialized), training steps with an optional fp16 overflow, and
// the check of a committed save's report against its directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>  // mkdtemp
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "../engine_trainer.hpp"
#include "zero3/ckpt/checkpointer.hpp"
#include "zero3/core/error.hpp"

// Every expectation comes from an independent run or from values these files compute: tensors are read
// back with gather_tensor (or through a GatherScope, which is what compute sees). Collectives are
// unconditional on every rank; results are checked with CHECK after them (tests/support/mpi_test_env.hpp).
namespace zero3::test::ckpt_fixtures {

using namespace engine_trainer;
namespace fs = std::filesystem;
using Json = nlohmann::json;

inline const std::string kVictim = "blocks.0.mlp.fc.weight";  // the fp16 cases' overflow lands here

comm::Bootstrap& boot();

// A fresh directory every rank sees: rank 0 makes it (mkdtemp) and broadcasts its path. Removed when the
// test ends, after every rank is done with it.
class SharedTempDir {
 public:
  SharedTempDir() {
    std::vector<std::byte> bytes(4096);
    if (world_rank() == 0) {
      std::string name = (fs::temp_directory_path() / "zero3_ckpt_test.XXXXXX").string();
      if (mkdtemp(name.data()) != nullptr && name.size() < bytes.size()) {
        std::memcpy(bytes.data(), name.data(), name.size());
      }
    }
    boot().broadcast(bytes, 0);
    path_ = std::string(reinterpret_cast<const char*>(bytes.data()));
    if (path_.empty()) throw Error("SharedTempDir: rank 0 could not make a temporary directory");
  }
  ~SharedTempDir() {
    try {
      boot().barrier();
      std::error_code ec;
      if (world_rank() == 0) fs::remove_all(path_, ec);
    } catch (...) {  // a destructor never throws; a leftover directory in /tmp is harmless
    }
  }
  SharedTempDir(const SharedTempDir&) = delete;
  SharedTempDir& operator=(const SharedTempDir&) = delete;

  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ---- what the engines hold

bool same_bits(float a, float b);
std::string describe(const TrainingState& s);

// Every tensor of an engine as gather_tensor assembles it (collective): each param's "param" and "master"
// (a frozen param's master is its param widened) and each moment the optimizer keeps.
struct Snapshot {
  std::vector<std::string> names;  // "param/kind"
  std::vector<std::vector<float>> tensors;
  TrainingState training;
};

// The kinds gather_tensor can assemble for `p`: param, master, and the moments the optimizer keeps.
std::vector<TensorKind> kinds_of(Engine& e, const ParamSpec& p);
Snapshot snapshot(Engine& e);
// The number of tensors that are not bitwise equal (the first few named); a different tensor list counts
// as everything differing.
int count_differences(const Snapshot& got, const Snapshot& want, const std::string& what);

// ---- values computed here, for read_state/write_state and the tiny-staging save

// A value for element `i` of (param, kind) in [-2, 2], never zero; `bf16_exact`: representable in bf16.
float test_value(std::string_view param, TensorKind kind, std::uint64_t i, bool bf16_exact);
DType dtype_of(Engine& e, TensorKind kind);
// test_value for `slices` of `kind`, back to back in the engine's dtype for that kind.
std::vector<std::byte> value_bytes(Engine& e, TensorKind kind, const std::vector<ParamSlice>& slices);
std::vector<ParamSlice> trainable_only(const std::vector<ParamSlice>& slices);
// Writes test_value into every tensor the rank keeps (write_state; rank-local).
void write_test_values(Engine& e);
// The snapshot an engine holding test_value everywhere has, computed here (bf16-exact values, so every
// param dtype holds them exactly).
Snapshot expected_values(Engine& e, const TrainingState& training);

// ---- engines and models

ParamSpec spec(std::string name, std::vector<std::int64_t> shape, bool trainable = true);
ParamSpec* find_spec(std::vector<UnitSpec>& units, std::string_view name);
// The transformer's units; `frozen`: a few params trainable = false, in the persistent units (input,
// head: under the default persistence threshold of 200) and in the sharded blocks.
std::vector<UnitSpec> transformer_units(const model::ModelConfig& mc, bool frozen);
// The same units with other initial values: an engine that loads a checkpoint must end up with the
// checkpoint's values for every param, frozen ones included, not the ones it started with.
std::vector<UnitSpec> reinitialized(std::vector<UnitSpec> units);
// Optimizer steps [from, to) with the step's data; `overflow`: steps whose gradient gets an Inf (fp16).
std::vector<StepResult> train_steps(EngineTrainer& t, std::int64_t from, std::int64_t to,
                                    const std::set<std::int64_t>& overflow = {});
// Checks a committed save's report against the directory: ok, the tag, one data file per rank whose
// sizes add up to the report's bytes.
void check_report(const ckpt::SaveReport& r, const fs::path& root, const std::string& tag);

}  // namespace zero3::test::ckpt_fixtures
