#include "zero3/core/trace.hpp"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "zero3/core/error.hpp"

namespace zero3::trace {
namespace {

using Clock = std::chrono::steady_clock;

struct Event {
  char phase = 'X';  // X: complete span, i: instant, C: counter
  std::string track;
  std::string name;
  std::int64_t ts = 0;
  std::int64_t dur = 0;
  std::vector<std::pair<std::string, double>> args;
};

struct Recorder {
  std::atomic<bool> on{false};
  std::mutex mutex;
  Clock::time_point origin = Clock::now();
  std::vector<Event> events;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

thread_local std::vector<std::string> labels;

void record(Event e) {
  Recorder& r = recorder();
  const std::lock_guard lock(r.mutex);
  r.events.push_back(std::move(e));
}

}  // namespace

void start() {
  Recorder& r = recorder();
  const std::lock_guard lock(r.mutex);
  r.events.clear();
  r.origin = Clock::now();
  r.on.store(true);
}

void stop() {
  recorder().on.store(false);
}

bool enabled() {
  return recorder().on.load(std::memory_order_relaxed);
}

std::int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - recorder().origin).count();
}

void span(std::string_view track, std::string name, std::int64_t begin_us, std::int64_t end_us) {
  if (!enabled()) return;
  record({'X', std::string(track), std::move(name), begin_us, std::max<std::int64_t>(end_us - begin_us, 0), {}});
}

void instant(std::string_view track, std::string name) {
  if (!enabled()) return;
  record({'i', std::string(track), std::move(name), now_us(), 0, {}});
}

void counter(std::string_view name, const std::vector<std::pair<std::string_view, double>>& series) {
  if (!enabled()) return;
  Event e{'C', "", std::string(name), now_us(), 0, {}};
  for (const auto& [s, v] : series) e.args.emplace_back(std::string(s), v);
  record(std::move(e));
}

Scope::Scope(std::string_view track, std::string name) {
  if (!enabled()) return;
  track_ = track;
  name_ = std::move(name);
  begin_ = now_us();
}

Scope::~Scope() {
  if (begin_ >= 0) span(track_, std::move(name_), begin_, now_us());
}

Label::Label(std::string name) {
  if (!enabled()) return;
  labels.push_back(std::move(name));
  pushed_ = true;
}

Label::~Label() {
  if (pushed_ && !labels.empty()) labels.pop_back();
}

std::string current_label() {
  std::string out;
  for (const std::string& l : labels) out += (out.empty() ? "" : " / ") + l;
  return out;
}

void write_json(const std::filesystem::path& path, int process, const std::string& process_name) {
  Recorder& r = recorder();
  std::vector<Event> events;
  {
    const std::lock_guard lock(r.mutex);
    events = r.events;
  }
  std::map<std::string, int> tids;  // one thread per track, numbered in order of first use
  nlohmann::json list = nlohmann::json::array();
  list.push_back({{"ph", "M"}, {"pid", process}, {"name", "process_name"}, {"args", {{"name", process_name}}}});
  list.push_back({{"ph", "M"}, {"pid", process}, {"name", "process_sort_index"}, {"args", {{"sort_index", process}}}});
  for (const Event& e : events) {
    nlohmann::json j = {{"ph", std::string(1, e.phase)}, {"pid", process}, {"name", e.name}, {"ts", e.ts}};
    if (e.phase != 'C') {
      auto [it, fresh] = tids.try_emplace(e.track, static_cast<int>(tids.size()) + 1);
      if (fresh) {
        list.push_back({{"ph", "M"},
                        {"pid", process},
                        {"tid", it->second},
                        {"name", "thread_name"},
                        {"args", {{"name", e.track}}}});
      }
      j["tid"] = it->second;
    }
    if (e.phase == 'X') j["dur"] = e.dur;
    if (e.phase == 'i') j["s"] = "t";
    if (!e.args.empty()) {
      nlohmann::json args = nlohmann::json::object();
      for (const auto& [k, v] : e.args) args[k] = v;
      j["args"] = args;
    }
    list.push_back(std::move(j));
  }
  std::ofstream out(path);
  out << nlohmann::json{{"traceEvents", list}, {"displayTimeUnit", "ms"}}.dump() << '\n';
  if (!out) throw Error(fmt::format("trace: cannot write {}", path.string()));
}

void merge_json(const std::vector<std::filesystem::path>& parts, const std::filesystem::path& out_path) {
  nlohmann::json all = nlohmann::json::array();
  for (const std::filesystem::path& p : parts) {
    std::ifstream in(p);
    if (!in) throw Error(fmt::format("trace: cannot read {}", p.string()));
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("trace: {} is not trace-event JSON: {}", p.string(), e.what()));
    }
    if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
      throw Error(fmt::format("trace: {} has no traceEvents array", p.string()));
    }
    for (auto& e : doc["traceEvents"]) all.push_back(std::move(e));
  }
  std::ofstream out(out_path);
  out << nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump() << '\n';
  if (!out) throw Error(fmt::format("trace: cannot write {}", out_path.string()));
}

}  // namespace zero3::trace
