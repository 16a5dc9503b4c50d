// Misuse by an embedder: a clear error on every rank (a null bootstrap; save or load inside an accumulation
// window or with a scope open), and a Checkpointer destroyed with a save in flight logs that it was not
// committed while the latest checkpoint stays complete.
#include <fmt/format.h>
#include <unistd.h>  // dup, dup2

#include <catch2/catch.hpp>
#include <cstdio>
#include <functional>
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
