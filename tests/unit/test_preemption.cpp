// The stop request of zero3/train/preemption.hpp: the flag (first request wins, cleared on demand), the
// handlers (a signal sets the flag; the previous handlers come back when StopSignals goes away; a repeat
// within the window is the same request, one after it ends the process at once with 128 + signal), the
// agreement over the ranks (a bootstrap whose other ranks' flags the test sets), and the events.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"
#include "zero3/train/preemption.hpp"

using namespace zero3;

namespace {

// Rank 0 of `flags.size()` ranks: the other ranks' flags are the test's.
class FlagsBootstrap final : public comm::Bootstrap {
 public:
  explicit FlagsBootstrap(std::vector<std::int32_t> flags) : flags_(std::move(flags)) {}
  int rank() const override { return 0; }
  int size() const override { return static_cast<int>(flags_.size()); }
  void broadcast(std::vector<std::byte>&, int) override {}
  std::vector<std::byte> all_gather(const std::vector<std::byte>& mine) override {
    REQUIRE(mine.size() == sizeof(std::int32_t));
    ++calls;
    std::vector<std::byte> all(flags_.size() * mine.size());
    std::memcpy(all.data(), mine.data(), mine.size());
    for (std::size_t r = 1; r < flags_.size(); ++r) {
      std::memcpy(all.data() + r * sizeof(std::int32_t), &flags_[r], sizeof(std::int32_t));
    }
    return all;
  }
  void barrier() override {}
  int calls = 0;

 private:
  std::vector<std::int32_t> flags_;
};

std::atomic<int> g_previous_calls{0};
extern "C" void previous_handler(int) {
  g_previous_calls.fetch_add(1);
}

std::vector<nlohmann::json> read_events(const std::filesystem::path& dir) {
  std::ifstream in(dir / "events.jsonl");
  std::vector<nlohmann::json> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("the first stop request wins until cleared", "[preemption]") {
  train::clear_stop_request();
  CHECK(train::stop_requested() == 0);
  train::request_stop(SIGUSR1);
  train::request_stop();  // a later request does not replace the first one's reason
  CHECK(train::stop_requested() == SIGUSR1);
  train::clear_stop_request();
  CHECK(train::stop_requested() == 0);
  train::request_stop();
  CHECK(train::stop_requested() == train::kStopRequestedByCall);
  train::clear_stop_request();
  CHECK(train::stop_reason_name(SIGTERM) == "SIGTERM");
  CHECK(train::stop_reason_name(SIGUSR1) == "SIGUSR1");
  CHECK(train::stop_reason_name(train::kStopRequestedByCall) == "a stop request");
}

TEST_CASE("a signal sets the flag, and the previous handlers come back", "[preemption]") {
  train::clear_stop_request();
  struct sigaction mine {};
  mine.sa_handler = previous_handler;
  sigemptyset(&mine.sa_mask);
  struct sigaction before_term {
  }, before_usr1{};
  REQUIRE(::sigaction(SIGTERM, &mine, &before_term) == 0);
  REQUIRE(::sigaction(SIGUSR1, &mine, &before_usr1) == 0);
  g_previous_calls = 0;
  {
    const train::StopSignals signals;
    CHECK_THROWS_AS(train::StopSignals(), UsageError);  // one at a time
    REQUIRE(std::raise(SIGUSR1) == 0);
    CHECK(train::stop_requested() == SIGUSR1);
    REQUIRE(std::raise(SIGTERM) == 0);  // within the repeat window: the same request
    CHECK(train::stop_requested() == SIGUSR1);
    CHECK(g_previous_calls == 0);
  }
  train::clear_stop_request();
  REQUIRE(std::raise(SIGTERM) == 0);
  REQUIRE(std::raise(SIGUSR1) == 0);
  CHECK(g_previous_calls == 2);
  CHECK(train::stop_requested() == 0);
  struct sigaction now {};
  REQUIRE(::sigaction(SIGTERM, nullptr, &now) == 0);
  CHECK(now.sa_handler == previous_handler);
  const train::StopSignals again;  // installable again once the first is gone
  ::sigaction(SIGTERM, &before_term, nullptr);
  ::sigaction(SIGUSR1, &before_usr1, nullptr);
}

TEST_CASE("a second signal after the repeat window ends the process at once", "[preemption]") {
  for (const int sig : {SIGTERM, SIGUSR1}) {
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      const train::StopSignals signals({.signals = {SIGTERM, SIGUSR1}, .repeat_window = std::chrono::milliseconds(50)});
      std::raise(sig);
      std::raise(sig);  // within the window: still running
      if (train::stop_requested() != sig) ::_exit(3);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::raise(sig);
      ::_exit(4);  // not reached
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 128 + sig);
  }
}

TEST_CASE("the ranks agree to stop when any rank's flag is set", "[preemption]") {
  train::clear_stop_request();
  {
    FlagsBootstrap none({0, 0, 0});
    const train::StopAgreement a = train::agree_on_stop(none);
    CHECK(none.calls == 1);
    CHECK_FALSE(a.stop);
    CHECK(a.ranks_asked.empty());
  }
  {
    FlagsBootstrap two({0, SIGUSR1, 0, SIGTERM});
    const train::StopAgreement a = train::agree_on_stop(two);
    CHECK(a.stop);
    CHECK(a.reason == SIGUSR1);  // the lowest-numbered asking rank's
    CHECK(a.ranks_asked == std::vector<int>{1, 3});
  }
  train::request_stop(SIGTERM);
  {
    FlagsBootstrap others({0, 0, SIGUSR1});
    const train::StopAgreement a = train::agree_on_stop(others);
    CHECK(a.stop);
    CHECK(a.reason == SIGTERM);
    CHECK(a.ranks_asked == std::vector<int>{0, 2});
  }
  train::clear_stop_request();
}

TEST_CASE("the preemption events name the step, the reason and what was saved", "[preemption][events]") {
  const auto dir = std::filesystem::temp_directory_path() / ("zero3-preemption-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  events::configure({.run_dir = dir, .rank = 0});
  train::emit_stop_agreed({.stop = true, .reason = SIGTERM, .ranks_asked = {0, 1}}, 17, 0);
  train::emit_preemption_outcome({.reason = SIGTERM, .step = 17, .checkpoint = dir / "global_step17", .save_s = 1.5},
                                 0);
  train::emit_preemption_outcome({.reason = SIGUSR1, .step = 18}, 0);
  train::emit_preemption_outcome({.reason = SIGUSR1, .step = 19}, 1);  // rank 1: rank 0 reports
  const std::vector<nlohmann::json> lines = read_events(dir);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0]["kind"] == "preempt_requested");
  CHECK(lines[0]["step"] == 17);
  CHECK(lines[0]["fields"]["ranks"] == "0,1");
  CHECK(lines[1]["kind"] == "preempt_checkpoint");
  CHECK(lines[1]["fields"]["path"] == (dir / "global_step17").string());
  CHECK(lines[1]["figures"]["save_s"] == 1.5);
  CHECK(lines[2]["kind"] == "preempt_nothing_saved");
  CHECK(lines[2]["fields"]["reason"] == "SIGUSR1");
  CHECK(lines[2]["level"] == "warning");
  events::configure({});
  std::filesystem::remove_all(dir);
}
