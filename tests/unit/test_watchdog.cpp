// The watchdog's pieces in one process: ZERO3_FAULT parsing, the flight recorder's ring (context copied at
// issue, oldest overwritten, fingerprints that tell units and micro-batches apart, the JSON dump), and one
// watchdog expiry through a fake progress channel and a test failure policy (the process handles one
// failure, so one case does it).
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "flight_recorder.hpp"
#include "zero3/comm/fault.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"

using namespace zero3;
using Json = nlohmann::json;

TEST_CASE("ZERO3_FAULT is parsed strictly", "[fault]") {
  const comm::fault::Spec s = comm::fault::parse("skip_gather:rank=1:step=3:unit=2");
  CHECK(s.kind == comm::fault::Kind::skip_gather);
  CHECK(s.rank == 1);
  CHECK(s.step == 3);
  CHECK(s.unit == 2);
  CHECK(comm::fault::parse("stall:step=0:rank=7").rank == 7);
  for (const char* bad : {"", "stall", "stall:rank=1", "nap:rank=1:step=2", "stall:rank=1:step=2:unit=1",
                          "skip_gather:rank=1:step=2", "stall:rank=-1:step=2", "stall:rank=1:step=2x",
                          "stall:rank=1:rank=2:step=1", "stall:rank=1:step=2:", "stall:rank 1:step=2"}) {
    INFO(bad);
    CHECK_THROWS_AS(comm::fault::parse(bad), ConfigError);
    CHECK_THROWS_WITH(comm::fault::parse(bad), Catch::Contains("ZERO3_FAULT"));
  }
}

namespace {
comm::CollectiveInfo info(std::uint64_t seq, const char* op, std::size_t count) {
  comm::CollectiveInfo i;
  i.seq = seq;
  i.op = op;
  i.dtype = DType::bf16;
  i.count = count;
  return i;
}
}  // namespace

TEST_CASE("the flight recorder keeps the last N records with their context", "[flight]") {
  comm::flight::Recorder& rec = comm::flight::Recorder::instance();
  rec.set_capacity(16);
  const std::uint32_t lane = rec.register_lane("test");
  const auto progress = std::make_shared<comm::LoopProgress>();
  rec.follow(progress);
  progress->set(5, 1);
  for (std::uint64_t s = 1; s <= 40; ++s) {
    const comm::ScopedOpAnnotation note("gather", s % 2 == 0 ? "blocks.0" : "blocks.1");
    rec.issued(lane, info(s, "all_gather", 100), 200 * 2, "");
    rec.started(lane, s);
    if (s != 38) rec.completed(lane, s, false);
  }
  const std::vector<comm::flight::Record> all = rec.snapshot();
  REQUIRE(all.size() == 16);
  CHECK(all.front().seq == 25);
  CHECK(all.back().seq == 40);
  CHECK(all.back().unit.view() == "blocks.0");
  CHECK(all.back().phase.view() == "gather");
  CHECK(all.back().step == 5);
  CHECK(all.back().micro_batch == 1);
  const auto stuck = rec.oldest_in_flight();
  REQUIRE(stuck);
  CHECK(stuck->seq == 38);
  // Same op, count and number, other unit or micro-batch: other fingerprint (the desync guard compares these).
  const std::uint32_t other = rec.register_lane("test");
  const auto print = [&](const char* unit, std::int64_t micro) {
    const comm::ScopedOpAnnotation note("gather", unit);
    progress->set(5, micro);
    rec.issued(other, info(1000, "all_gather", 100), 400, "");
    return rec.find(other, 1000)->fingerprint;
  };
  const std::uint64_t base = print("blocks.0", 2);
  CHECK(print("blocks.0", 2) == base);
  CHECK(print("blocks.1", 2) != base);
  CHECK(print("blocks.0", 3) != base);
  print("blocks.0", 2);
  const Json dump = Json::parse(comm::flight_record_json("test", 0));
  CHECK(dump["records"].size() == 16);
  CHECK(dump["records"].back()["unit"] == "blocks.0");
  CHECK(dump["records"].back()["micro_batch"] == 2);
  CHECK(dump["records"].back()["lane"] == "test#2");
  rec.completed(lane, 38, false);
  rec.unfollow(progress.get());
  progress->set(6, 0);
  rec.issued(other, info(1001, "all_gather", 100), 400, "");
  CHECK(rec.find(other, 1001)->step == -1);  // unfollowed: no step
  rec.set_capacity(4096);
}

