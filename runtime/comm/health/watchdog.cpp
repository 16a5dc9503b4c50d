// The watchdog thread, the who-is-missing report, the flight-record dump and the one failure path of a
// job: report (event + log), dump, failure notice to the other ranks, a grace period for their dumps,
// then the failure policy. Only one failure is handled per process; later ones wait for it.
#include "zero3/comm/watchdog.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <system_error>
#include <thread>

#include "flight_recorder.hpp"
#include "zero3/core/events.hpp"
#include "zero3/core/json_text.hpp"
#include "zero3/core/log.hpp"

namespace zero3::comm {

namespace {

using Json = nlohmann::json;

struct PendingFailure {
  std::string kind;
  std::uint32_t lane = 0;
  std::uint64_t seq = 0;
  std::string message;
};

// Process-wide: what outlives any one Watchdog (the policy, abort hooks, the last channel) and the
// once-only failure state.
struct FailureState {
  std::mutex mutex;
  std::condition_variable cv;  // a watchdog waits for work; handle_fatal_error waits for `handled`
  FailurePolicy policy;        // empty: the default
  std::map<std::uint64_t, std::function<void()>> abort_hooks;
  std::uint64_t next_hook = 1;
  std::optional<PendingFailure> pending;
  std::shared_ptr<ProgressChannel> channel;
  int rank = 0;
  int size = 1;
  int watchdogs = 0;
  bool armed = false;
  bool handling = false;  // a failure is being handled (only one per process)
  bool handled = false;
  // The last time this process was suspended (no thread of it ran: SIGSTOP, a debugger, a frozen VM), as
  // the watchdog saw it on waking (wall clock, ns; 0: never). In its flight record, so that the analysis
  // names the rank that stalled first even when it wrote its record last.
  std::int64_t suspended_from_ns = 0;
  std::int64_t suspended_to_ns = 0;
};

FailureState& state() {
  static FailureState s;
  return s;
}

std::string clock_text(std::int64_t ns) {
  const std::time_t t = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec);
}

double seconds_since(std::int64_t ns) {
  return static_cast<double>(flight::now_ns() - ns) / 1e9;
}

std::string ranks_text(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

std::string progress_json(int rank, const LoopProgress& progress) {
  const flight::Recorder& rec = flight::Recorder::instance();
  const std::vector<flight::LaneInfo> lanes = rec.lanes();
  Json j;
  j["rank"] = rank;
  j["time_ns"] = flight::now_ns();
  j["step"] = progress.steps_done();
  j["micro_batch"] = progress.micro_batch();
  Json l = Json::object();
  for (const flight::LaneInfo& lane : lanes)
    l[lane.name] = {{"started", lane.last_started}, {"completed", lane.last_completed}};
  j["lanes"] = std::move(l);
  const auto text = [&](const std::optional<flight::Record>& r) {
    return r ? Json(flight::describe_record(*r, lanes)) : Json(nullptr);
  };
  j["last_started"] = text(rec.last_started());
  j["last_completed"] = text(rec.last_completed());
  const std::optional<flight::Record> waiting = rec.oldest_in_flight();
  j["in_flight"] = text(waiting);
  j["in_flight_since_ns"] = waiting ? waiting->started_ns : 0;
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Who entered `op` and what the others last did, from the ranks' progress in `channel`.
struct WhoIsMissing {
  std::vector<int> entered;
  std::vector<int> missing;
  std::vector<std::string> lines;  // one per missing rank, or why nothing is known
};

WhoIsMissing who_is_missing(const flight::Record& op, const std::string& lane, int rank, int size,
                            ProgressChannel* channel, double silent_s) {
  WhoIsMissing w;
  w.entered.push_back(rank);  // this rank: it is the one waiting
  if (channel == nullptr) {
    w.lines.push_back("no progress channel: what the other ranks did is unknown");
    return w;
  }
  std::optional<std::vector<std::optional<ProgressChannel::Peer>>> peers;
  try {
    peers = channel->fetch();
  } catch (const std::exception& e) {
    w.lines.push_back(fmt::format("the progress store failed: {}", e.what()));
  }
  if (!peers) {
    w.lines.push_back(rank == 0 ? "the progress store on this rank did not answer"
                                : "the progress store on rank 0 does not answer: rank 0 is the missing one");
    if (rank != 0) w.missing.push_back(0);
    return w;
  }
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const auto& peer =
        static_cast<std::size_t>(r) < peers->size() ? (*peers)[static_cast<std::size_t>(r)] : std::nullopt;
    if (!peer) {
      w.missing.push_back(r);
      w.lines.push_back(fmt::format("rank {} has published no progress", r));
      continue;
    }
    Json p = Json::parse(peer->progress, nullptr, /*allow_exceptions=*/false);
    std::uint64_t started = 0;
    if (p.is_object() && p.contains("lanes") && p["lanes"].contains(lane) && p["lanes"][lane].is_object()) {
      started = p["lanes"][lane].value("started", std::uint64_t{0});
    }
    // A rank that entered but stopped publishing is the stalled one, not a peer waiting like this one:
    // its watchdog thread publishes every poll interval while the process runs.
    if (started >= op.seq && peer->age_s > silent_s) {
      w.missing.push_back(r);
      w.lines.push_back(
          fmt::format("rank {} entered {} #{} but has been silent for {:.1f} s: the process is "
                      "stopped (SIGSTOP, a debugger) or frozen",
                      r, op.op.view(), op.seq, peer->age_s));
      continue;
    }
    if (started >= op.seq) {
      w.entered.push_back(r);
      continue;
    }
    w.missing.push_back(r);
    const auto field = [&](const char* k) {
      return p.is_object() && p[k].is_string() ? p[k].get<std::string>() : std::string("nothing");
    };
    w.lines.push_back(fmt::format(
        "rank {} (last heard {:.1f} s ago, step {}): last entered {}; last completed {}{}", r, peer->age_s,
        p.is_object() ? p.value("step", std::int64_t{-1}) : -1, field("last_started"), field("last_completed"),
        p.is_object() && p["in_flight"].is_string() ? fmt::format("; waiting in {}", p["in_flight"].get<std::string>())
                                                    : std::string()));
  }
  std::sort(w.entered.begin(), w.entered.end());
  return w;
}

void default_policy(const JobFailure& failure) {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard lock(state().mutex);
    for (auto it = state().abort_hooks.rbegin(); it != state().abort_hooks.rend(); ++it) hooks.push_back(it->second);
  }
  for (const auto& hook : hooks) {
    try {
      hook();
    } catch (const std::exception& e) {
      log::error("aborting the job: {}", e.what());
    }
  }
  std::_Exit(failure.exit_code);  // no hook ended the process (no MPI): end this rank at least
}

std::filesystem::path flight_dir() {
  const std::filesystem::path run = events::run_dir();
  return (run.empty() ? std::filesystem::path("zero3-run") : run) / "flight";
}

// The one failure path: report, dump, notice, grace, policy. `op` is the collective concerned, if any.
void run_failure(const std::string& kind, const std::string& headline, const std::optional<flight::Record>& op,
                 const std::vector<std::string>& detail, const WhoIsMissing* who, double grace_s) {
  FailureState& s = state();
  std::shared_ptr<ProgressChannel> channel;
  int rank = 0;
  {
    std::lock_guard lock(s.mutex);
    channel = s.channel;
    rank = s.rank;
  }
  events::Event e{.level = log::Level::error, .kind = kind, .step = op ? op->step : -1, .message = headline};
  if (op) {
    e.fields = {{"op", std::string(op->op.view())},
                {"unit", std::string(op->unit.view())},
                {"phase", std::string(op->phase.view())},
                {"dtype", std::string(dtype_name(op->dtype))}};
    e.figures = {{"seq", static_cast<double>(op->seq)},
                 {"micro_batch", static_cast<double>(op->micro_batch)},
                 {"bytes", static_cast<double>(op->size_bytes)}};
  }
  if (who != nullptr) {
    e.fields.emplace_back("entered_ranks", fmt::format("{}", fmt::join(who->entered, ",")));
    e.fields.emplace_back("missing_ranks", fmt::format("{}", fmt::join(who->missing, ",")));
  }
  std::string report;
  for (const std::string& line : detail) report += (report.empty() ? "" : "\n") + line;
  if (!report.empty()) e.fields.emplace_back("detail", report);
  events::emit(e);
  for (const std::string& line : detail) log::error("  {}", line);
  const std::filesystem::path dump = dump_flight_record(headline, rank);
  if (!dump.empty()) log::error("flight record: {}", dump.string());
  if (channel) {
    try {
      channel->post_failure(Json{{"rank", rank}, {"kind", kind}, {"message", headline}}.dump(
          -1, ' ', false, Json::error_handler_t::replace));
    } catch (const std::exception& ex) {
      log::error("could not post the failure notice: {}", ex.what());
    }
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(grace_s));  // the other ranks dump their records
  events::flush(std::chrono::seconds(2));
  FailurePolicy policy;
  {
    std::lock_guard lock(s.mutex);
    policy = s.policy;
  }
  (policy ? policy : FailurePolicy(default_policy))({kind, headline, 1});
  std::lock_guard lock(s.mutex);
  s.handled = true;
  s.cv.notify_all();
}

// Claims the process's one failure; false when one is already being handled.
bool claim_failure() {
  std::lock_guard lock(state().mutex);
  if (state().handling) return false;
  state().handling = true;
  return true;
}

}  // namespace

