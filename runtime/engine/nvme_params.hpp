// NVMe offload of the params (zero_optimization.offload_param.device = nvme): this rank's compute-dtype param
// shards (layout.param_shard_count elements, the flat layout) in one file, params.<dtype>, in a directory of
// the rank's own under offload_param.nvme_path (RankDirectory, swap_file.hpp), read and written with O_DIRECT.
//
// Host memory: the units kept there (persistent units always, since the device copies of their params are
//   refreshed after every step; then, in layout order, units while their shards' elements add up to at most
//   max_in_cpu, DeepSpeed's meaning), and buffer_count read buffers, each sized to the largest shard of the
//   units not kept (buffer_size elements is the most a buffer may take: a unit whose shard is larger is a
//   ConfigError before training).
// Gathers: shard(unit, group) is a unit's shard in host memory, for the host-to-device copy of its gather:
//   kept units in place, the others in a read buffer, read then unless read_ahead() already queued the read.
//   read_ahead() takes the units the trace says come next (GatherSchedule::gathers_ahead) and queues their
//   reads into the buffers that are free, so the disk works while the device computes earlier units.
//   copied(unit, stream) marks the unit's buffer in use until `stream` has passed the copies enqueued so far.
// Writes (the optimizer step's new params, a checkpoint's load, initialization) go to the file and to the
//   kept units' host copies, and drop every read-ahead buffer (it may hold the old values).
// Engine thread only.
//
//   engine::NvmeParams params(config, layout, device, host, DType::bf16, rank);
//   params.write(0, n, values);                      // initialization
//   params.read_ahead(schedule.gathers_ahead(params.buffer_count()));
//   const ConstBufferView own = params.shard(unit, Group::trainable);
//   device.copy_async(dst, own, comm_stream);
//   params.copied(unit, comm_stream);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "layout.hpp"
#include "offload_optimizer.hpp"
#include "swap_file.hpp"
#include "zero3/config/config.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/memory_plan.hpp"
#include "zero3/engine/stats.hpp"
#include "zero3/offload/aio.hpp"

namespace zero3::engine {

class NvmeParams {
 public:
  // ConfigError naming offload_param.buffer_count (< 1) or buffer_size (smaller than a unit's shard); IoError
  // when the directory or file cannot be made.
  NvmeParams(const config::Config& config, const Layout& layout, Device& device, OffloadHost& host, DType dtype,
             int rank);
  ~NvmeParams();
  NvmeParams(const NvmeParams&) = delete;
  NvmeParams& operator=(const NvmeParams&) = delete;

  DType dtype() const { return dtype_; }
  std::size_t buffer_count() const { return slots_.size(); }
  bool kept(std::size_t unit) const { return kept_[unit].has_value(); }
  const std::string& path() const { return file_->path(); }

  // Elements [first, first + n) into dst / from src (host memory), blocking.
  void read(std::size_t first, std::size_t n, void* dst);
  void write(std::size_t first, std::size_t n, const void* src);
  // The step's new params of a block-aligned slice (first * element size a multiple of the O_DIRECT block;
  // `src` aligned, holding n elements rounded up to whole blocks): written on `queue` without waiting when
  // the slice ends on a block boundary or at the end of the params, blocking otherwise. The caller waits on
  // the ticket (if any) before reusing `src` and before the next read of these params.
  std::optional<offload::AioQueue::Ticket> write_blocks(offload::AioQueue& queue, std::size_t first, std::size_t n,
                                                        const void* src);

  // The unit's shard of group g (gl.shard elements) in host memory: valid until the unit's buffer is reused
  // (after copied() and the stream passing the copies).
  ConstBufferView shard(std::size_t unit, Group g);
  void copied(std::size_t unit, Stream& stream);
  // Queues reads of these units (in order, skipping kept ones and ones already in a buffer) while buffers are
  // free; never blocks.
  void read_ahead(std::span<const std::size_t> units);

  // The bytes read from the file and the time blocked on those reads since the last call (the window's
  // gathers, when called at the end of each window).
  DiskTimes take_disk_times();

 private:
  struct Slot {
    Buffer memory;
    std::byte* aligned = nullptr;
    std::size_t unit = kNone;
    std::optional<offload::AioQueue::Ticket> read;
    std::unique_ptr<Event> copied;
    bool copy_pending = false;
    std::uint64_t last_use = 0;
  };
  struct Shard {  // a unit's shard of one group: elements [flat, flat + count) of the flat layout
    std::size_t flat = 0;
    std::size_t count = 0;
  };
  struct UnitShards {
    std::string name;
    Shard trainable;
    Shard frozen;
    const Shard& of(Group g) const { return g == Group::frozen ? frozen : trainable; }
  };
  struct KeptRange {
    std::size_t first = 0;  // flat
    std::size_t count = 0;
    std::size_t host = 0;  // element offset in kept_memory_
  };
  static constexpr std::size_t kNone = ~std::size_t{0};

  Slot* find_slot(std::size_t unit);
  Slot* free_slot(bool wait);
  void start_read(Slot& slot, std::size_t unit);
  void drop_read_ahead();
  void write_kept(std::size_t first, std::size_t n, const void* src);
  bool all_kept(std::size_t first, std::size_t n) const;

  std::vector<UnitShards> units_;  // the layout's, copied: the engine moves its layout after construction
  std::size_t count_ = 0;          // layout.param_shard_count
  DType dtype_;
  RankDirectory dir_;  // before the file: removed after it
  std::optional<SwapFile> file_;
  offload::AioQueue queue_;
  offload::AlignedBuffer bounce_;
  Buffer kept_memory_;
  std::vector<std::optional<std::size_t>> kept_;  // per unit: element offset of its trainable shard in kept_memory_
  std::vector<KeptRange> kept_ranges_;            // by flat offset
  std::vector<Slot> slots_;
  std::uint64_t uses_ = 0;
  offload::AioQueue::Counters reported_;
};

// Host memory NVMe-offloaded params take (kept units, read buffers), per kind and category; empty unless
// offload_param.device is nvme. The bytes of the file: nvme_params_disk_bytes.
MemoryTable nvme_params_memory(const config::Config& config, const Layout& layout, DType dtype);
std::uint64_t nvme_params_disk_bytes(const config::Config& config, const Layout& layout, DType dtype);
// Elements of the params kept in host memory, and the read buffers' bytes each.
std::size_t nvme_params_kept_elems(const config::Config& config, const Layout& layout);
std::size_t nvme_params_buffer_bytes(const config::Config& config, const Layout& layout, DType dtype);

}  // namespace zero3::engine
