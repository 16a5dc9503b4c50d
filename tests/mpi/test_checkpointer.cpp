// The Checkpointer (zero3/ckpt/checkpointer.hpp) on the engine's checkpoint API, as a trainer that embeds
// the engine uses it, at every world size the binary runs with: exact resume against an uninterrupted run
// (sync and async saves; AdamW + WarmupLR, bf16 + CPU offload, fp16 with overflow skips, Lion, Adagrad,
// frozen params, offload_param with persistent units), loads that conflict with the job refused with the
// engine left bitwise untouched, local_slices coverage and read_state/write_state checked against values
// computed here, a 1-byte staging area, and the order of reports of consecutive saves.
//
// Every expectation comes from an independent run or from values this file computes: tensors are read
// back with gather_tensor (or through a GatherScope, which is what compute sees). Collectives are
// unconditional on every rank; results are checked with CHECK after them (tests/support/mpi_test_env.hpp).
#include <fmt/format.h>
#include <unistd.h>  // dup, dup2

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>  // mkdtemp
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "engine_trainer.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/checkpointer.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"

using namespace zero3;
using namespace zero3::test::engine_trainer;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;
using Json = nlohmann::json;

namespace {

constexpr std::int64_t kSteps = 6;
constexpr std::int64_t kSaveAt = 3;
constexpr std::size_t kMiB = std::size_t{1} << 20;
const std::string kVictim = "blocks.0.mlp.fc.weight";  // the fp16 cases' overflow lands here

comm::Bootstrap& boot() {
  return *env().bootstrap;
}

// ---- collectives over the job's bootstrap

// Every rank's string, in rank order.
std::vector<std::string> gather_strings(const std::string& mine) {
  const std::uint64_t n = mine.size();
  std::vector<std::byte> size(sizeof n);
  std::memcpy(size.data(), &n, sizeof n);
  const std::vector<std::byte> sizes = boot().all_gather(size);
  std::vector<std::uint64_t> lengths(static_cast<std::size_t>(world_size()));
  std::uint64_t longest = 1;  // never an empty all_gather
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    std::memcpy(&lengths[r], sizes.data() + r * sizeof n, sizeof n);
    longest = std::max(longest, lengths[r]);
  }
  std::vector<std::byte> padded(longest);
  std::memcpy(padded.data(), mine.data(), mine.size());
  const std::vector<std::byte> all = boot().all_gather(padded);
  std::vector<std::string> out;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    out.emplace_back(reinterpret_cast<const char*>(all.data()) + r * longest, lengths[r]);
  }
  return out;
}

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

bool same_bits(float a, float b) {
  return float_bits(a) == float_bits(b);
}

std::string describe(const TrainingState& s) {
  return fmt::format(
      "global_step {}, skipped_steps {}, applied_steps {}, lr_iteration {}, loss_scale {}, scaler_iteration {}, "
      "scaler_last_overflow {}, scaler_hysteresis_left {}",
      s.global_step, s.skipped_steps, s.applied_steps, s.lr_iteration, s.loss_scale, s.scaler_iteration,
      s.scaler_last_overflow, s.scaler_hysteresis_left);
}

// Every tensor of an engine as gather_tensor assembles it (collective): each param's "param" and "master"
// (a frozen param's master is its param widened) and each moment the optimizer keeps.
struct Snapshot {
  std::vector<std::string> names;  // "param/kind"
  std::vector<std::vector<float>> tensors;
  TrainingState training;
};

std::vector<TensorKind> kinds_of(Engine& e, const ParamSpec& p) {
  std::vector<TensorKind> kinds{TensorKind::param, TensorKind::master};
  if (!p.trainable) return kinds;
  for (const TensorKind k : {TensorKind::exp_avg, TensorKind::exp_avg_sq}) {
    if (e.state().keeps_state(k)) kinds.push_back(k);
  }
  return kinds;
}

Snapshot snapshot(Engine& e) {
  Snapshot s;
  for (const std::string& unit : e.unit_names()) {
    for (const ParamSpec& p : e.unit_params(unit)) {
      for (const TensorKind k : kinds_of(e, p)) {
        s.names.push_back(fmt::format("{}/{}", p.name, tensor_kind_name(k)));
        s.tensors.push_back(e.gather_tensor(p.name, k));
      }
    }
  }
  s.training = e.state().training_state();
  return s;
}

// The number of tensors that are not bitwise equal (the first few named); a different tensor list counts
// as everything differing.
int count_differences(const Snapshot& got, const Snapshot& want, const std::string& what) {
  if (got.names != want.names) {
    UNSCOPED_INFO(
        fmt::format("{}: the tensors differ: {} vs {}", what, fmt::join(got.names, " "), fmt::join(want.names, " ")));
    return static_cast<int>(std::max(got.names.size(), want.names.size()));
  }
  int differing = 0;
  for (std::size_t t = 0; t < got.tensors.size(); ++t) {
    const std::vector<float>& a = got.tensors[t];
    const std::vector<float>& b = want.tensors[t];
    std::size_t at = 0;
    while (at < a.size() && at < b.size() && same_bits(a[at], b[at])) ++at;
    if (at == a.size() && a.size() == b.size()) continue;
    if (++differing <= 4) {
      UNSCOPED_INFO(fmt::format("{}: {} differs at [{}] of {}: {:.9g} vs {:.9g}", what, got.names[t], at, a.size(),
                                at < a.size() ? a[at] : 0.0f, at < b.size() ? b[at] : 0.0f));
    }
  }
  return differing;
}

// ---- values this file computes, for read_state/write_state and the tiny-staging save

// A value for element `i` of (param, kind) in [-2, 2), never zero; `bf16_exact`: representable in bf16.
float test_value(std::string_view param, TensorKind kind, std::uint64_t i, bool bf16_exact) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a of the name, then splitmix64 of (name, kind, i)
  for (const char c : param) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  std::uint64_t z = h + (static_cast<std::uint64_t>(kind) + 1) * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  float v = static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 24) * 4.0 - 2.0);
  if (v == 0.0f) v = 0.75f;
  if (bf16_exact) v = bits_float(float_bits(v) & 0xffff0000u);
  return v;
}

DType dtype_of(Engine& e, TensorKind kind) {
  return kind == TensorKind::param ? e.config().model_dtype() : DType::f32;
}

