#include "zero3/train/sinks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/checkpointer.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/train/memory_report.hpp"

namespace zero3::train {
namespace {

nlohmann::json split_json(const StepSplit& s) {
  return {{"forward", s.forward_ms},
          {"backward", s.backward_ms},
          {"step", s.step_ms},
          {"gather_wait", s.gather_wait_ms},
          {"reduce_wait", s.reduce_wait_ms},
          {"optimizer", s.optimizer_ms},
          {"copies_exposed", s.copies_exposed_ms},
          {"kept_copies", s.kept_copies_ms},
          {"total", s.total_ms()}};
}

// NVMe offload's disk figures of the split, or null without NVMe offload.
nlohmann::json disk_json(const StepSplit& s) {
  if (s.disk_step_ms == 0.0 && s.disk_grad_write_bytes == 0.0 && s.disk_param_read_bytes == 0.0) return nullptr;
  return {{"step_ms", s.disk_step_ms},
          {"step_wait_ms", s.disk_step_wait_ms},
          {"grad_wait_ms", s.disk_grad_wait_ms},
          {"step_read_bytes", s.disk_step_read_bytes},
          {"step_write_bytes", s.disk_step_write_bytes},
          {"grad_read_bytes", s.disk_grad_read_bytes},
          {"grad_write_bytes", s.disk_grad_write_bytes},
          {"param_read_bytes", s.disk_param_read_bytes},
          {"param_wait_ms", s.disk_param_wait_ms}};
}

}  // namespace

void LogLine::on_resume(const ckpt::LoadResult& loaded) {
  if (rank_ != 0) return;
  fmt::print("resumed from checkpoint '{}' (step {}, saved by {} rank(s), {:.1f} MB read by rank 0)\n", loaded.tag,
             loaded.step, loaded.saved_world_size, static_cast<double>(loaded.bytes_read) / 1e6);
  std::fflush(stdout);
}

void LogLine::on_log(const LogEvent& e) {
  if (rank_ != 0) return;
  const StepResult& r = e.result;
  fmt::print(
      "step {:>6}/{}  loss {:.4f}  heldout {:.4f}{}  lr {:.3e}  scale {:g}  grad norm {:.3f}  skipped {}  "
      "{:.0f} tokens/s\n",
      e.step, e.steps, e.train_loss, e.heldout_loss,
      e.entropy_floor ? fmt::format(" (floor {:.4f})", *e.entropy_floor) : std::string(), r.lr, r.loss_scale,
      r.grad_norm, r.skipped_steps, e.tokens_per_s);
  if (e.timed) {
    const StepSplit& s = e.split;
    fmt::print(
        "  time/step {:.2f} ms = forward {:.2f} + backward {:.2f} + step {:.2f} (optimizer {:.2f}); waiting for "
        "gathers {:.2f}, reductions {:.2f}, offload copies {:.2f}, checkpointed-input copies {:.2f}\n",
        s.total_ms(), s.forward_ms, s.backward_ms, s.step_ms, s.optimizer_ms, s.gather_wait_ms, s.reduce_wait_ms,
        s.copies_exposed_ms, s.kept_copies_ms);
    if (s.disk_step_ms > 0.0) {
      constexpr double kGB = 1e9;
      const double moved = s.disk_step_read_bytes + s.disk_step_write_bytes;
      fmt::print(
          "  disk (NVMe offload): the update read {:.2f} GB and wrote {:.2f} GB in {:.0f} ms ({:.2f} GB/s; "
          "waiting {:.0f} ms); gradients read {:.2f} GB, wrote {:.2f} GB (waiting {:.0f} ms)\n",
          s.disk_step_read_bytes / kGB, s.disk_step_write_bytes / kGB, s.disk_step_ms,
          moved / kGB / (s.disk_step_ms / 1e3), s.disk_step_wait_ms, s.disk_grad_read_bytes / kGB,
          s.disk_grad_write_bytes / kGB, s.disk_grad_wait_ms);
    }
    if (s.disk_param_read_bytes > 0.0) {
      fmt::print("  disk (NVMe offload of params): the gathers read {:.2f} GB (waiting {:.0f} ms)\n",
                 s.disk_param_read_bytes / 1e9, s.disk_param_wait_ms);
    }
  }
  if (!e.memory_phases.empty()) fmt::print("{}", memory_phase_lines(e.memory_phases));
  std::fflush(stdout);
}

std::string memory_phase_lines(const std::vector<MemoryTracker::PhaseStats>& phases) {
  constexpr double kMiB = 1 << 20;
  std::string out = "  memory by phase (MiB; peak, and at its end; the largest categories at the peak):\n";
  for (const MemoryTracker::PhaseStats& p : phases) {
    out += fmt::format("    {:<28}", p.name);
    for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
      std::size_t peak = 0;
      std::size_t now = 0;
      for (const MemoryTracker::Counter& c : p.bytes[k]) {
        peak += c.peak_bytes;
        now += c.current_bytes;
      }
      if (peak == 0) continue;
      out += fmt::format(" {} {:.2f} ({:.2f})", memory_kind_name(static_cast<MemoryKind>(k)),
                         static_cast<double>(peak) / kMiB, static_cast<double>(now) / kMiB);
    }
    // The two largest device categories at their peak: what the phase is made of.
    std::vector<std::pair<std::size_t, std::size_t>> top;
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      const std::size_t b = p.bytes[static_cast<std::size_t>(MemoryKind::device)][c].peak_bytes;
      if (b > 0) top.emplace_back(b, c);
    }
    std::sort(top.begin(), top.end(), std::greater<>());
    for (std::size_t i = 0; i < std::min<std::size_t>(2, top.size()); ++i) {
      out +=
          fmt::format("{} {} {:.2f}", i == 0 ? "  [" : ", ", mem_category_name(static_cast<MemCategory>(top[i].second)),
                      static_cast<double>(top[i].first) / kMiB);
    }
    out += top.empty() ? "\n" : "]\n";
  }
  return out;
}

