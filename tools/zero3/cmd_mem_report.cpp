// `zero3 mem report DIR`: what `zero3 train --profile DIR` recorded, as tables and pictures. From
// DIR/trace.json (the timeline, train/…/trace.hpp) it prints, per rank, the peak of every memory category
// in each phase of the step (forward and backward of each unit, the held-out pass, reductions, optimizer
// step, checkpoint staging) and rank 0's step split; beside DIR/memory.json's plan and measured peaks. With
// gnuplot (Debian's gnuplot-nox) it draws DIR/memory.png (memory over time per category, one panel per
// rank) and DIR/step_split.png (forward, backward, step and held-out time of every step).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/memory.hpp"

namespace zero3::tools {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

struct Span {
  std::string name;
  double begin = 0.0;  // microseconds
  double end = 0.0;
};

struct Sample {
  double at = 0.0;
  std::map<std::string, double> mib;  // category -> MiB
};

// One rank's part of the trace.
struct RankTrace {
  std::map<std::string, std::vector<Span>> tracks;    // track name -> spans, in time order
  std::map<std::string, std::vector<Sample>> memory;  // memory kind -> samples, in time order
  std::vector<std::pair<double, std::string>> steps;  // step markers
};

std::map<int, RankTrace> read_trace(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("{}: cannot read (record one with zero3 train --profile DIR)", path.string()));
  Json doc;
  try {
    doc = Json::parse(in);
  } catch (const Json::exception& e) {
    throw Error(fmt::format("{}: not trace-event JSON: {}", path.string(), e.what()));
  }
  if (!doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
    throw Error(fmt::format("{}: no traceEvents array", path.string()));
  }
  std::map<std::pair<int, int>, std::string> thread_names;
  for (const Json& e : doc["traceEvents"]) {
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") {
      thread_names[{e.value("pid", 0), e.value("tid", 0)}] = e["args"].value("name", "");
    }
  }
  std::map<int, RankTrace> ranks;
  for (const Json& e : doc["traceEvents"]) {
    const std::string ph = e.value("ph", "");
    const int pid = e.value("pid", 0);
    const double ts = e.value("ts", 0.0);
    RankTrace& r = ranks[pid];
    if (ph == "X") {
      const std::string& track = thread_names[{pid, e.value("tid", 0)}];
      r.tracks[track].push_back({e.value("name", ""), ts, ts + e.value("dur", 0.0)});
    } else if (ph == "i") {
      r.steps.emplace_back(ts, e.value("name", ""));
    } else if (ph == "C") {
      const std::string name = e.value("name", "");  // "memory device (MiB)"
      if (!name.starts_with("memory ")) continue;
      const std::string kind = name.substr(7, name.find(' ', 7) - 7);
      Sample s{ts, {}};
      for (const auto& [k, v] : e["args"].items()) s.mib[k] = v.get<double>();
      r.memory[kind].push_back(std::move(s));
    }
  }
  for (auto& [pid, r] : ranks) {
    for (auto& [name, spans] : r.tracks) {
      std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    }
    for (auto& [kind, samples] : r.memory) {
      std::stable_sort(samples.begin(), samples.end(), [](const Sample& a, const Sample& b) { return a.at < b.at; });
    }
    std::sort(r.steps.begin(), r.steps.end());
  }
  return ranks;
}

// Per phase (first-seen order), each category's most MiB while the phase ran (the value in force when it
// began included).
std::vector<std::pair<std::string, std::map<std::string, double>>> phase_peaks(const RankTrace& r,
                                                                               const std::string& kind) {
  std::vector<std::pair<std::string, std::map<std::string, double>>> out;
  const auto it = r.tracks.find("phases");
  const auto mem = r.memory.find(kind);
  if (it == r.tracks.end() || mem == r.memory.end()) return out;
  const std::vector<Sample>& samples = mem->second;
  for (const Span& s : it->second) {
    auto row = std::find_if(out.begin(), out.end(), [&](const auto& p) { return p.first == s.name; });
    if (row == out.end()) {
      out.emplace_back(s.name, std::map<std::string, double>{});
      row = std::prev(out.end());
    }
    // The sample in force at the start, then every sample inside.
    auto first =
        std::upper_bound(samples.begin(), samples.end(), s.begin, [](double t, const Sample& x) { return t < x.at; });
    if (first != samples.begin()) --first;
    for (auto x = first; x != samples.end() && x->at <= s.end; ++x) {
      for (const auto& [cat, v] : x->mib) row->second[cat] = std::max(row->second[cat], v);
    }
  }
  return out;
}