// test_value for `slices` of `kind`, back to back in the engine's dtype for that kind.
std::vector<std::byte> value_bytes(Engine& e, TensorKind kind, const std::vector<ParamSlice>& slices) {
  const DType dtype = dtype_of(e, kind);
  std::vector<std::byte> out(e.state().state_bytes(kind, slices));
  std::size_t at = 0;
  for (const ParamSlice& s : slices) {
    for (std::uint64_t j = 0; j < s.count; ++j) {
      store_from_float(out.data() + at, dtype, j, test_value(s.param, kind, s.first + j, true));
    }
    at += s.count * size_of(dtype);
  }
  return out;
}

std::vector<ParamSlice> trainable_only(const std::vector<ParamSlice>& slices) {
  std::vector<ParamSlice> out;
  for (const ParamSlice& s : slices) {
    if (s.trainable) out.push_back(s);
  }
  return out;
}

// Writes test_value into every tensor the rank keeps (write_state; rank-local).
void write_test_values(Engine& e) {
  const std::vector<ParamSlice> kept = e.state().local_slices(false);
  for (const TensorKind k : {TensorKind::param, TensorKind::master, TensorKind::exp_avg, TensorKind::exp_avg_sq}) {
    if (!e.state().keeps_state(k)) continue;
    const std::vector<ParamSlice> slices = k == TensorKind::param ? kept : trainable_only(kept);
    e.state().write_state(k, slices, value_bytes(e, k, slices));
  }
}

// The snapshot an engine holding test_value everywhere has, computed here (bf16-exact values, so every
// param dtype holds them exactly).
Snapshot expected_values(Engine& e, const TrainingState& training) {
  Snapshot s;
  for (const std::string& unit : e.unit_names()) {
    for (const ParamSpec& p : e.unit_params(unit)) {
      for (const TensorKind k : kinds_of(e, p)) {
        const TensorKind source = p.trainable ? k : TensorKind::param;  // a frozen master is its param
        std::vector<float> v(p.numel());
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = test_value(p.name, source, i, true);
        s.names.push_back(fmt::format("{}/{}", p.name, tensor_kind_name(k)));
        s.tensors.push_back(std::move(v));
      }
    }
  }
  s.training = training;
  return s;
}

// ---- engines and models

ParamSpec spec(std::string name, std::vector<std::int64_t> shape, bool trainable = true) {
  ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.init = ParamInit::normal({.std = 0.5});
  p.trainable = trainable;
  return p;
}

ParamSpec* find_spec(std::vector<UnitSpec>& units, std::string_view name) {
  for (UnitSpec& u : units) {
    for (ParamSpec& p : u.params) {
      if (p.name == name) return &p;
    }
  }
  throw Error(fmt::format("test model has no param '{}'", name));
}

// The transformer's units; `frozen`: a few params trainable = false, in the persistent units (input,
// head: under the default persistence threshold of 200) and in the sharded blocks.
std::vector<UnitSpec> transformer_units(const model::ModelConfig& mc, bool frozen) {
  std::vector<UnitSpec> units = model::model_units(mc);
  if (frozen) {
    for (const char* name :
         {"input.bias", "blocks.0.ln1.weight", "blocks.1.mlp.fc.weight", "ln_f.weight", "head.bias"}) {
      find_spec(units, name)->trainable = false;
    }
  }
  return units;
}

// The same units with other initial values: an engine that loads a checkpoint must end up with the
// checkpoint's values for every param, frozen ones included, not the ones it started with.
std::vector<UnitSpec> reinitialized(std::vector<UnitSpec> units) {
  for (UnitSpec& u : units) {
    for (ParamSpec& p : u.params) p.init = ParamInit::uniform({.low = -1.0, .high = 1.0});
  }
  return units;
}

// Optimizer steps [from, to) with the step's data; `overflow`: steps whose gradient gets an Inf (fp16).
std::vector<StepResult> train_steps(EngineTrainer& t, std::int64_t from, std::int64_t to,
                                    const std::set<std::int64_t>& overflow = {}) {
  const auto gas = static_cast<int>(t.engine().config().batch.gradient_accumulation_steps);
  std::vector<StepResult> out;
  for (std::int64_t s = from; s < to; ++s) {
    StepResult r;
    for (int m = 0; m < gas; ++m) {
      t.forward_backward(s, m, overflow.contains(s) && m == 0 ? kVictim : std::string());
      r = t.engine().step();
    }
    out.push_back(r);
  }
  return out;
}

// Checks a committed save's report against the directory: ok, the tag, one data file per rank whose
// sizes add up to the report's bytes.
void check_report(const ckpt::SaveReport& r, const fs::path& root, const std::string& tag) {
  INFO(fmt::format("save '{}': {}", r.tag, r.error));
  CHECK(r.ok);
  CHECK(r.tag == tag);
  CHECK(r.dir == ckpt::checkpoint_dir(root, tag));
  std::uint64_t bytes = 0;
  int files = 0;
  std::error_code ec;
  for (const fs::directory_entry& f : fs::directory_iterator(r.dir, ec)) {
    if (f.path().extension() != ".bin") continue;
    bytes += f.file_size();
    ++files;
  }
  CHECK(files == world_size());
  CHECK(bytes == r.bytes);
  CHECK(fs::exists(r.dir / "manifest.json"));
}

// ---- 1. exact resume

struct ResumeCase {
  std::string name;
  ConfigText text = trainer_config();
  bool frozen = false;
  std::set<std::int64_t> overflow;
};

void check_same_step(const StepResult& a, const StepResult& c, std::int64_t step) {
  INFO(fmt::format("step {}: applied {} vs {}, lr {} vs {}, loss scale {} -> {} vs {} -> {}, grad norm {} vs {}", step,
                   a.applied, c.applied, a.lr, c.lr, a.loss_scale, a.next_loss_scale, c.loss_scale, c.next_loss_scale,
                   a.grad_norm, c.grad_norm));
  CHECK(a.applied == c.applied);
  CHECK(a.lr == c.lr);
  CHECK(a.loss_scale == c.loss_scale);
  CHECK(a.next_loss_scale == c.next_loss_scale);
  CHECK(((std::isnan(a.grad_norm) && std::isnan(c.grad_norm)) || a.grad_norm == c.grad_norm));
  CHECK(a.global_step == c.global_step);
  CHECK(a.skipped_steps == c.skipped_steps);
}

