// A save through a 1-byte staging area (one 1 MiB block at a time) is complete, verifies, and loads
// exactly, with sync and async saves.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <memory>
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
constexpr std::size_t kMiB = std::size_t{1} << 20;
}  // namespace

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
