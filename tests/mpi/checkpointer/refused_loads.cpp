// Loads that conflict with the job (another optimizer, a param of another shape, a param more or less, a
// frozen param that was trainable) are refused with a CheckpointError naming it, the engine left bitwise
// untouched.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <exception>
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
