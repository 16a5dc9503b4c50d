#include "zero3/train/tensorboard.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>

#include "zero3/core/error.hpp"
#include "zero3/core/memory.hpp"

namespace zero3::train {
namespace {

constexpr std::uint32_t kCastagnoliReflected = 0x82F63B78u;
constexpr std::uint32_t kTfRecordMaskDelta = 0xa282ead8u;
constexpr double kMiB = 1024.0 * 1024.0;

constexpr std::array<std::uint32_t, 256> crc32c_table() {
  std::array<std::uint32_t, 256> table{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int bit = 0; bit < 8; ++bit) c = (c & 1u) != 0 ? (c >> 1) ^ kCastagnoliReflected : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr auto kCrc32cTable = crc32c_table();

// Protocol-buffer wire format, only what an Event with a scalar summary needs.
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void put_fixed(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, static_cast<std::uint64_t>(field) << 3 | static_cast<std::uint64_t>(wire_type));
}

void put_bytes_field(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event fields: 1 wall_time (double), 2 step (int64), 3 file_version (string), 5 summary (Summary).
std::string event_header(std::int64_t step) {
  const double wall_time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string event;
  put_key(event, 1, 1);
  put_fixed(event, std::bit_cast<std::uint64_t>(wall_time), 8);
  put_key(event, 2, 0);
  put_varint(event, static_cast<std::uint64_t>(step));
  return event;
}

std::span<const std::byte> as_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

std::string host_name() {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) return "localhost";
  return host.data();
}

}  // namespace

std::uint32_t crc32c(std::span<const std::byte> bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (std::byte b : bytes) crc = kCrc32cTable[(crc ^ std::to_integer<std::uint32_t>(b)) & 0xffu] ^ (crc >> 8);
  return crc ^ 0xffffffffu;
}

std::uint32_t masked_crc32c(std::span<const std::byte> bytes) {
  const std::uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + kTfRecordMaskDelta;
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw ConfigError(fmt::format("tensorboard: cannot create directory {}: {}", dir.string(), ec.message()));
  // torch's SummaryWriter names its files the same way; the last field keeps two writers of one process and
  // second apart.
  static std::atomic<int> serial{0};
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = dir / fmt::format("events.out.tfevents.{:010d}.{}.{}.{}", seconds, host_name(), ::getpid(), serial++);
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw ConfigError(fmt::format("tensorboard: cannot create {}: {}", path_.string(), std::strerror(errno)));
  std::string event = event_header(0);
  put_bytes_field(event, 3, "brain.Event:2");
  record(event);
  flush();
}

void TensorBoardWriter::record(const std::string& event) {
  std::string length;
  put_fixed(length, event.size(), 8);
  std::string framed = length;
  put_fixed(framed, masked_crc32c(as_bytes(length)), 4);
  framed += event;
  put_fixed(framed, masked_crc32c(as_bytes(event)), 4);
  out_.write(framed.data(), static_cast<std::streamsize>(framed.size()));
  if (!out_) throw Error(fmt::format("tensorboard: writing {} failed", path_.string()));
}

void TensorBoardWriter::scalar(std::string_view tag, double value, std::int64_t step) {
  // Summary.Value fields: 1 tag (string), 2 simple_value (float); Summary: 1 value (repeated Value).
  std::string summary_value;
  put_bytes_field(summary_value, 1, tag);
  put_key(summary_value, 2, 5);
  put_fixed(summary_value, std::bit_cast<std::uint32_t>(static_cast<float>(value)), 4);
  std::string summary;
  put_bytes_field(summary, 1, summary_value);
  std::string event = event_header(step);
  put_bytes_field(event, 5, summary);
  record(event);
}

void TensorBoardWriter::flush() {
  out_.flush();
  if (!out_) throw Error(fmt::format("tensorboard: writing {} failed", path_.string()));
}

TensorBoardMonitor::TensorBoardMonitor(int rank, const config::MonitorConfig& monitor, bool fp16) : fp16_(fp16) {
  if (rank != 0 || !monitor.enabled) return;
  const std::filesystem::path base =
      monitor.output_path.empty() ? std::filesystem::current_path() : std::filesystem::path(monitor.output_path);
  writer_ = std::make_unique<TensorBoardWriter>(base / monitor.job_name);
}

void TensorBoardMonitor::on_step(const StepEvent& e) {
  samples_ = e.samples;
  if (!writer_) return;
  writer_->scalar("Train/Samples/train_loss", e.loss, e.samples);
  writer_->scalar("Train/Samples/lr", e.result.lr, e.samples);
  if (fp16_) writer_->scalar("Train/Samples/loss_scale", e.result.loss_scale, e.samples);
}

void TensorBoardMonitor::on_log(const LogEvent& e) {
  if (!writer_) return;
  writer_->scalar("Train/Samples/heldout_loss", e.heldout_loss, samples_);
  writer_->scalar("Train/Samples/grad_norm", e.result.grad_norm, samples_);
  writer_->scalar("Train/Samples/skipped_steps", static_cast<double>(e.result.skipped_steps), samples_);
  writer_->scalar("Train/Samples/tokens_per_s", e.tokens_per_s, samples_);
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      const std::size_t peak = e.memory_peaks[k][c].peak_bytes;
      if (peak == 0) continue;
      writer_->scalar(fmt::format("Memory/{}/{}_peak_MiB", memory_kind_name(static_cast<MemoryKind>(k)),
                                  mem_category_name(static_cast<MemCategory>(c))),
                      static_cast<double>(peak) / kMiB, samples_);
    }
  }
  writer_->flush();
}

}  // namespace zero3::train