namespace {
// Rank 1 published that it last entered seq 6 of lane "mpi": it never entered 7.
class FakeChannel final : public comm::ProgressChannel {
 public:
  void publish(const std::string& p) override {
    std::lock_guard lock(mutex);
    mine = p;
  }
  std::optional<std::vector<std::optional<Peer>>> fetch() override {
    std::vector<std::optional<Peer>> peers(2);
    peers[1] = Peer{R"js({"step": 3, "lanes": {"mpi": {"started": 6, "completed": 6}},
                        "last_started": "all_reduce #6 (step)", "last_completed": "all_reduce #6 (step)",
                        "in_flight": null})js",
                    4.5};
    return peers;
  }
  void post_failure(const std::string& n) override {
    std::lock_guard lock(mutex);
    notice = n;
  }
  std::optional<std::string> poll_failure() override { return std::nullopt; }
  std::mutex mutex;
  std::string mine, notice;
};
}  // namespace

TEST_CASE("a collective past its deadline is reported with who is missing, dumped, and the policy runs", "[watchdog]") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "zero3_test_watchdog";
  std::filesystem::remove_all(dir);
  events::configure({.run_dir = dir, .rank = 0});
  std::mutex m;
  std::condition_variable cv;
  std::optional<comm::JobFailure> seen;
  comm::set_failure_policy([&](const comm::JobFailure& f) {
    std::lock_guard lock(m);
    seen = f;
    cv.notify_all();
  });
  comm::flight::Recorder& rec = comm::flight::Recorder::instance();
  const std::uint32_t lane = rec.register_lane("mpi");
  const std::string lane_name = rec.lanes()[lane].name;
  auto channel = std::make_shared<FakeChannel>();
  {
    comm::Watchdog dog({.timeout = std::chrono::duration<double>(0.3),
                        .first_step_timeout = std::chrono::duration<double>(60.0),
                        .poll_interval = std::chrono::duration<double>(0.05),
                        .grace = std::chrono::duration<double>(0.05)},
                       0, 2, channel);
    dog.progress().mark_first_step_done();
    dog.progress().set(3, 1);
    {
      const comm::ScopedOpAnnotation note("gather", "blocks.3");
      rec.issued(lane, info(7, "all_gather", 4096), 16384, "");
    }
    rec.started(lane, 7);
    std::unique_lock lock(m);
    REQUIRE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return seen.has_value(); }));
  }
  CHECK(seen->kind == "collective_timeout");
  INFO(seen->message);
  CHECK_THAT(seen->message, Catch::Contains("all_gather #7") && Catch::Contains("unit blocks.3") &&
                                Catch::Contains("step 3") && Catch::Contains("micro-batch 1") &&
                                Catch::Contains("missing: rank 1") && Catch::Contains("by rank 0"));
  if (lane_name != "mpi") WARN("lane registered as " << lane_name);
  CHECK_THAT(channel->notice, Catch::Contains("all_gather #7"));
  CHECK_THAT(channel->mine, Catch::Contains("\"rank\":0"));
  const Json dump = Json::parse(std::ifstream(dir / "flight" / "rank0.json"));
  CHECK(dump["records"].back()["seq"] == 7);
  CHECK(dump["records"].back()["completed_ns"] == 0);
  std::ifstream events_file(dir / "events.jsonl");
  std::string line;
  std::getline(events_file, line);
  CHECK_THAT(line, Catch::Contains("collective_timeout") && Catch::Contains("blocks.3"));
  rec.completed(lane, 7, false);
}