void print_phase_tables(const std::map<int, RankTrace>& ranks) {
  for (const auto& [rank, r] : ranks) {
    for (const auto& [kind, samples] : r.memory) {
      const auto rows = phase_peaks(r, kind);
      std::vector<std::string> cats;
      for (const auto& [phase, peaks] : rows) {
        for (const auto& [cat, v] : peaks) {
          if (v > 0.0 && std::find(cats.begin(), cats.end(), cat) == cats.end()) cats.push_back(cat);
        }
      }
      if (cats.empty()) continue;
      fmt::print("\nrank {}, {} memory by phase (MiB, the most while the phase ran):\n{:<28}", rank, kind, "phase");
      for (const std::string& c : cats) fmt::print(" {:>14}", c);
      fmt::print("\n");
      for (const auto& [phase, peaks] : rows) {
        fmt::print("{:<28}", phase);
        for (const std::string& c : cats) {
          const auto v = peaks.find(c);
          fmt::print(" {:>14.3f}", v == peaks.end() ? 0.0 : v->second);
        }
        fmt::print("\n");
      }
    }
  }
}

struct StepTimes {
  std::string step;
  double forward = 0.0;
  double backward = 0.0;
  double step_ms = 0.0;
  double heldout = 0.0;
};

// Rank `r`'s phases summed per step (the span from one step marker to the next).
std::vector<StepTimes> step_split(const RankTrace& r) {
  std::vector<StepTimes> out;
  const auto it = r.tracks.find("phases");
  if (it == r.tracks.end()) return out;
  double from = 0.0;
  for (const auto& [at, name] : r.steps) {
    StepTimes t{name};
    for (const Span& s : it->second) {
      if (s.begin < from || s.begin >= at) continue;
      const double ms = (s.end - s.begin) / 1000.0;
      if (s.name.starts_with("forward ")) {
        t.forward += ms;
      } else if (s.name.starts_with("backward ")) {
        t.backward += ms;
      } else if (s.name == "reductions" || s.name == "optimizer step") {
        t.step_ms += ms;
      } else if (s.name.starts_with("held-out ")) {
        t.heldout += ms;
      }
    }
    out.push_back(t);
    from = at;
  }
  return out;
}

void print_step_split(const std::vector<StepTimes>& steps) {
  fmt::print(
      "\nrank 0's step split (ms; from the phases between step markers; held-out passes count toward the step "
      "that follows them):\n{:<12} {:>10} {:>10} {:>10} {:>10}\n",
      "step", "forward", "backward", "step", "held-out");
  for (const StepTimes& t : steps) {
    fmt::print("{:<12} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", t.step, t.forward, t.backward, t.step_ms, t.heldout);
  }
}

void print_memory_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return;
  const Json doc = Json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.contains("plan") || !doc.contains("measured")) return;
  fmt::print("\nplan vs measured, rank 0 (MiB; {}):\n{:<32} {:>12} {:>12}\n", path.string(), "kind category", "plan",
             "measured");
  const Json& plan = doc["plan"]["ranks"][0]["peak_bytes"];
  const Json& measured = doc["measured"]["ranks"][0]["peak_bytes"];
  for (const auto& [kind, cats] : plan.items()) {
    for (const auto& [cat, bytes] : cats.items()) {
      const double p = bytes.get<double>();
      const double m = measured[kind].value(cat, 0.0);
      if (p == 0.0 && m == 0.0) continue;
      fmt::print("{:<32} {:>12.3f} {:>12.3f}\n", fmt::format("{} {}", kind, cat), p / (1 << 20), m / (1 << 20));
    }
  }
}

// One rank's memory series as gnuplot data (seconds, then every "kind category" that is ever non-zero, each
// at its latest sample); returns the number of series.
std::size_t write_memory_data(const fs::path& path, const RankTrace& r) {
  std::vector<std::string> columns;
  for (const auto& [kind, samples] : r.memory) {
    for (const Sample& s : samples) {
      for (const auto& [cat, v] : s.mib) {
        const std::string c = fmt::format("{} {}", kind, cat);
        if (v > 0.0 && std::find(columns.begin(), columns.end(), c) == columns.end()) columns.push_back(c);
      }
    }
  }
  std::vector<std::pair<double, std::pair<std::string, const Sample*>>> all;
  for (const auto& [kind, samples] : r.memory) {
    for (const Sample& s : samples) all.push_back({s.at, {kind, &s}});
  }
  std::stable_sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::ofstream out(path);
  out << "seconds";
  for (const std::string& c : columns) out << " \"" << c << '"';
  out << '\n';
  std::map<std::string, double> last;
  for (const auto& [at, ks] : all) {
    for (const auto& [cat, v] : ks.second->mib) last[ks.first + " " + cat] = v;
    out << at / 1e6;
    for (const std::string& c : columns) out << ' ' << last[c];
    out << '\n';
  }
  return columns.size();
}