// A trains kSteps; B trains kSaveAt and saves (async: B trains on while its writer runs); C, made with
// other initial values, loads and trains the remaining steps on the same data. A and C must agree bitwise.
void run_resume(const ResumeCase& rc, bool async) {
  const std::string what = fmt::format("[np{}] {} ({} save)", world_size(), rc.name, async ? "async" : "sync");
  INFO(what);
  const config::Config cfg = rc.text.parse();
  const model::ModelConfig mc = transformer();
  const std::vector<UnitSpec> units = transformer_units(mc, rc.frozen);
  const SharedTempDir root;
  const Json trainer_state = {{"next_step", kSaveAt}, {"data_seed", kDataSeed}, {"case", rc.name}};

  EngineTrainer a(cfg, mc, units);
  const std::vector<StepResult> a_steps = train_steps(a, 0, kSteps, rc.overflow);
  const Snapshot expected = snapshot(a.engine());

  TrainingState saved_training;
  {
    EngineTrainer b(cfg, mc, units);
    train_steps(b, 0, kSaveAt, rc.overflow);
    const Snapshot at_save = snapshot(b.engine());
    saved_training = at_save.training;
    CHECK(count_differences(at_save, expected, what + ": B at the save vs A at the end") > 0);  // training moves
    ckpt::CheckpointerOptions options;
    options.async = async;
    ckpt::Checkpointer ck(b.engine(), env().bootstrap, options);
    ck.save(root.path(), "step3", kSaveAt, trainer_state);
    std::vector<ckpt::SaveReport> reports;
    if (async) {  // the snapshot is taken: training goes on while the writer runs, polled once per step
      CHECK(ck.in_flight());
      for (std::int64_t s = kSaveAt; s < kSteps; ++s) {
        train_steps(b, s, s + 1, rc.overflow);
        for (ckpt::SaveReport& r : ck.poll()) reports.push_back(std::move(r));
      }
    }
    for (ckpt::SaveReport& r : ck.wait()) reports.push_back(std::move(r));
    CHECK(!ck.in_flight());
    CHECK(reports.size() == 1);
    if (!reports.empty()) check_report(reports[0], root.path(), "step3");
    if (async) CHECK(count_differences(snapshot(b.engine()), expected, what + ": B after the async save") == 0);
  }
  CHECK(ckpt::read_latest(root.path()).value_or("") == "step3");

  EngineTrainer c(cfg, mc, reinitialized(units));
  ckpt::Checkpointer ck(c.engine(), env().bootstrap);
  const ckpt::LoadResult loaded = ck.load(root.path());
  CHECK(loaded.tag == "step3");
  CHECK(loaded.step == kSaveAt);
  CHECK(loaded.saved_world_size == world_size());
  CHECK(loaded.trainer_state == trainer_state);
  CHECK(loaded.bytes_read > 0);
  CHECK(describe(c.engine().state().training_state()) == describe(saved_training));
  const std::vector<StepResult> c_steps = train_steps(c, kSaveAt, kSteps, rc.overflow);
  for (std::size_t i = 0; i < c_steps.size(); ++i) {
    check_same_step(a_steps[static_cast<std::size_t>(kSaveAt) + i], c_steps[i], kSaveAt + static_cast<std::int64_t>(i));
  }
  const Snapshot resumed = snapshot(c.engine());
  const int differing = count_differences(resumed, expected, what + ": resumed C vs uninterrupted A");
  CHECK(differing == 0);
  CHECK(describe(resumed.training) == describe(expected.training));
  if (world_rank() == 0) {
    std::printf("%-72s %d of %zu tensors differ (bitwise)\n", what.c_str(), differing, expected.tensors.size());
    std::fflush(stdout);
  }
}

std::vector<ResumeCase> resume_cases() {
  const std::string offload_opt = R"("offload_optimizer": {"device": "cpu", "pin_memory": true})";
  const std::string offload_param = R"("offload_param": {"device": "cpu", "pin_memory": true})";
  std::vector<ResumeCase> cases;
  {
    ResumeCase c;
    c.name = "AdamW fp32, WarmupLR, clipping";
    c.text.scheduler =
        R"({"type": "WarmupLR", "params": {"warmup_min_lr": 1e-4, "warmup_max_lr": 3e-3, "warmup_num_steps": 8}})";
    c.text.clipping = 0.5;
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "bf16, offload_optimizer cpu";
    c.text.precision = R"("bf16": {"enabled": true})";
    c.text.zero += ", " + offload_opt;
    c.text.clipping = 0.5;
    cases.push_back(c);
  }
  {
    // Overflows before and after the save: the scaler's hysteresis, window and last overflow must resume.
    ResumeCase c;
    c.name = "fp16 dynamic loss scaling, overflows at steps 1 and 4";
    c.text.precision = R"("fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 8,
                          "loss_scale_window": 2, "hysteresis": 2, "min_loss_scale": 1})";
    c.overflow = {1, 4};
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "Lion";
    c.text.optimizer = R"({"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.1}})";
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "Adagrad";
    c.text.optimizer = R"({"type": "Adagrad", "params": {"lr": 1e-2, "weight_decay": 0.01}})";
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "frozen params, persistent units, gradient accumulation 2";
    c.frozen = true;
    c.text.train_batch = 24;
    c.text.gas = 2;
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "offload_param cpu, persistent units";
    c.text.zero += ", " + offload_param;
    cases.push_back(c);
  }
  {
    ResumeCase c;
    c.name = "bf16, offload_param + offload_optimizer, frozen params";
    c.frozen = true;
    c.text.precision = R"("bf16": {"enabled": true})";
    c.text.zero += ", " + offload_opt + ", " + offload_param;
    cases.push_back(c);
  }
  return cases;
}

}  // namespace

TEST_CASE("a checkpoint resumes training exactly: sync and async saves", "[ckpt][resume]") {
  for (const ResumeCase& c : resume_cases()) {
    for (const bool async : {true, false}) run_resume(c, async);
  }
}

// ---- 2. refused loads

