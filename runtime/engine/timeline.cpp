#include "timeline.hpp"

#include <algorithm>
#include <utility>

namespace zero3::engine {

std::uint64_t Timeline::begin(Stream& stream, Lane lane) {
  if (!enabled_) return 0;
  std::uint64_t id = 0;
  {
    std::lock_guard lock(mutex_);
    id = next_id_++;
    intervals_[id] = {lane, {}, {}, false, false};
  }
  stream.launch_host([this, id] {
    const Clock::time_point now = Clock::now();
    std::lock_guard lock(mutex_);
    Interval& i = intervals_[id];
    i.start = now;
    i.started = true;
  });
  return id;
}

void Timeline::end(Stream& stream, std::uint64_t id) {
  if (!enabled_ || id == 0) return;
  stream.launch_host([this, id] {
    const Clock::time_point now = Clock::now();
    std::lock_guard lock(mutex_);
    Interval& i = intervals_[id];
    i.end = now;
    i.ended = true;
  });
}

void Timeline::host(Lane lane, Clock::time_point start, Clock::time_point end) {
  if (!enabled_) return;
  std::lock_guard lock(mutex_);
  intervals_[next_id_++] = {lane, start, end, true, true};
}

void Timeline::add_bytes(Lane lane, std::uint64_t bytes) {
  std::lock_guard lock(mutex_);
  (lane == Lane::d2h ? d2h_bytes_ : h2d_bytes_) += bytes;
}

void Timeline::add_disk(const DiskTimes& disk) {
  std::lock_guard lock(mutex_);
  disk_ += disk;
}

namespace {

using Span = std::pair<Timeline::Clock::time_point, Timeline::Clock::time_point>;

double ms(Timeline::Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// The union of `spans`, as sorted disjoint spans.
std::vector<Span> merged(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end());
  std::vector<Span> out;
  for (const Span& s : spans) {
    if (!out.empty() && s.first <= out.back().second) {
      out.back().second = std::max(out.back().second, s.second);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace

Timeline::Summary Timeline::summarize() {
  std::vector<Interval> done;
  Summary summary;
  OffloadTimes& t = summary.offload;
  {
    std::lock_guard lock(mutex_);
    for (auto it = intervals_.begin(); it != intervals_.end();) {
      if (it->second.started && it->second.ended) {
        done.push_back(it->second);
        it = intervals_.erase(it);
      } else {
        ++it;
      }
    }
    t.d2h_bytes = std::exchange(d2h_bytes_, 0);
    t.h2d_bytes = std::exchange(h2d_bytes_, 0);
    summary.disk = std::exchange(disk_, {});
  }
  std::vector<Span> copies;
  std::vector<Span> other;
  for (const Interval& i : done) {
    if (i.end < i.start) continue;
    const Span s{i.start, i.end};
    switch (i.lane) {
      case Lane::d2h:
        t.d2h_ms += ms(i.end - i.start);
        copies.push_back(s);
        break;
      case Lane::h2d:
        t.h2d_ms += ms(i.end - i.start);
        copies.push_back(s);
        break;
      case Lane::compute:
        other.push_back(s);
        break;
      case Lane::cpu:
        t.cpu_ms += ms(i.end - i.start);
        other.push_back(s);
        break;
      case Lane::gather_wait:
        summary.gather_wait_ms += ms(i.end - i.start);
        break;
    }
  }
  const std::vector<Span> busy = merged(std::move(other));
  for (const Span& c : copies) {
    // Overlap of c with the union of other work (busy is sorted and disjoint).
    auto it = std::lower_bound(busy.begin(), busy.end(), c.first,
                               [](const Span& b, Clock::time_point at) { return b.second < at; });
    for (; it != busy.end() && it->first < c.second; ++it) {
      const Clock::time_point a = std::max(c.first, it->first);
      const Clock::time_point b = std::min(c.second, it->second);
      if (b > a) t.copies_hidden_ms += ms(b - a);
    }
  }
  return summary;
}

}  // namespace zero3::engine