// ---------------------------------------------------------------- Watchdog

struct Watchdog::Impl {
  WatchdogOptions options;
  int rank = 0;
  int size = 1;
  std::shared_ptr<ProgressChannel> channel;
  // Shared with the flight recorder, which stamps it on the records issued while this watchdog runs.
  std::shared_ptr<LoopProgress> progress = std::make_shared<LoopProgress>();
  bool stop = false;  // guarded by state().mutex
  std::thread thread;
  std::chrono::steady_clock::time_point last_wake{};  // the watchdog thread's previous wake-up

  void run();
  void note_suspension();
  // How long a gap in a process's activity must be to count as a suspension (this process) or as a silent
  // peer (another rank's progress): well above the poll interval and above the descheduling a loaded
  // machine gives a thread.
  double silent_s() const { return std::max(5.0, 10.0 * options.poll_interval.count()); }
  void tick();
  void check_deadline();
  void handle_pending(PendingFailure failure);
  void handle_peer_notice(const std::string& notice);
  std::string lane_name(std::uint32_t lane) const {
    const std::vector<flight::LaneInfo> lanes = flight::Recorder::instance().lanes();
    return lane < lanes.size() ? lanes[lane].name : std::string("?");
  }
};

void Watchdog::Impl::run() {
  try {
    if (channel) channel->publish(progress_json(rank, *progress));  // at once: a rank may stop before the first tick
  } catch (const std::exception& e) {
    log::error("watchdog: {}", e.what());
  }
  std::unique_lock lock(state().mutex);
  last_wake = std::chrono::steady_clock::now();
  while (!stop) {
    state().cv.wait_for(lock, options.poll_interval, [&] { return stop || state().pending.has_value(); });
    if (stop) return;
    note_suspension();
    std::optional<PendingFailure> pending = std::exchange(state().pending, std::nullopt);
    const bool busy = state().handling;
    lock.unlock();
    try {
      if (pending && !busy) {
        handle_pending(std::move(*pending));
      } else if (!busy) {
        tick();
      }
    } catch (const std::exception& e) {
      log::error("watchdog: {}", e.what());
    }
    lock.lock();
  }
}