namespace {

// Loads `root` into `t`'s engine, expecting a CheckpointError whose message holds every needle, and the
// engine's state bitwise unchanged.
void check_refused(EngineTrainer& t, const fs::path& root, const std::string& what,
                   const std::vector<std::string>& needles) {
  INFO(what);
  const Snapshot before = snapshot(t.engine());
  std::string message;
  bool refused = false;
  try {
    ckpt::Checkpointer ck(t.engine(), env().bootstrap);
    ck.load(root);
  } catch (const CheckpointError& e) {
    refused = true;
    message = e.what();
  } catch (const std::exception& e) {
    message = fmt::format("not a CheckpointError: {}", e.what());
  }
  INFO(message);
  CHECK(refused);
  for (const std::string& n : needles) CHECK_THAT(message, Contains(n));
  const Snapshot after = snapshot(t.engine());
  CHECK(count_differences(after, before, what + ": after the refused load") == 0);
  CHECK(describe(after.training) == describe(before.training));
}

}  // namespace

TEST_CASE("a checkpoint that conflicts with the job is refused before anything is written", "[ckpt][errors]") {
  const model::ModelConfig mc = transformer();
  const std::vector<UnitSpec> units = transformer_units(mc, false);
  const config::Config adamw = trainer_config().parse();
  const SharedTempDir root;
  {
    EngineTrainer src(adamw, mc, units);
    train_steps(src, 0, 2);
    ckpt::CheckpointerOptions options;
    options.async = false;
    ckpt::Checkpointer ck(src.engine(), env().bootstrap, options);
    ck.save(root.path(), "adamw", 2, Json::object());
    const std::vector<ckpt::SaveReport> reports = ck.poll();
    CHECK(reports.size() == 1);
    if (!reports.empty()) check_report(reports[0], root.path(), "adamw");
  }

  {  // another optimizer: its state means something else
    ConfigText lion = trainer_config();
    lion.optimizer = R"({"type": "Lion", "params": {"lr": 1e-3, "weight_decay": 0.1}})";
    EngineTrainer t(lion.parse(), mc, units);
    train_steps(t, 0, 1);  // moments and params that differ from the checkpoint's and from init
    check_refused(t, root.path(), "Lion job", {"optimizer"});
  }
  {  // same number of elements, another shape (the test model only reads the elements): trained first
    std::vector<UnitSpec> changed = units;
    find_spec(changed, "head.weight")->shape = {16, 5};
    EngineTrainer t(adamw, mc, changed);
    train_steps(t, 0, 1);
    check_refused(t, root.path(), "head.weight transposed", {"head.weight", "shape"});
  }
  {
    std::vector<UnitSpec> changed = units;
    find_spec(changed, "blocks.1.mlp.fc.bias")->shape = {33};
    EngineTrainer t(adamw, mc, changed);
    check_refused(t, root.path(), "blocks.1.mlp.fc.bias longer", {"blocks.1.mlp.fc.bias", "shape"});
  }
  {  // a param the checkpoint does not have
    std::vector<UnitSpec> changed = units;
    changed.back().params.push_back(spec("head.extra_scale", {7}));
    EngineTrainer t(adamw, mc, changed);
    check_refused(t, root.path(), "extra param in the job", {"head.extra_scale"});
  }
  {  // a param of the checkpoint the job does not have
    std::vector<UnitSpec> changed = units;
    std::erase_if(changed[2].params, [](const ParamSpec& p) { return p.name == "blocks.1.ln2.bias"; });
    EngineTrainer t(adamw, mc, changed);
    check_refused(t, root.path(), "param missing from the job", {"blocks.1.ln2.bias"});
  }
  {
    std::vector<UnitSpec> changed = units;
    find_spec(changed, "blocks.0.ln1.weight")->trainable = false;
    EngineTrainer t(adamw, mc, changed);
    check_refused(t, root.path(), "trainable in the checkpoint, frozen in the job", {"blocks.0.ln1.weight", "frozen"});
  }
}

// ---- 3. local_slices, read_state, write_state

namespace {

// Odd sizes (uneven splits and padding at 3 ranks), a scalar, zero-size params, frozen params; units
// "small" (49 elements) and "tail" (3) persistent under a threshold of 60, "embed" and "block" sharded.
std::vector<UnitSpec> odd_units() {
  return {
      {"embed",
       {spec("embed.weight", {37, 11}), spec("embed.scale", {}), spec("embed.empty", {0, 4}),
        spec("embed.pos", {13, 3}, false)}},
      {"small", {spec("small.w", {5, 7}), spec("small.b", {5}), spec("small.frozen", {9}, false)}},
      {"block",
       {spec("block.a", {101, 3}), spec("block.b", {1}), spec("block.c", {257}), spec("block.d", {31, 5}, false)}},
      {"tail", {spec("tail.w", {3}), spec("tail.v", {0})}},
  };
}
const std::set<std::string> kPersistentUnits = {"small", "tail"};

std::string encode(const std::vector<ParamSlice>& slices) {
  std::string s;
  for (const ParamSlice& p : slices) s += fmt::format("{} {} {} {}\n", p.param, p.first, p.count, p.trainable ? 1 : 0);
  return s;
}

std::vector<ParamSlice> decode(const std::string& text) {
  std::vector<ParamSlice> out;
  std::istringstream in(text);
  ParamSlice s;
  int trainable = 0;
  while (in >> s.param >> s.first >> s.count >> trainable) {
    s.trainable = trainable != 0;
    out.push_back(s);
  }
  return out;
}

// Per param, how many times each element is named by `slices` (of every rank); problems go to `errors`.
using Coverage = std::map<std::string, std::vector<int>>;
Coverage cover(const std::vector<UnitSpec>& units, const std::vector<std::vector<ParamSlice>>& per_rank,
               std::vector<std::string>& errors) {
  Coverage c;
  std::map<std::string, bool> trainable;
  for (const UnitSpec& u : units) {
    for (const ParamSpec& p : u.params) {
      c[p.name].assign(p.numel(), 0);
      trainable[p.name] = p.trainable;
    }
  }
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    for (const ParamSlice& s : per_rank[r]) {
      const auto it = c.find(s.param);
      if (it == c.end()) {
        errors.push_back(fmt::format("rank {}: unknown param '{}'", r, s.param));
        continue;
      }
      if (s.first + s.count > it->second.size()) {
        errors.push_back(fmt::format("rank {}: [{}, {}) past the end of '{}' ({})", r, s.first, s.first + s.count,
                                     s.param, it->second.size()));
        continue;
      }
      if (s.trainable != trainable[s.param]) errors.push_back(fmt::format("rank {}: '{}' trainable flag", r, s.param));
      for (std::uint64_t i = s.first; i < s.first + s.count; ++i) ++it->second[i];
    }
  }
  return c;
}

