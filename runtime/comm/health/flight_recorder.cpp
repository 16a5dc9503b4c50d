#include "flight_recorder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "zero3/comm/watchdog.hpp"
#include "zero3/core/json_text.hpp"

namespace zero3::comm {

namespace {
thread_local std::string_view t_phase;
thread_local std::string_view t_unit;
}  // namespace

ScopedOpAnnotation::ScopedOpAnnotation(std::string_view phase, std::string_view unit)
    : prev_phase_(t_phase), prev_unit_(t_unit) {
  t_phase = phase;
  t_unit = unit;
}

ScopedOpAnnotation::~ScopedOpAnnotation() {
  t_phase = prev_phase_;
  t_unit = prev_unit_;
}

void set_flight_capacity(std::size_t records) {
  flight::Recorder::instance().set_capacity(records);
}

namespace flight {

template <std::size_t N>
void FixedText<N>::set(std::string_view s) {
  const std::size_t n = std::min(s.size(), N - 1);
  std::memcpy(text, s.data(), n);
  text[n] = '\0';
}

template <std::size_t N>
std::string_view FixedText<N>::view() const {
  return {text, ::strnlen(text, N)};
}

template struct FixedText<16>;
template struct FixedText<64>;

std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {
constexpr std::size_t kDefaultCapacity = 4096;

// FNV-1a over the annotation, mixed into the collective's fingerprint: ranks gathering different units of
// the same size under the same number differ, and so do ranks a micro-batch apart (a rank that ran one
// more issues the same ops as the others, shifted by a whole micro-batch).
std::uint64_t mix_context(std::uint64_t fp, const Context& cx) {
  std::uint64_t h = fp ^ 14695981039346656037ull;
  const auto byte = [&](unsigned char b) {
    h ^= b;
    h *= 1099511628211ull;
  };
  for (const char c : cx.unit) byte(static_cast<unsigned char>(c));
  for (const std::int64_t v : {cx.step, cx.micro_batch}) {
    for (int i = 0; i < 8; ++i) byte(static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i)));
  }
  return h;
}
}  // namespace

Recorder& Recorder::instance() {
  static Recorder recorder;
  return recorder;
}

std::uint32_t Recorder::register_lane(std::string_view name) {
  std::lock_guard lock(mutex_);
  if (ring_.empty()) ring_.resize(kDefaultCapacity);
  // Unique names ("mpi", "mpi#2", ...): communicators are made in the same order on every rank, so a
  // name means the same communicator on all of them.
  std::size_t same = 0;
  for (const LaneInfo& l : lanes_) same += l.name == name || l.name.rfind(std::string(name) + "#", 0) == 0 ? 1 : 0;
  lanes_.push_back({same == 0 ? std::string(name) : fmt::format("{}#{}", name, same + 1), 0, 0});
  return static_cast<std::uint32_t>(lanes_.size() - 1);
}

void Recorder::set_capacity(std::size_t records) {
  std::lock_guard lock(mutex_);
  if (ring_.size() == std::max<std::size_t>(records, 1)) return;  // a second engine keeps the history
  ring_.assign(std::max<std::size_t>(records, 1), Record{});
  next_ticket_ = 1;
  last_started_ticket_ = 0;
  last_completed_ticket_ = 0;
}

void Recorder::follow(std::shared_ptr<const LoopProgress> progress) {
  std::lock_guard lock(mutex_);
  progress_ = std::move(progress);
}

void Recorder::unfollow(const LoopProgress* progress) {
  std::lock_guard lock(mutex_);
  if (progress_.get() == progress) progress_.reset();
}

Context Recorder::context_locked() const {
  Context cx{.phase = t_phase, .unit = t_unit};
  if (progress_) {
    cx.step = progress_->steps_done();
    cx.micro_batch = progress_->micro_batch();
    cx.first_step = !progress_->first_step_done();
  }
  return cx;
}

void Recorder::issued(std::uint32_t lane, const CollectiveInfo& info, std::uint64_t size_bytes,
                      std::string_view default_phase) {
  const std::int64_t t = now_ns();
  std::lock_guard lock(mutex_);
  const Context cx = context_locked();
  if (ring_.empty()) ring_.resize(kDefaultCapacity);
  const std::uint64_t ticket = next_ticket_++;
  Record& r = ring_[ticket % ring_.size()];
  r = Record{};
  r.ticket = ticket;
  r.lane = lane;
  r.seq = info.seq;
  r.op.set(info.op);
  r.phase.set(cx.phase.empty() ? default_phase : cx.phase);
  r.unit.set(cx.unit);
  r.dtype = info.dtype;
  r.count = info.count;
  r.size_bytes = size_bytes;
  r.reduce_op = info.reduce_op ? static_cast<std::int8_t>(*info.reduce_op) : std::int8_t{-1};
  r.root = info.root;
  r.step = cx.step;
  r.micro_batch = cx.micro_batch;
  r.first_step = cx.first_step;
  r.fingerprint = mix_context(fingerprint(info), cx);
  r.enqueued_ns = t;
}

Record* Recorder::find_locked(std::uint32_t lane, std::uint64_t seq) {
  // Newest first: the record asked for is almost always among the last few issued.
  const std::uint64_t n = std::min<std::uint64_t>(ring_.size(), next_ticket_ - 1);
  for (std::uint64_t k = 0; k < n; ++k) {
    Record& r = ring_[(next_ticket_ - 1 - k) % ring_.size()];
    if (r.lane == lane && r.seq == seq && r.ticket != 0) return &r;
  }
  return nullptr;
}