// Called with state().mutex held, at each wake-up: a gap far longer than the poll interval means no thread
// of this process ran (the steady clock goes on while a process is stopped).
void Watchdog::Impl::note_suspension() {
  const auto now = std::chrono::steady_clock::now();
  const double gap = std::chrono::duration<double>(now - last_wake).count();
  last_wake = now;
  if (gap < silent_s()) return;
  const std::int64_t wall = flight::now_ns();
  state().suspended_from_ns = wall - static_cast<std::int64_t>(gap * 1e9);
  state().suspended_to_ns = wall;
  log::warn("this process was suspended for {:.1f} s (no thread of it ran: SIGSTOP, a debugger, a frozen host)", gap);
}

void Watchdog::Impl::tick() {
  if (channel) {
    channel->publish(progress_json(rank, *progress));
    if (const std::optional<std::string> notice = channel->poll_failure()) {
      handle_peer_notice(*notice);
      return;
    }
  }
  check_deadline();
}

void Watchdog::Impl::check_deadline() {
  const std::optional<flight::Record> op = flight::Recorder::instance().oldest_in_flight();
  if (!op) return;
  const bool long_deadline = op->first_step || op->phase.view() == "checkpoint";
  const double deadline = (long_deadline ? options.first_step_timeout : options.timeout).count();
  const double waited = seconds_since(op->started_ns);
  if (waited < deadline || !claim_failure()) return;
  const std::vector<flight::LaneInfo> lanes = flight::Recorder::instance().lanes();
  const std::string what = flight::describe_record(*op, lanes);
  std::int64_t suspended_from = 0;
  std::int64_t suspended_to = 0;
  {
    std::lock_guard lock(state().mutex);
    suspended_from = state().suspended_from_ns;
    suspended_to = state().suspended_to_ns;
  }
  const double stopped_s = static_cast<double>(suspended_to - std::max(suspended_from, op->started_ns)) / 1e9;
  if (suspended_to > op->started_ns && waited - stopped_s < deadline) {
    // The deadline passed while this rank itself was stopped: it is the rank that stalled, and the ranks it
    // would name (gone, or waiting for it) are not. Its report says so instead of blaming them.
    const std::string headline = fmt::format(
        "rank {}: this rank was suspended for {:.1f} s (from {} to {}; no thread of it ran, as under SIGSTOP, a "
        "debugger or a frozen host) while in {}: the deadline of {:g} s passed while it was stopped, so this rank "
        "is the one that stalled; the other ranks' reports about this collective follow from it",
        rank, stopped_s, clock_text(suspended_from), clock_text(suspended_to), what, deadline);
    run_failure("rank_suspended", headline, op, {}, nullptr, options.grace.count());
    return;
  }
  const WhoIsMissing who = who_is_missing(*op, lane_name(op->lane), rank, size, channel.get(), silent_s());
  std::string headline = fmt::format(
      "rank {}: {} did not complete within {:g} s{}: entered at {} ({:.1f} s ago) by {}; missing: {}", rank, what,
      deadline, long_deadline ? " (the first step's deadline)" : "", clock_text(op->started_ns), waited,
      ranks_text(who.entered), who.missing.empty() ? std::string("unknown") : ranks_text(who.missing));
  run_failure("collective_timeout", headline, op, who.lines, &who, options.grace.count());
}