// Collective: checks that the owned slices of all ranks name every element once, and that the kept ones
// are the owned ones plus the persistent units whole on every rank.
void check_coverage(Engine& e, const std::vector<UnitSpec>& units, const std::string& what) {
  const std::vector<ParamSlice> owned = e.state().local_slices(true);
  const std::vector<ParamSlice> kept = e.state().local_slices(false);
  const std::vector<std::string> owned_all = gather_strings(encode(owned));
  const std::vector<std::string> kept_all = gather_strings(encode(kept));
  std::vector<std::string> errors;
  std::vector<std::vector<ParamSlice>> owned_by_rank;
  std::vector<std::vector<ParamSlice>> kept_by_rank;
  for (const std::string& s : owned_all) owned_by_rank.push_back(decode(s));
  for (const std::string& s : kept_all) kept_by_rank.push_back(decode(s));
  const int w = world_size();
  const Coverage owned_cover = cover(units, owned_by_rank, errors);
  const Coverage kept_cover = cover(units, kept_by_rank, errors);
  for (const UnitSpec& u : units) {
    const bool persistent = w > 1 && kPersistentUnits.contains(u.name);
    for (const ParamSpec& p : u.params) {
      const std::vector<int>& o = owned_cover.at(p.name);
      const std::vector<int>& k = kept_cover.at(p.name);
      for (std::size_t i = 0; i < o.size(); ++i) {
        if (o[i] != 1) {
          errors.push_back(fmt::format("element {} of '{}' is owned {} times", i, p.name, o[i]));
          break;
        }
        if (k[i] != (persistent ? w : 1)) {
          errors.push_back(fmt::format("element {} of '{}' (unit '{}') is kept by {} ranks", i, p.name, u.name, k[i]));
          break;
        }
      }
    }
  }
  // Each rank keeps what it owns: per rank, owned elements are a subset of kept ones.
  for (int r = 0; r < w; ++r) {
    const Coverage o = cover(units, {owned_by_rank[static_cast<std::size_t>(r)]}, errors);
    const Coverage k = cover(units, {kept_by_rank[static_cast<std::size_t>(r)]}, errors);
    for (const auto& [name, counts] : o) {
      for (std::size_t i = 0; i < counts.size(); ++i) {
        if (counts[i] > 0 && k.at(name)[i] == 0) {
          errors.push_back(fmt::format("rank {} owns element {} of '{}' but does not keep it", r, i, name));
          break;
        }
      }
    }
  }
  INFO(fmt::format("{}: {}", what, fmt::join(errors, "; ")));
  CHECK(errors.empty());
}

// Writes test_value into every kept tensor, reads it back (into a poisoned buffer), then checks what
// gather_tensor assembles and what a GatherScope hands to compute (a persistent unit's device copy under
// offload_param included) against test_value. Collective.
void check_round_trip(Engine& e, const std::string& what) {
  INFO(what);
  const std::vector<ParamSlice> kept = e.state().local_slices(false);
  for (const TensorKind k : {TensorKind::param, TensorKind::master, TensorKind::exp_avg, TensorKind::exp_avg_sq}) {
    if (!e.state().keeps_state(k)) continue;
    INFO(tensor_kind_name(k));
    const std::vector<ParamSlice> slices = k == TensorKind::param ? kept : trainable_only(kept);
    const std::vector<std::byte> in = value_bytes(e, k, slices);
    std::vector<std::byte> out(in.size(), std::byte{0xA5});
    std::string error;  // rank-local: caught here so that every rank reaches the collectives below
    try {
      e.state().write_state(k, slices, in);
      e.state().read_state(k, slices, out);
    } catch (const std::exception& ex) {
      error = ex.what();
    }
    INFO(error);
    CHECK(error.empty());
    const bool read_back = out == in;
    CHECK(read_back);
  }
  const Snapshot got = snapshot(e);
  CHECK(count_differences(got, expected_values(e, got.training), what + ": gather_tensor after write_state") == 0);
  // What compute sees: gathered full params (sharded units) and persistent units' params in place.
  std::vector<std::string> wrong;
  {
    Engine::UntracedScope untraced = e.untraced();
    for (const std::string& unit : e.unit_names()) {
      Engine::GatherScope g = e.gather(unit);
      for (const ParamSpec& p : e.unit_params(unit)) {
        const std::vector<float> v = test::download_floats(e.device(), e.compute_stream(), g.param(p.name));
        for (std::size_t i = 0; i < v.size(); ++i) {
          if (!same_bits(v[i], test_value(p.name, TensorKind::param, i, true))) {
            wrong.push_back(fmt::format("{}[{}] = {} (unit '{}')", p.name, i, v[i], unit));
            break;
          }
        }
      }
    }
  }
  INFO(fmt::format("params as compute sees them after write_state: {}", fmt::join(wrong, "; ")));
  CHECK(wrong.empty());
}

// The first element of a param that this rank does not keep, if any.
std::optional<ParamSlice> element_not_kept(Engine& e) {
  const std::vector<ParamSlice> kept = e.state().local_slices(false);
  for (const std::string& unit : e.unit_names()) {
    for (const ParamSpec& p : e.unit_params(unit)) {
      std::vector<bool> have(p.numel(), false);
      for (const ParamSlice& s : kept) {
        if (s.param != p.name) continue;
        for (std::uint64_t i = s.first; i < s.first + s.count; ++i) have[i] = true;
      }
      for (std::size_t i = 0; i < have.size(); ++i) {
        if (!have[i]) return ParamSlice{p.name, i, 1, p.trainable};
      }
    }
  }
  return std::nullopt;
}

}  // namespace