// gnuplot's data and script for the two pictures, then gnuplot itself.
void draw(const fs::path& dir, const std::map<int, RankTrace>& ranks, const std::vector<StepTimes>& steps) {
  std::string panels;
  std::size_t count = 0;
  for (const auto& [rank, r] : ranks) {
    const fs::path data = dir / fmt::format("memory_rank{}.dat", rank);
    const std::size_t series = write_memory_data(data, r);
    if (series == 0) continue;
    ++count;
    panels +=
        fmt::format("set title 'rank {}'\nplot for [i=2:{}] '{}' using 1:i with steps lw 1.5 title columnhead(i)\n",
                    rank, series + 1, data.string());
  }
  const fs::path steps_data = dir / "step_split.dat";
  {
    std::ofstream out(steps_data);
    out << "step forward backward step held-out\n";
    for (const StepTimes& t : steps) {
      out << '"' << t.step << "\" " << t.forward << ' ' << t.backward << ' ' << t.step_ms << ' ' << t.heldout << '\n';
    }
  }
  const fs::path gp = dir / "report.gp";
  {
    std::ofstream script(gp);
    script << fmt::format(
        "set terminal pngcairo size 1200,{} noenhanced font ',9'\nset output '{}'\n"
        "set multiplot layout {},1 title 'memory by category over time (MiB)'\nset key outside right\n"
        "set xlabel 'seconds'\nset ylabel 'MiB'\n{}unset multiplot\n",
        300 * std::max<std::size_t>(count, 1), (dir / "memory.png").string(), std::max<std::size_t>(count, 1), panels);
    script << fmt::format(
        "set terminal pngcairo size 1000,500 noenhanced font ',9'\nset output '{}'\n"
        "set title 'rank 0: where each step went (ms)'\nset style data histograms\nset style histogram rowstacked\n"
        "set style fill solid 0.8 border -1\nset boxwidth 0.7\nset ylabel 'ms'\nunset xlabel\n"
        "set xtics rotate by -45\nset key outside right\nplot for [i=2:5] '{}' using i:xtic(1) title columnhead(i)\n",
        (dir / "step_split.png").string(), steps_data.string());
  }
  // NOLINTNEXTLINE(cert-env33-c,concurrency-mt-unsafe): the one external program, on a script this command wrote
  const int rc = std::system(fmt::format("gnuplot '{}' 2> '{}'", gp.string(), (dir / "gnuplot.log").string()).c_str());
  if (rc != 0) {
    throw Error(fmt::format("gnuplot failed on {} (exit {}; {}): install Debian's gnuplot-nox, or plot it yourself",
                            gp.string(), rc, (dir / "gnuplot.log").string()));
  }
  fmt::print("\npictures: {}, {}\n", (dir / "memory.png").string(), (dir / "step_split.png").string());
}

struct ReportOptions {
  std::string dir;
  bool plots = true;
};

void run_report(const ReportOptions& o) {
  const fs::path dir = o.dir;
  const std::map<int, RankTrace> ranks = read_trace(dir / "trace.json");
  if (ranks.empty()) throw Error(fmt::format("{}: the trace holds no events", (dir / "trace.json").string()));
  fmt::print("zero3 mem report {}: {} rank(s)\n", dir.string(), ranks.size());
  print_phase_tables(ranks);
  const std::vector<StepTimes> steps = step_split(ranks.begin()->second);
  print_step_split(steps);
  print_memory_json(dir / "memory.json");
  if (o.plots) draw(dir, ranks, steps);
}

}  // namespace

void add_mem_report_command(CLI::App& group) {
  auto opt = std::make_shared<ReportOptions>();
  CLI::App* cmd = group.add_subcommand(
      "report", "Per-phase memory tables, the step split and PNG plots of a zero3 train --profile DIR");
  cmd->add_option("dir", opt->dir, "The --profile directory")->required();
  cmd->add_flag("!--no-plots", opt->plots, "Print the tables only (no gnuplot)");
  cmd->callback([opt] { run_report(*opt); });
}

}  // namespace zero3::tools