void LogLine::on_save(const ckpt::SaveReport& rep) {
  if (rank_ != 0 || !rep.ok) return;  // the loop reports a failure as an event, which logs it
  fmt::print("checkpoint {}: {:.1f} MB in {:.2f} s (training blocked {:.3f} s) -> {}\n", rep.tag,
             static_cast<double>(rep.bytes) / 1e6, rep.total_s, rep.snapshot_s, rep.dir.string());
  std::fflush(stdout);
}

void ProgressLine::on_step(const StepEvent& e) {
  if (rank_ != 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - drawn_ < std::chrono::milliseconds(500)) return;
  drawn_ = now;
  const double eta = e.elapsed_s / static_cast<double>(e.step) * static_cast<double>(e.steps - e.step);
  fmt::print("\r  step {}/{}  loss {:.4f}  {:.0f} tokens/s  ETA {:.0f} s   ", e.step, e.steps, e.loss, e.tokens_per_s,
             eta);
  std::fflush(stdout);
}

void ProgressLine::on_log(const LogEvent& /*e*/) {
  if (rank_ != 0) return;
  fmt::print("\r{:80}\r", "");
}

JsonlMetrics::JsonlMetrics(int rank, const std::filesystem::path& path) {
  if (rank != 0) return;
  out_.open(path);
  if (!out_) {
    throw ConfigError(
        fmt::format("--metrics {}: cannot write: {}", path.string(), std::generic_category().message(errno)));
  }
}

