#include "ckpt_fixtures.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <utility>

#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"

namespace zero3::test::ckpt_fixtures {

comm::Bootstrap& boot() {
  return *env().bootstrap;
}

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

// ---- values computed here, for read_state/write_state and the tiny-staging save

// A value for element `i` of (param, kind) in [-2, 2], never zero; `bf16_exact`: representable in bf16.
float test_value(std::string_view param, TensorKind kind, std::uint64_t i, bool bf16_exact) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a of the name, then splitmix64 of (name, kind, i)
  for (const char c : param) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  std::uint64_t z = h + (static_cast<std::uint64_t>(kind) + 1) * 0x9E3779B97F4A7C15ull + i * 0xD1B54A32D192ED03ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  float v = static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 24) * 4.0 - 2.0);
  if (v == 0.0f) v = 0.75f;
  // Rounded through bf16 rather than by masking the low bits: GCC 12 at -O1 and above drops that mask here.
  if (bf16_exact) v = bf16_to_float(float_to_bf16(v));
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

ParamSpec spec(std::string name, std::vector<std::int64_t> shape, bool trainable) {
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
                                    const std::set<std::int64_t>& overflow) {
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

}  // namespace zero3::test::ckpt_fixtures
