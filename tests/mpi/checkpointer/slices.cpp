// local_slices, read_state and write_state: the owned slices of all ranks name every element once and the
// kept ones add the persistent units; values written read back, through gather_tensor and as compute sees
// them; misuse is refused, and so is the middle of an accumulation window.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt_fixtures.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/checkpointer.hpp"

using namespace zero3;
using namespace zero3::test::engine_trainer;
using namespace zero3::test::ckpt_fixtures;
using Catch::Matchers::Contains;

namespace {

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
    std::optional<ConfigText> loads_into;  // a second job the checkpoint is loaded into (another offload)
  };
  std::vector<Setup> setups(4);
  for (Setup& s : setups) s.text.zero = R"("stage3_param_persistence_threshold": 60)";
  setups[0].name = "fp32 AdamW";
  setups[1].name = "bf16 AdamW, offload_optimizer + offload_param";
  setups[1].text.precision = R"("bf16": {"enabled": true})";
  setups[1].text.zero += R"(, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"})";
  setups[2].name = "fp32 Adagrad";
  setups[2].text.optimizer = R"({"type": "Adagrad", "params": {"lr": 1e-2}})";
  // The state in files: odd sizes through the partial blocks; saved from NVMe, loaded into CPU offload and back.
  setups[3].name = "bf16 AdamW, offload_optimizer nvme";
  setups[3].text.precision = setups[1].text.precision;
  setups[3].text.zero +=
      R"(, "offload_optimizer": {"device": "nvme", "nvme_path": ")" + test::nvme_test_directory() + R"("})";
  setups[3].loads_into = setups[1].text;
  setups[1].loads_into = setups[3].text;
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
      if (s.loads_into) {
        const std::unique_ptr<Engine> other = make_engine(s.loads_into->parse(), {.units = reinitialized(units)});
        ckpt::Checkpointer(*other, env().bootstrap).load(root.path());
        const Snapshot moved = snapshot(*other);
        CHECK(count_differences(moved, expected_values(*other, moved.training),
                                what + ": loaded into the other offload") == 0);
      }
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