void JsonlMetrics::on_log(const LogEvent& e) {
  if (!out_.is_open()) return;
  nlohmann::json line = {{"step", e.step},
                         {"loss", e.train_loss},
                         {"heldout_loss", e.heldout_loss},
                         {"lr", e.result.lr},
                         {"grad_norm", e.result.grad_norm},
                         {"loss_scale", e.result.loss_scale},
                         {"skipped_steps", e.result.skipped_steps},
                         {"tokens_per_s", e.tokens_per_s}};
  if (e.entropy_floor) line["entropy_floor"] = *e.entropy_floor;
  if (e.timed) {
    line["time_ms"] = split_json(e.split);
    if (nlohmann::json disk = disk_json(e.split); !disk.is_null()) line["disk"] = std::move(disk);
  }
  if (!e.memory_phases.empty()) {
    nlohmann::json phases = nlohmann::json::array();
    for (const MemoryTracker::PhaseStats& p : e.memory_phases) {
      MemoryTable current;
      MemoryTable peak;
      for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
        for (std::size_t c = 0; c < kNumMemCategories; ++c) {
          current.bytes[k][c] = p.bytes[k][c].current_bytes;
          peak.bytes[k][c] = p.bytes[k][c].peak_bytes;
        }
      }
      phases.push_back(
          {{"phase", p.name}, {"current_bytes", memory_table_json(current)}, {"peak_bytes", memory_table_json(peak)}});
    }
    line["memory"] = phases;
  }
  out_ << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n' << std::flush;
}

CsvMonitor::CsvMonitor(int rank, const config::MonitorConfig& monitor, bool fp16)
    : enabled_(rank == 0 && monitor.enabled), fp16_(fp16) {
  if (!enabled_) return;
  const std::filesystem::path base =
      monitor.output_path.empty() ? std::filesystem::current_path() : std::filesystem::path(monitor.output_path);
  dir_ = base / monitor.job_name;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) {
    throw ConfigError(fmt::format("csv_monitor.output_path: cannot create {}: {}", dir_.string(), ec.message()));
  }
}

void CsvMonitor::on_step(const StepEvent& e) {
  if (!enabled_) return;
  write("Train/Samples/train_loss", e.loss, e.samples);
  write("Train/Samples/lr", e.result.lr, e.samples);
  if (fp16_) write("Train/Samples/loss_scale", e.result.loss_scale, e.samples);
}

void CsvMonitor::write(const std::string& name, double value, std::int64_t samples) {
  std::string file = name;
  std::replace(file.begin(), file.end(), '/', '_');
  std::replace(file.begin(), file.end(), ' ', '_');
  const std::filesystem::path path = dir_ / (file + ".csv");
  const bool fresh = !started_.contains(file);
  std::ofstream out(path, fresh ? std::ios::trunc : std::ios::app);
  if (!out) throw Error(fmt::format("csv_monitor: cannot write {}", path.string()));
  if (fresh) out << "step," << name.substr(name.rfind('/') + 1) << '\n';
  out << samples << ',' << fmt::format("{}", value) << '\n';
  started_.insert(file);
}

double EntropyFloorCheck::margin(const LogEvent& e) const {
  return std::max(min_margin_, z_ * e.entropy_floor_se.value_or(0.0));
}

void EntropyFloorCheck::on_log(const LogEvent& e) {
  // A NaN compares below nothing: a non-finite held-out loss is a diverged model, which the trainer reports
  // as such at the end of the run, not a model that sees the future.
  const double allowed = margin(e);
  if (!e.entropy_floor || !std::isfinite(e.heldout_loss) || e.heldout_loss >= *e.entropy_floor - allowed) return;
  throw Error(fmt::format(
      "step {}: held-out loss {:.4f} is below the data's entropy floor {:.4f} nats/token by {:.4f}, more than the "
      "measurement's margin {:.4f} ({} x its standard error {:.4f}, at least {}); no model can do that on unseen "
      "data, so the model sees what it should not (a future token?)",
      e.step, e.heldout_loss, *e.entropy_floor, *e.entropy_floor - e.heldout_loss, allowed, z_,
      e.entropy_floor_se.value_or(0.0), min_margin_));
}

}  // namespace zero3::train