TEST_CASE("local_slices cover every element; read_state and write_state round trip", "[ckpt][slices]") {
  const std::vector<UnitSpec> units = odd_units();
  struct Setup {
    std::string name;
    ConfigText text = trainer_config();
  };
  std::vector<Setup> setups(3);
  for (Setup& s : setups) s.text.zero = R"("stage3_param_persistence_threshold": 60)";
  setups[0].name = "fp32 AdamW";
  setups[1].name = "bf16 AdamW, offload_optimizer + offload_param";
  setups[1].text.precision = R"("bf16": {"enabled": true})";
  setups[1].text.zero += R"(, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})";
  setups[2].name = "fp32 Adagrad";
  setups[2].text.optimizer = R"({"type": "Adagrad", "params": {"lr": 1e-2}})";
  for (const Setup& s : setups) {
    const std::string what = fmt::format("[np{}] {}", world_size(), s.name);
    const config::Config cfg = s.text.parse();
    const std::unique_ptr<Engine> e = make_engine(cfg, {.units = units});
    check_coverage(*e, units, what);
    check_round_trip(*e, what);

    {  // The odd model (a scalar, zero-size and frozen params, uneven splits) through a checkpoint.
      const SharedTempDir root;
      ckpt::CheckpointerOptions options;
      options.async = false;
      ckpt::Checkpointer ck(*e, env().bootstrap, options);
      ck.save(root.path(), "odd", 0, Json::object());
      const std::vector<ckpt::SaveReport> reports = ck.poll();
      CHECK(reports.size() == 1);
      if (!reports.empty()) check_report(reports[0], root.path(), "odd");
      const std::unique_ptr<Engine> fresh = make_engine(cfg, {.units = reinitialized(units)});
      ckpt::Checkpointer(*fresh, env().bootstrap).load(root.path());
      const Snapshot got = snapshot(*fresh);
      CHECK(count_differences(got, expected_values(*fresh, got.training), what + ": loaded odd model") == 0);
    }

    // Misuse, rank-local: slices this rank does not keep, kinds it has no state of, wrong sizes.
    const std::vector<ParamSlice> past_end{{"block.c", 256, 2, true}};
    std::vector<std::byte> two(2 * sizeof(float));
    CHECK_THROWS_AS(e->state().read_state(TensorKind::master, past_end, two), UsageError);
    CHECK_THROWS_AS(e->state().write_state(TensorKind::master, past_end, two), UsageError);
    const std::vector<ParamSlice> unknown{{"block.nope", 0, 1, true}};
    std::vector<std::byte> one(sizeof(float));
    CHECK_THROWS_AS(e->state().read_state(TensorKind::master, unknown, one), UsageError);
    const std::optional<ParamSlice> foreign = element_not_kept(*e);
    CHECK(foreign.has_value() == (world_size() > 1));
    if (foreign) {
      INFO(fmt::format("{}: element {} of '{}', not kept here", what, foreign->first, foreign->param));
      const std::vector<ParamSlice> slices{*foreign};
      CHECK_THROWS_AS(
          e->state().read_state(TensorKind::param, slices,
                                std::span<std::byte>(two).first(e->state().state_bytes(TensorKind::param, slices))),
          UsageError);
      CHECK_THROWS_AS(e->state().write_state(
                          TensorKind::param, slices,
                          std::span<const std::byte>(two).first(e->state().state_bytes(TensorKind::param, slices))),
                      UsageError);
    }
    const std::vector<ParamSlice> frozen{{"small.frozen", 0, 1, false}};
    CHECK_THROWS_AS(e->state().read_state(TensorKind::master, frozen, one), UsageError);
    const std::vector<ParamSlice> trainable = trainable_only(e->state().local_slices(false));
    std::vector<std::byte> fp32(e->state().state_bytes(TensorKind::master, trainable));
    std::vector<std::byte> too_long(fp32.size() + 4);
    CHECK_THROWS_AS(e->state().read_state(TensorKind::master, trainable, too_long), UsageError);
    CHECK_THROWS_AS(e->state().read_state(TensorKind::grad, trainable, fp32), UsageError);
    if (!e->state().keeps_state(TensorKind::exp_avg)) {
      CHECK_THROWS_WITH(e->state().read_state(TensorKind::exp_avg, trainable, fp32), Contains("keeps no"));
    }
  }
}

TEST_CASE("read_state and write_state refuse the middle of an accumulation window", "[ckpt][slices]") {
  ConfigText text = trainer_config();
  text.train_batch = 24;
  text.gas = 2;
  const model::ModelConfig mc = transformer();
  EngineTrainer t(text.parse(), mc, transformer_units(mc, false));
  Engine& e = t.engine();
  const std::vector<ParamSlice> kept = e.state().local_slices(false);
  std::vector<std::byte> buffer(e.state().state_bytes(TensorKind::param, kept));
  t.forward_backward(0, 0);
  const StepResult first = e.step();
  CHECK(!first.boundary);
  CHECK_THROWS_AS(e.state().read_state(TensorKind::param, kept, buffer), UsageError);
  CHECK_THROWS_AS(e.state().write_state(TensorKind::param, kept, buffer), UsageError);
  CHECK_THROWS_AS(e.state().restore_training_state(e.state().training_state()), UsageError);
  t.forward_backward(0, 1);
  CHECK(e.step().boundary);
  CHECK_NOTHROW(e.state().read_state(TensorKind::param, kept, buffer));
}

// ---- 4. a 1-byte staging area

