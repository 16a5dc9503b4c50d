// poll and wait: nothing to report without a save, a second save waits for the first, reports come in
// order, and each checkpoint holds the state of its own step.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "ckpt_fixtures.hpp"
#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/checkpointer.hpp"

using namespace zero3;
using namespace zero3::test::engine_trainer;
using namespace zero3::test::ckpt_fixtures;
using Catch::Matchers::Contains;

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
