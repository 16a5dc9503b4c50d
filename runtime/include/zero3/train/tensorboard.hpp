// TensorBoard event files written natively, without TensorFlow or protobuf: TFRecord framing (the length and
// the payload, each followed by its masked CRC-32C) around `Event` messages encoded by hand, carrying scalar
// summaries (Summary.Value.simple_value). TensorBoard and its event reader
// (tensorboard.backend.event_processing) read them as they read torch's SummaryWriter files.
//
//   zero3::train::TensorBoardWriter tb("runs/job");   // runs/job/events.out.tfevents.<time>.<host>.<pid>.0
//   tb.scalar("Train/Samples/train_loss", 2.31, 4096);
//   tb.flush();
//
// TensorBoardMonitor is the trainer's observer: DeepSpeed's `tensorboard` block, DeepSpeed's directory layout
// (<output_path>/<job_name>/, output_path "" = the working directory) and event names.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "zero3/config/config.hpp"
#include "zero3/train/observer.hpp"

namespace zero3::train {

// CRC-32C (Castagnoli), as TFRecord frames use it, and TFRecord's mask of it.
std::uint32_t crc32c(std::span<const std::byte> bytes);
std::uint32_t masked_crc32c(std::span<const std::byte> bytes);

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and opens a new event file there (its first record: file_version
  // "brain.Event:2"). ConfigError naming the directory or file when either cannot be created.
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  // One Event{wall_time, step, summary{value{tag, simple_value}}} record. Error naming the file on I/O errors.
  void scalar(std::string_view tag, double value, std::int64_t step);
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void record(const std::string& event);

  std::filesystem::path path_;
  std::ofstream out_;
};

// DeepSpeed's `tensorboard` monitor on rank 0. At each step (x = training samples so far, DeepSpeed's
// global_samples): Train/Samples/train_loss, Train/Samples/lr, Train/Samples/loss_scale (fp16); at each log
// line also heldout_loss, grad_norm, skipped_steps and tokens_per_s under Train/Samples/, and the peak bytes
// so far of each memory kind and category in MiB (Memory/<kind>/<category>_peak_MiB, non-zero ones).
class TensorBoardMonitor final : public TrainObserver {
 public:
  TensorBoardMonitor(int rank, const config::MonitorConfig& monitor, bool fp16);
  void on_step(const StepEvent& e) override;
  void on_log(const LogEvent& e) override;

 private:
  std::unique_ptr<TensorBoardWriter> writer_;  // null off rank 0 or when disabled
  bool fp16_;
  std::int64_t samples_ = 0;  // of the last step: log lines follow their step's on_step
};

}  // namespace zero3::train