TEST_CASE("a save through a 1-byte staging area is complete and loads exactly", "[ckpt][staging]") {
  // big.w is larger than a staging block (1 MiB) on every rank at 1-4 ranks in its fp32 kinds (master,
  // moments), so blocks must pass one at a time.
  const std::vector<UnitSpec> units = {
      {"big", {spec("big.w", {1200, 1000}), spec("big.b", {999}), spec("big.frozen", {333, 3}, false)}},
      {"small", {spec("small.w", {7, 5}), spec("small.b", {7})}},
  };
  ConfigText text = trainer_config();
  text.precision = R"("bf16": {"enabled": true})";
  const config::Config cfg = text.parse();
  const SharedTempDir root;
  const std::unique_ptr<Engine> src = make_engine(cfg, {.units = units});
  write_test_values(*src);
  TrainingState training;
  training.global_step = 9;
  training.skipped_steps = 2;
  training.applied_steps = 7;
  training.lr_iteration = 9;
  training.loss_scale = 1.0;
  src->state().restore_training_state(training);
  const Snapshot expected = expected_values(*src, training);
  CHECK(count_differences(snapshot(*src), expected, "the source engine") == 0);

  for (const bool async : {false, true}) {
    const std::string tag = async ? "async" : "sync";
    const std::string what = fmt::format("[np{}] staging_bytes 1, {} save", world_size(), tag);
    INFO(what);
    ckpt::CheckpointerOptions options;
    options.async = async;
    options.staging_bytes = 1;
    src->memory().reset_peaks();
    const std::size_t held = src->memory().get(MemoryKind::pageable_host, MemCategory::staging).current_bytes;
    {
      ckpt::Checkpointer ck(*src, env().bootstrap, options);
      ck.save(root.path(), tag, training.global_step, Json{{"tag", tag}});
      const std::vector<ckpt::SaveReport> reports = ck.wait();
      CHECK(reports.size() == 1);
      if (!reports.empty()) check_report(reports[0], root.path(), tag);
    }
    const std::size_t peak = src->memory().get(MemoryKind::pageable_host, MemCategory::staging).peak_bytes - held;
    INFO(fmt::format("staging peak {} bytes", peak));
    CHECK(peak > 0);
    CHECK(peak <= kMiB);  // one block (the smallest, 1 MiB) at a time

    std::string verify_error;
    try {
      ckpt::CheckpointReader(root.path(), tag).verify_all();
    } catch (const std::exception& e) {
      verify_error = e.what();
    }
    CHECK(verify_error.empty());

    const std::unique_ptr<Engine> dst = make_engine(cfg, {.units = [&] {
                                                      std::vector<UnitSpec> u = units;
                                                      for (UnitSpec& unit : u) {
                                                        for (ParamSpec& p : unit.params)
                                                          p.init = ParamInit::uniform({.low = -3.0, .high = 3.0});
                                                      }
                                                      return u;
                                                    }()});
    ckpt::Checkpointer ck(*dst, env().bootstrap, options);  // loads through 1 MiB blocks too
    const ckpt::LoadResult loaded = ck.load(root.path(), tag);
    CHECK(loaded.step == training.global_step);
    CHECK(loaded.trainer_state == Json{{"tag", tag}});
    const Snapshot got = snapshot(*dst);
    const int differing = count_differences(got, expected, what + ": loaded");
    CHECK(differing == 0);
    CHECK(describe(got.training) == describe(training));
    if (world_rank() == 0) {
      std::printf("%-72s %d of %zu tensors differ; staging peak %.2f MiB\n", what.c_str(), differing,
                  expected.tensors.size(), static_cast<double>(peak) / kMiB);
      std::fflush(stdout);
    }
  }
}

// ---- 5. poll, wait and consecutive saves

TEST_CASE("poll reports nothing without a save; a second save waits for the first; reports come in order",
          "[ckpt][poll]") {
  const model::ModelConfig mc = transformer();
  const std::vector<UnitSpec> units = transformer_units(mc, false);
  const config::Config cfg = trainer_config().parse();
  const SharedTempDir root;
  EngineTrainer t(cfg, mc, units);

  ckpt::Checkpointer ck(t.engine(), env().bootstrap);  // async
  CHECK(!ck.in_flight());
  CHECK(ck.poll().empty());
  CHECK(ck.wait().empty());
  train_steps(t, 0, 1);
  CHECK(ck.poll().empty());
  const Snapshot first = snapshot(t.engine());
  ck.save(root.path(), "first", 1, Json{{"n", 1}});
  CHECK(ck.in_flight());
  train_steps(t, 1, 2);  // changes the state under the first save's writer
  const Snapshot second = snapshot(t.engine());
  CHECK(count_differences(second, first, "step 2 vs step 1") > 0);
  ck.save(root.path(), "second", 2, Json{{"n", 2}});
  CHECK(ck.in_flight());
  const std::vector<ckpt::SaveReport> reports = ck.wait();
  CHECK(reports.size() == 2);
  if (reports.size() == 2) {
    check_report(reports[0], root.path(), "first");
    check_report(reports[1], root.path(), "second");
  }
  CHECK(!ck.in_flight());
  CHECK(ck.poll().empty());
  CHECK(ck.wait().empty());
  CHECK(ckpt::read_latest(root.path()).value_or("") == "second");

  // Synchronous: the reports wait for the next poll(), in order.
  ckpt::CheckpointerOptions sync;
  sync.async = false;
  ckpt::Checkpointer sck(t.engine(), env().bootstrap, sync);
  sck.save(root.path(), "third", 2, Json::object());
  CHECK(!sck.in_flight());
  sck.save(root.path(), "fourth", 2, Json::object());
  const std::vector<ckpt::SaveReport> sync_reports = sck.poll();
  CHECK(sync_reports.size() == 2);
  if (sync_reports.size() == 2) {
    check_report(sync_reports[0], root.path(), "third");
    check_report(sync_reports[1], root.path(), "fourth");
  }
  CHECK(sck.poll().empty());
  CHECK(ckpt::read_latest(root.path()).value_or("") == "fourth");

  // Each checkpoint holds the state of its own step.
  for (const auto& [tag, want, n] :
       {std::tuple{"first", &first, 1}, std::tuple{"second", &second, 2}, std::tuple{"fourth", &second, 2}}) {
    EngineTrainer f(cfg, mc, reinitialized(units));
    ckpt::Checkpointer fck(f.engine(), env().bootstrap);
    const ckpt::LoadResult loaded = fck.load(root.path(), tag);
    CHECK(loaded.tag == tag);
    CHECK(loaded.step == n);
    const Snapshot got = snapshot(f.engine());
    CHECK(count_differences(got, *want, fmt::format("loaded '{}'", tag)) == 0);
    CHECK(describe(got.training) == describe(want->training));
  }
}

// ---- 6. misuse by an embedder: a clear error, on every rank

