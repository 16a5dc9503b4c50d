// `zero3 debug flight DIR`: merges the ranks' flight records (DIR/rank<R>.json, or DIR/flight/, as the
// watchdog writes them on a failure) and prints the first divergence in one line, then detail: the
// first sequence number at which the ranks issued different collectives (a skipped gather shifts every
// later number), else the collective that failed on a rank before the first report, else the oldest
// collective some rank waited in: the rank that was stopped (its watchdog records the suspension) stalled
// first, else the ranks that never entered it. Then the ranks' reports in the order they were made: the
// first stands, the later ones follow from it. Exit 0 when it found something to say, 1 when the records
// agree.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "zero3/core/error.hpp"

namespace zero3::tools {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

struct Op {
  std::string lane;
  std::uint64_t seq = 0;
  std::string op, unit, describe, fingerprint;
  std::int64_t step = -1, micro_batch = -1;
  std::int64_t started_ns = 0, completed_ns = 0;
  bool failed = false;
};

struct RankRecord {
  int rank = -1;
  int size = 0;
  std::int64_t time_ns = 0;
  std::int64_t suspended_from_ns = 0;  // the rank's last suspension (SIGSTOP, ...), as its watchdog saw it
  std::int64_t suspended_to_ns = 0;
  std::string reason;
  std::map<std::string, std::uint64_t> last_started;       // by lane
  std::map<std::string, std::map<std::uint64_t, Op>> ops;  // lane -> seq -> op (the newest of that seq)
};

RankRecord load_record(const fs::path& path) {
  std::ifstream in(path);
  Json j;
  try {
    j = Json::parse(in);
  } catch (const Json::exception& e) {
    throw ConfigError(fmt::format("{}: not a flight record: {}", path.string(), e.what()));
  }
  RankRecord r;
  r.rank = j.value("rank", -1);
  r.size = j.value("size", 0);
  r.time_ns = j.value("time_ns", std::int64_t{0});
  r.suspended_from_ns = j.value("suspended_from_ns", std::int64_t{0});
  r.suspended_to_ns = j.value("suspended_to_ns", std::int64_t{0});
  r.reason = j.value("reason", std::string());
  for (const Json& l : j.value("lanes", Json::array())) {
    r.last_started[l.value("name", std::string())] = l.value("last_started", std::uint64_t{0});
  }
  for (const Json& o : j.value("records", Json::array())) {
    Op op{o.value("lane", std::string()),
          o.value("seq", std::uint64_t{0}),
          o.value("op", std::string()),
          o.value("unit", std::string()),
          o.value("describe", std::string()),
          o.value("fingerprint", std::string()),
          o.value("step", std::int64_t{-1}),
          o.value("micro_batch", std::int64_t{-1}),
          o.value("started_ns", std::int64_t{0}),
          o.value("completed_ns", std::int64_t{0}),
          o.value("failed", false)};
    r.ops[op.lane][op.seq] = op;
  }
  return r;
}

std::string clock_text(std::int64_t ns) {
  const std::time_t t = static_cast<std::time_t>(ns / 1000000000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec);
}

// "all_gather #1234 (unit blocks.3, step 17, micro-batch 2)"
std::string short_name(const Op& op) {
  std::string s = fmt::format("{}{} #{}", op.lane == "bootstrap" ? "bootstrap " : "", op.op, op.seq);
  std::vector<std::string> where;
  if (!op.unit.empty()) where.push_back("unit " + op.unit);
  if (op.step >= 0) where.push_back(fmt::format("step {}", op.step));
  if (op.micro_batch >= 0) where.push_back(fmt::format("micro-batch {}", op.micro_batch));
  if (!where.empty()) s += fmt::format(" ({})", fmt::join(where, ", "));
  return s;
}

std::string ranks_text(const std::vector<int>& ranks) {
  return fmt::format("{} {}", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

// The first (lane, seq) whose fingerprints differ among the ranks holding it.
std::optional<std::string> first_mismatch(const std::vector<RankRecord>& recs, std::string& lane_out,
                                          std::uint64_t& seq_out) {
  std::optional<std::pair<std::int64_t, std::string>> best;  // (started time, line)
  for (const auto& [lane, _] : recs.front().ops) {
    std::map<std::uint64_t, std::vector<const Op*>> by_seq;
    for (const RankRecord& r : recs) {
      const auto it = r.ops.find(lane);
      if (it == r.ops.end()) continue;
      for (const auto& [seq, op] : it->second) by_seq[seq].push_back(&op);
    }
    for (const auto& [seq, ops] : by_seq) {
      if (ops.size() < 2) continue;
      const bool same =
          std::all_of(ops.begin(), ops.end(), [&](const Op* o) { return o->fingerprint == ops[0]->fingerprint; });
      if (same) continue;
      std::string line = fmt::format("the ranks issued different collectives as {} #{}: ", lane, seq);
      std::vector<std::string> each;
      for (const RankRecord& r : recs) {
        const auto lit = r.ops.find(lane);
        if (lit == r.ops.end()) continue;
        const auto sit = lit->second.find(seq);
        if (sit != lit->second.end()) each.push_back(fmt::format("rank {} {}", r.rank, short_name(sit->second)));
      }
      line += fmt::format("{}", fmt::join(each, "; "));
      const std::int64_t t = ops[0]->started_ns;
      if (!best || t < best->first) {
        best = {t, line};
        lane_out = lane;
        seq_out = seq;
      }
      break;  // the first mismatch of this lane; later ones follow from it
    }
  }
  if (!best) return std::nullopt;
  return best->second;
}

// The oldest collective a rank was still waiting in, and who never entered it.
std::optional<std::string> first_stuck(const std::vector<RankRecord>& recs, int size, std::string& lane_out,
                                       std::uint64_t& seq_out) {
  const Op* oldest = nullptr;
  for (const RankRecord& r : recs) {
    for (const auto& [lane, ops] : r.ops) {
      for (const auto& [seq, op] : ops) {
        if (op.started_ns == 0 || op.completed_ns != 0) continue;
        if (oldest == nullptr || op.started_ns < oldest->started_ns) oldest = &op;
      }
    }
  }
  if (oldest == nullptr) return std::nullopt;
  lane_out = oldest->lane;
  seq_out = oldest->seq;
  // The first dump is when the failure was reported: a rank that entered only after it (a stopped rank
  // continued by the launcher's kill) had not entered when it mattered.
  std::int64_t reported_ns = recs.front().time_ns;
  for (const RankRecord& r : recs) reported_ns = std::min(reported_ns, r.time_ns);
  std::vector<int> waiting, never, no_record, late, stopped;
  for (int rank = 0; rank < size; ++rank) {
    const auto it = std::find_if(recs.begin(), recs.end(), [&](const RankRecord& r) { return r.rank == rank; });
    if (it == recs.end()) {
      no_record.push_back(rank);
      continue;
    }
    const auto ls = it->last_started.find(oldest->lane);
    const auto lane_ops = it->ops.find(oldest->lane);
    const Op* mine = nullptr;
    if (lane_ops != it->ops.end()) {
      const auto op = lane_ops->second.find(oldest->seq);
      if (op != lane_ops->second.end()) mine = &op->second;
    }
    // Stopped while the first report was being made: this rank stalled, whatever it did on waking.
    const bool was_stopped =
        it->suspended_to_ns > 0 && it->suspended_from_ns < reported_ns && it->suspended_to_ns > oldest->started_ns;
    if (was_stopped) {
      stopped.push_back(rank);
    } else if (ls == it->last_started.end() || ls->second < oldest->seq) {
      never.push_back(rank);
    } else if (mine != nullptr && mine->started_ns > reported_ns) {
      never.push_back(rank);
      late.push_back(rank);
    } else {
      waiting.push_back(rank);
    }
  }
  std::vector<int> missing = never;
  missing.insert(missing.end(), no_record.begin(), no_record.end());
  std::sort(missing.begin(), missing.end());
  std::string line;
  if (!stopped.empty()) {
    const RankRecord& first =
        *std::min_element(recs.begin(), recs.end(), [&](const RankRecord& a, const RankRecord& b) {
          const bool sa = std::find(stopped.begin(), stopped.end(), a.rank) != stopped.end();
          const bool sb = std::find(stopped.begin(), stopped.end(), b.rank) != stopped.end();
          if (sa != sb) return sa;
          return a.suspended_from_ns < b.suspended_from_ns;
        });
    // Inside the collective when it was stopped, or before it got there.
    bool inside = false;
    if (const auto lane_ops = first.ops.find(oldest->lane); lane_ops != first.ops.end()) {
      const auto op = lane_ops->second.find(oldest->seq);
      inside = op != lane_ops->second.end() && op->second.started_ns != 0 &&
               op->second.started_ns <= first.suspended_from_ns;
    }
    line = fmt::format(
        "{} stalled first: stopped from {} for {:.0f} s (no thread of it ran: SIGSTOP, a debugger, a frozen host) "
        "{} {}",
        ranks_text(stopped), clock_text(first.suspended_from_ns),
        static_cast<double>(first.suspended_to_ns - first.suspended_from_ns) / 1e9,
        inside ? "while in" : "before entering", short_name(*oldest));
    if (!missing.empty()) line += fmt::format("; {} never entered it", ranks_text(missing));
  } else if (missing.empty()) {
    line = fmt::format("every rank entered {} but it never completed", short_name(*oldest));
  } else {
    line = fmt::format("{} never entered {}", ranks_text(missing), short_name(*oldest));
  }
  if (!waiting.empty()) {
    line += fmt::format("; {} waiting since {} ({:.0f} s)", ranks_text(waiting), clock_text(oldest->started_ns),
                        static_cast<double>(reported_ns - oldest->started_ns) / 1e9);
  }
  if (!late.empty()) line += fmt::format(" ({} entered only after the failure was reported)", ranks_text(late));
  if (!no_record.empty()) line += fmt::format(" (no flight record from {})", ranks_text(no_record));
  return line;
}

std::optional<std::string> first_failed(const std::vector<RankRecord>& recs, std::string& lane_out,
                                        std::uint64_t& seq_out) {
  // A collective that failed after the first report (a stopped rank woken into a job that is gone) is a
  // consequence, not the cause.
  std::int64_t reported_ns = recs.front().time_ns;
  for (const RankRecord& r : recs) reported_ns = std::min(reported_ns, r.time_ns);
  for (const RankRecord& r : recs) {
    for (const auto& [lane, ops] : r.ops) {
      for (const auto& [seq, op] : ops) {
        if (!op.failed || op.completed_ns > reported_ns) continue;
        lane_out = lane;
        seq_out = seq;
        return fmt::format("rank {}'s {} failed: {}", r.rank, short_name(op), r.reason);
      }
    }
  }
  return std::nullopt;
}

// The reports in the order they were made: the first one stands; a later one (a rank woken by the
// launcher's SIGCONT, a rank whose peer was already gone) follows from it.
void print_reports(const std::vector<RankRecord>& recs) {
  std::vector<const RankRecord*> order;
  for (const RankRecord& r : recs) order.push_back(&r);
  std::sort(order.begin(), order.end(),
            [](const RankRecord* a, const RankRecord* b) { return a->time_ns < b->time_ns; });
  fmt::print("reports, first to last:\n");
  for (std::size_t i = 0; i < order.size(); ++i) {
    fmt::print("  {} rank {} at {}: {}\n", i == 0 ? "first:" : "later, a consequence:", order[i]->rank,
               clock_text(order[i]->time_ns), order[i]->reason);
  }
}

void print_detail(const std::vector<RankRecord>& recs, const std::string& lane, std::uint64_t seq) {
  print_reports(recs);
  fmt::print("detail ({} lane, around #{}):\n", lane, seq);
  for (const RankRecord& r : recs) {
    fmt::print("  rank {} (dumped {}): {}\n", r.rank, clock_text(r.time_ns), r.reason);
    const auto it = r.ops.find(lane);
    if (it == r.ops.end()) continue;
    for (const auto& [s, op] : it->second) {
      if (s + 3 < seq || s > seq + 2) continue;
      const char* state = op.failed              ? "failed"
                          : op.completed_ns != 0 ? "completed"
                          : op.started_ns != 0   ? "WAITING"
                                                 : "queued";
      fmt::print("    {:>9}  {}\n", state, op.describe);
    }
    const auto ls = r.last_started.find(lane);
    if (ls != r.last_started.end() && ls->second < seq) fmt::print("    (last entered #{} on this lane)\n", ls->second);
  }
}

int run_flight(const std::string& dir_arg) {
  fs::path dir = dir_arg;
  if (fs::is_directory(dir / "flight")) dir /= "flight";
  std::vector<RankRecord> recs;
  if (fs::is_directory(dir)) {
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string name = e.path().filename().string();
      if (name.rfind("rank", 0) == 0 && e.path().extension() == ".json") recs.push_back(load_record(e.path()));
    }
  }
  if (recs.empty()) throw ConfigError(fmt::format("{}: no flight records (rank<R>.json) found", dir_arg));
  std::sort(recs.begin(), recs.end(), [](const RankRecord& a, const RankRecord& b) { return a.rank < b.rank; });
  int size = recs.back().rank + 1;
  for (const RankRecord& r : recs) size = std::max(size, r.size);
  std::string lane;
  std::uint64_t seq = 0;
  std::optional<std::string> line = first_mismatch(recs, lane, seq);
  if (!line) line = first_failed(recs, lane, seq);  // a failed collective leaves the others waiting in it
  if (!line) line = first_stuck(recs, size, lane, seq);
  if (!line) {
    fmt::print("the {} flight records agree: no divergence, nothing in flight, nothing failed\n", recs.size());
    return 1;
  }
  fmt::print("{}\n", *line);
  print_detail(recs, lane, seq);
  return 0;
}

}  // namespace

void add_debug_command(CLI::App& app) {
  CLI::App* debug = app.add_subcommand("debug", "Post-mortem tools: merge the ranks' flight records");
  debug->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  CLI::App* flight = debug->add_subcommand(
      "flight", "Print the first divergence in the ranks' flight records (a run directory or its flight/ folder)");
  flight->add_option("DIR", *dir, "Run directory (or its flight/ folder) with rank<R>.json files")->required();
  flight->callback([dir] {
    if (const int rc = run_flight(*dir); rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace zero3::tools