void Recorder::started(std::uint32_t lane, std::uint64_t seq) {
  const std::int64_t t = now_ns();
  std::lock_guard lock(mutex_);
  if (lane < lanes_.size()) lanes_[lane].last_started = std::max(lanes_[lane].last_started, seq);
  if (Record* r = find_locked(lane, seq)) {
    r->started_ns = t;
    last_started_ticket_ = std::max(last_started_ticket_, r->ticket);
  }
}

void Recorder::completed(std::uint32_t lane, std::uint64_t seq, bool failed) {
  const std::int64_t t = now_ns();
  std::lock_guard lock(mutex_);
  if (lane < lanes_.size() && !failed) lanes_[lane].last_completed = std::max(lanes_[lane].last_completed, seq);
  if (Record* r = find_locked(lane, seq)) {
    if (r->started_ns == 0) r->started_ns = t;
    r->completed_ns = t;
    r->failed = failed;
    if (!failed) last_completed_ticket_ = std::max(last_completed_ticket_, r->ticket);
  }
}

std::optional<Record> Recorder::find(std::uint32_t lane, std::uint64_t seq) const {
  std::lock_guard lock(mutex_);
  if (const Record* r = const_cast<Recorder*>(this)->find_locked(lane, seq)) return *r;
  return std::nullopt;
}

std::optional<Record> Recorder::oldest_in_flight() const {
  std::lock_guard lock(mutex_);
  const Record* oldest = nullptr;
  for (const Record& r : ring_) {
    if (r.ticket == 0 || r.started_ns == 0 || r.completed_ns != 0) continue;
    if (oldest == nullptr || r.started_ns < oldest->started_ns) oldest = &r;
  }
  if (oldest == nullptr) return std::nullopt;
  return *oldest;
}

std::optional<Record> Recorder::last_started() const {
  std::lock_guard lock(mutex_);
  if (last_started_ticket_ == 0 || ring_.empty()) return std::nullopt;
  const Record& r = ring_[last_started_ticket_ % ring_.size()];
  if (r.ticket != last_started_ticket_) return std::nullopt;
  return r;
}

std::optional<Record> Recorder::last_completed() const {
  std::lock_guard lock(mutex_);
  if (last_completed_ticket_ == 0 || ring_.empty()) return std::nullopt;
  const Record& r = ring_[last_completed_ticket_ % ring_.size()];
  if (r.ticket != last_completed_ticket_) return std::nullopt;
  return r;
}

std::vector<LaneInfo> Recorder::lanes() const {
  std::lock_guard lock(mutex_);
  return lanes_;
}

std::vector<Record> Recorder::snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<Record> out;
  out.reserve(ring_.size());
  for (const Record& r : ring_) {
    if (r.ticket != 0) out.push_back(r);
  }
  std::sort(out.begin(), out.end(), [](const Record& a, const Record& b) { return a.ticket < b.ticket; });
  return out;
}

namespace {
std::string json_string(std::string_view s) {
  return json_quoted(s);
}

std::string_view lane_name(const Record& r, const std::vector<LaneInfo>& lanes) {
  return r.lane < lanes.size() ? std::string_view(lanes[r.lane].name) : std::string_view("?");
}

std::string size_text(std::uint64_t bytes) {
  if (bytes >= (1ull << 30)) return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1ull << 30));
  if (bytes >= (1ull << 20)) return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.1f} KiB", static_cast<double>(bytes) / (1ull << 10));
  return fmt::format("{} B", bytes);
}
}  // namespace

std::string record_json(const Record& r, const std::vector<LaneInfo>& lanes) {
  return fmt::format(
      "{{\"ticket\": {}, \"lane\": {}, \"seq\": {}, \"op\": {}, \"phase\": {}, \"unit\": {}, \"dtype\": \"{}\", "
      "\"count\": {}, \"bytes\": {}, \"reduce_op\": {}, \"root\": {}, \"step\": {}, \"micro_batch\": {}, "
      "\"fingerprint\": \"{:016x}\", \"enqueued_ns\": {}, \"started_ns\": {}, \"completed_ns\": {}, \"failed\": {}, "
      "\"describe\": {}}}",
      r.ticket, json_string(lane_name(r, lanes)), r.seq, json_string(r.op.view()), json_string(r.phase.view()),
      json_string(r.unit.view()), dtype_name(r.dtype), r.count, r.size_bytes,
      r.reduce_op < 0 ? std::string("null") : json_string(reduce_op_name(static_cast<ReduceOp>(r.reduce_op))), r.root,
      r.step, r.micro_batch, r.fingerprint, r.enqueued_ns, r.started_ns, r.completed_ns, r.failed ? "true" : "false",
      json_string(describe_record(r, lanes)));
}

std::string describe_record(const Record& r, const std::vector<LaneInfo>& lanes) {
  const bool bootstrap = lane_name(r, lanes) == "bootstrap";
  std::string s = bootstrap ? fmt::format("bootstrap {} #{} ({}", r.op.view(), r.seq, size_text(r.size_bytes))
                            : fmt::format("{} #{} ({} x {}, {}", r.op.view(), r.seq, dtype_name(r.dtype), r.count,
                                          size_text(r.size_bytes));
  if (r.reduce_op >= 0) s += fmt::format(", {}", reduce_op_name(static_cast<ReduceOp>(r.reduce_op)));
  s += "; ";
  s += r.phase.view().empty() ? std::string_view("unannotated") : r.phase.view();
  if (!r.unit.view().empty()) s += fmt::format(" unit {}", r.unit.view());
  if (r.step >= 0) s += fmt::format(", step {}", r.step);
  if (r.micro_batch >= 0) s += fmt::format(", micro-batch {}", r.micro_batch);
  return s + ")";
}

}  // namespace flight
}  // namespace zero3::comm