namespace {

// What this process writes to stderr (the log) while `fn` runs.
template <typename Fn>
std::string capture_stderr(Fn&& fn) {
  std::fflush(stderr);
  std::FILE* file = std::tmpfile();
  if (file == nullptr) throw Error("capture_stderr: tmpfile failed");
  const int saved = ::dup(2);
  ::dup2(::fileno(file), 2);
  try {
    fn();
  } catch (...) {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    std::fclose(file);
    throw;
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string text;
  std::rewind(file);
  char chunk[4096];
  for (std::size_t n = 0; (n = std::fread(chunk, 1, sizeof chunk, file)) > 0;) text.append(chunk, n);
  std::fclose(file);
  return text;
}

std::string what_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return std::string("UsageError: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("Checkpointer(engine) takes the engine's bootstrap; a null bootstrap is a UsageError", "[ckpt][misuse]") {
  const model::ModelConfig mc = transformer();
  const SharedTempDir root;
  EngineTrainer t(trainer_config().parse(), mc, transformer_units(mc, false));
  CHECK(t.engine().bootstrap() == env().bootstrap);
  const std::string null_error =
      what_of([&] { ckpt::Checkpointer ck(t.engine(), std::shared_ptr<comm::Bootstrap>{}); });
  INFO(null_error);
  CHECK_THAT(null_error,
             Contains("UsageError: Checkpointer: the bootstrap is null") && Contains("Checkpointer(engine, options)"));

  train_steps(t, 0, 1);
  const Snapshot saved = snapshot(t.engine());
  {
    ckpt::Checkpointer ck(t.engine());
    ck.save(root.path(), "engine_bootstrap", 1, Json::object());
    const std::vector<ckpt::SaveReport> reports = ck.wait();
    CHECK(reports.size() == 1);
    if (!reports.empty()) check_report(reports[0], root.path(), "engine_bootstrap");
  }
  EngineTrainer f(trainer_config().parse(), mc, reinitialized(transformer_units(mc, false)));
  ckpt::Checkpointer fck(f.engine());
  CHECK(fck.load(root.path()).tag == "engine_bootstrap");
  CHECK(count_differences(snapshot(f.engine()), saved, "loaded through Checkpointer(engine)") == 0);
}

TEST_CASE("save and load inside an accumulation window or with a scope open throw UsageError on every rank",
          "[ckpt][misuse]") {
  ConfigText text = trainer_config();
  text.train_batch = 24;
  text.gas = 2;
  const model::ModelConfig mc = transformer();
  const SharedTempDir root;
  EngineTrainer t(text.parse(), mc, transformer_units(mc, false));
  Engine& e = t.engine();
  ckpt::Checkpointer ck(e);
  train_steps(t, 0, 1);
  ck.save(root.path(), "before", 1, Json::object());
  CHECK(ck.wait().size() == 1);

  t.forward_backward(1, 0);
  CHECK(!e.step().boundary);  // one micro-step into the window
  const std::string in_window = what_of([&] { ck.save(root.path(), "in_window", 1, Json::object()); });
  INFO(in_window);
  CHECK_THAT(in_window, Contains("UsageError: Checkpointer::save('in_window'): rank 0:") &&
                            Contains("1 micro-step(s) into the window") &&
                            Contains("save after the accumulation window's last step()") &&
                            Contains("at an accumulation boundary"));
  CHECK(!ck.in_flight());
  CHECK(ck.poll().empty());
  CHECK(!fs::exists(ckpt::staging_dir(root.path(), "in_window")));
  CHECK(!fs::exists(ckpt::checkpoint_dir(root.path(), "in_window")));
  const std::string load_in_window = what_of([&] { ck.load(root.path()); });
  INFO(load_in_window);
  CHECK_THAT(load_in_window,
             Contains("UsageError: Checkpointer::load(") && Contains("1 micro-step(s) into the window"));

  t.forward_backward(1, 1);
  CHECK(e.step().boundary);
  {
    Engine::GatherScope g = e.gather(e.unit_names().front());
    const std::string scope_open = what_of([&] { ck.save(root.path(), "scope_open", 2, Json::object()); });
    INFO(scope_open);
    CHECK_THAT(scope_open, Contains("UsageError: Checkpointer::save('scope_open')") && Contains("1 scope(s) open"));
  }
  ck.save(root.path(), "after", 2, Json::object());  // at the boundary, scopes closed: fine again
  const std::vector<ckpt::SaveReport> reports = ck.wait();
  CHECK(reports.size() == 1);
  if (!reports.empty()) check_report(reports[0], root.path(), "after");
  CHECK(ckpt::read_latest(root.path()).value_or("") == "after");
}

TEST_CASE("a Checkpointer destroyed with a save in flight logs that it was not committed; latest stays complete",
          "[ckpt][misuse]") {
  const model::ModelConfig mc = transformer();
  const SharedTempDir root;
  EngineTrainer t(trainer_config().parse(), mc, transformer_units(mc, false));
  train_steps(t, 0, 1);
  {
    ckpt::Checkpointer ck(t.engine());
    ck.save(root.path(), "kept", 1, Json::object());
    CHECK(ck.wait().size() == 1);
  }
  train_steps(t, 1, 2);
  const std::string log = capture_stderr([&] {
    ckpt::Checkpointer ck(t.engine());  // async
    ck.save(root.path(), "lost", 2, Json::object());
    CHECK(ck.in_flight());
  });  // destroyed without poll() or wait()
  INFO(log);
  CHECK_THAT(log, Contains(fmt::format("error: checkpoint lost in {} was not committed: call wait() before destroying "
                                       "the Checkpointer; the previous checkpoint is intact (latest: kept)",
                                       root.path().string())));
  boot().barrier();  // every rank's destructor has run
  CHECK(ckpt::read_latest(root.path()).value_or("") == "kept");
  CHECK(!fs::exists(ckpt::checkpoint_dir(root.path(), "lost")));
  std::string verify_error;
  try {
    ckpt::CheckpointReader(root.path()).verify_all();
  } catch (const std::exception& e) {
    verify_error = e.what();
  }
  CHECK(verify_error.empty());

  // The same tag saves and commits normally afterwards (the leftover staging directory is removed).
  ckpt::Checkpointer ck(t.engine());
  ck.save(root.path(), "lost", 2, Json::object());
  const std::vector<ckpt::SaveReport> reports = ck.wait();
  CHECK(reports.size() == 1);
  if (!reports.empty()) check_report(reports[0], root.path(), "lost");
}