void Watchdog::Impl::handle_pending(PendingFailure failure) {
  if (!claim_failure()) return;
  const std::optional<flight::Record> op = flight::Recorder::instance().find(failure.lane, failure.seq);
  std::vector<std::string> detail;
  std::string headline = fmt::format("rank {}: {}", rank, failure.message);
  if (op) {
    detail.push_back(
        fmt::format("failed collective: {}", flight::describe_record(*op, flight::Recorder::instance().lanes())));
  }
  detail.push_back("the ranks no longer agree on the collectives they run: bringing the job down");
  run_failure(failure.kind, headline, op, detail, nullptr, options.grace.count());
}

void Watchdog::Impl::handle_peer_notice(const std::string& notice) {
  const Json n = Json::parse(notice, nullptr, /*allow_exceptions=*/false);
  const int from = n.is_object() ? n.value("rank", -1) : -1;
  if (from == rank || !claim_failure()) return;
  const std::string message = n.is_object() ? n.value("message", notice) : notice;
  const std::string headline = fmt::format("job aborted by rank {}: {}", from, message);
  std::vector<std::string> detail;
  if (const std::optional<flight::Record> waiting = flight::Recorder::instance().oldest_in_flight()) {
    detail.push_back(fmt::format("this rank (rank {}) was waiting in {} since {}", rank,
                                 flight::describe_record(*waiting, flight::Recorder::instance().lanes()),
                                 clock_text(waiting->started_ns)));
  }
  // The reporting rank brings the job down after its grace period; this rank follows if it has not.
  run_failure("peer_failed", headline, std::nullopt, detail, nullptr, options.grace.count() * 2 + 2.0);
}

Watchdog::Watchdog(const WatchdogOptions& options, int rank, int size, std::shared_ptr<ProgressChannel> channel)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  impl_->rank = rank;
  impl_->size = size;
  impl_->channel = channel;
  {
    std::lock_guard lock(state().mutex);
    state().channel = std::move(channel);
    state().rank = rank;
    state().size = size;
    ++state().watchdogs;
  }
  flight::Recorder::instance().follow(impl_->progress);
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(state().mutex);
    impl_->stop = true;
    --state().watchdogs;
    if (state().channel == impl_->channel) state().channel.reset();  // the store goes with its engine
  }
  state().cv.notify_all();
  impl_->thread.join();
  flight::Recorder::instance().unfollow(impl_->progress.get());
}

LoopProgress& Watchdog::progress() {
  return *impl_->progress;
}

// ---------------------------------------------------------------- process-wide

FailurePolicy set_failure_policy(FailurePolicy policy) {
  std::lock_guard lock(state().mutex);
  return std::exchange(state().policy, std::move(policy));
}

std::uint64_t register_abort_hook(std::function<void()> hook) {
  std::lock_guard lock(state().mutex);
  const std::uint64_t id = state().next_hook++;
  state().abort_hooks[id] = std::move(hook);
  return id;
}

void unregister_abort_hook(std::uint64_t id) {
  std::lock_guard lock(state().mutex);
  state().abort_hooks.erase(id);
}

void flight::report_collective_failure(std::string_view kind, std::uint32_t lane, std::uint64_t seq,
                                       std::string message) {
  {
    std::lock_guard lock(state().mutex);
    if (state().watchdogs == 0 || state().handling || state().pending) return;
    state().pending = PendingFailure{std::string(kind), lane, seq, std::move(message)};
  }
  state().cv.notify_all();
}

void arm_fatal_error_handler(bool armed) {
  std::lock_guard lock(state().mutex);
  state().armed = armed;
}

void handle_fatal_error(std::string_view what) {
  FailureState& s = state();
  std::optional<PendingFailure> pending;
  int rank = 0;
  int size = 1;
  {
    std::unique_lock lock(s.mutex);
    if (!s.armed) return;
    if (s.handling) {  // the watchdog is on it: it ends the process (or a test policy returns)
      s.cv.wait(lock, [&] { return s.handled; });
      return;
    }
    pending = std::exchange(s.pending, std::nullopt);
    rank = s.rank;
    size = s.size;
    if (size > 1) s.handling = true;
  }
  if (size <= 1) {
    dump_flight_record(what, rank);
    return;
  }
  std::optional<flight::Record> op;
  std::string kind = "fatal_error";
  std::string headline = fmt::format("rank {} failed: {}", rank, what);
  if (pending) {
    op = flight::Recorder::instance().find(pending->lane, pending->seq);
    kind = pending->kind;
    headline = fmt::format("rank {}: {}", rank, pending->message);
  }
  std::vector<std::string> detail;
  if (op)
    detail.push_back(fmt::format("collective: {}", flight::describe_record(*op, flight::Recorder::instance().lanes())));
  run_failure(kind, headline, op, detail, nullptr, 3.0);
}

std::string flight_record_json(std::string_view reason, int rank) {
  const flight::Recorder& rec = flight::Recorder::instance();
  const std::vector<flight::LaneInfo> lanes = rec.lanes();
  const std::vector<flight::Record> records = rec.snapshot();
  int size = 1;
  std::int64_t suspended_from = 0;
  std::int64_t suspended_to = 0;
  {
    std::lock_guard lock(state().mutex);
    size = state().size;
    suspended_from = state().suspended_from_ns;
    suspended_to = state().suspended_to_ns;
  }
  std::string out = fmt::format(
      "{{\"rank\": {}, \"size\": {}, \"pid\": {}, \"time_ns\": {}, \"suspended_from_ns\": {}, \"suspended_to_ns\": "
      "{}, \"reason\": {}, \"lanes\": [",
      rank, size, static_cast<long>(::getpid()), flight::now_ns(), suspended_from, suspended_to, json_quoted(reason));
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    out += fmt::format("{}{{\"name\": {}, \"last_started\": {}, \"last_completed\": {}}}", i ? ", " : "",
                       json_quoted(lanes[i].name), lanes[i].last_started, lanes[i].last_completed);
  }
  out += "],\n\"records\": [\n";
  for (std::size_t i = 0; i < records.size(); ++i) {
    out += (i ? ",\n" : "") + flight::record_json(records[i], lanes);
  }
  return out + "\n]}\n";
}

std::filesystem::path dump_flight_record(std::string_view reason, int rank) {
  try {
    const std::filesystem::path dir = flight_dir();
    std::filesystem::create_directories(dir);
    const std::filesystem::path path = dir / fmt::format("rank{}.json", rank);
    const std::filesystem::path tmp = dir / fmt::format(".rank{}.json.tmp", rank);
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << flight_record_json(reason, rank);
      if (!out) throw std::system_error(errno, std::generic_category(), "writing " + tmp.string());
    }
    std::filesystem::rename(tmp, path);
    return path;
  } catch (const std::exception& e) {
    log::error("could not write the flight record: {}", e.what());
    return {};
  }
}

}  // namespace zero3::comm
