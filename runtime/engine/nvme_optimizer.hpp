// NVMe offload of the optimizer (zero_optimization.offload_optimizer.device = nvme): this rank's master and
// moments (in their StateStorage dtypes: 16-bit files take half the disk and half the step's traffic) and fp32
// gradient accumulators live in files under offload_optimizer.nvme_path, in a directory of the rank's own
// (zero3-<host>-<pid>-<n>-rank<r>) that the optimizer creates and removes; host memory holds only pipeline
// buffers. Files are read and written with O_DIRECT through zero3/offload/aio.hpp (io_uring).
//
// Gradients: each reduced piece is copied device-to-host as with CPU offload, and the worker thread then
//   - in a micro-batch before the window's last: appends it, as it arrived (comm dtype), to the log of that
//     micro-batch (one file per micro-batch index): written once, never read back in that micro-batch;
//   - in the window's last micro-batch: reads the piece's earlier logs, sums them and the new values in fp32
//     in arrival order (0 + g1 + g2 + ...: the additions CPU offload makes, so the same bits), takes the
//     norm statistics in the same pass, and writes the fp32 sum to the accumulator file once.
//   So per window the disk takes, per element, (k - 1) comm-dtype writes and reads and one fp32 write and
//   read, where a read-modify-write of fp32 accumulators would take k of each. Pieces whose last arrival was
//   earlier are summed at the boundary; ranges no gradient reached are zeroed there.
// Step: the state is cut into block-aligned slices (sub_group_size rounded up to whole blocks, at most
//   kNvmeSliceElems), stepped in order through a ring of
//   slice buffers: with pipeline_read the next slices' master, moments and accumulators are read while the
//   CPU steps the current one, with pipeline_write the stepped slice's master and moments are written back
//   while the CPU goes on; the new compute-dtype params go to the device per slice as with CPU offload.
// Numerics: element for element the CPU-offload step on the same values, so an NVMe-offloaded run equals a
// CPU-offloaded one bitwise (tests/mpi/test_offload_equivalence.cpp). Engine thread only (plus the worker).
#pragma once

#include <memory>

#include "layout.hpp"
#include "offload_optimizer.hpp"
#include "optimizer_step.hpp"
#include "timeline.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/config.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/memory_plan.hpp"
#include "zero3/offload/aio.hpp"

namespace zero3::engine {

// The largest step slice, in elements (a multiple of the O_DIRECT block in every stored dtype).
inline constexpr std::size_t kNvmeSliceElems = std::size_t{1} << 22;

// The aio block's settings (zero3/offload/aio.hpp) for the queues of NVMe offload.
offload::AioOptions nvme_aio_options(const config::Config& config);

// Host memory the NVMe optimizer allocates (slice ring, gradient staging, the worker's buffers), per kind
// and category; empty unless offload_optimizer.device is nvme.
MemoryTable nvme_optimizer_memory(const config::Config& config, const Layout& layout, const OffloadOptions& options,
                                  DeviceKind device);
// Bytes its files take on the disk: master and moments (in their stored dtypes), the fp32 accumulators and the
// gradient logs of gradient_accumulation_steps - 1 micro-batches (comm dtype), each rounded up to whole blocks.
std::uint64_t nvme_optimizer_disk_bytes(const config::Config& config, const Layout& layout,
                                        const OffloadOptions& options);

// What one optimizer step reads from and writes to those files (per rank, bytes, the window's gradients
// included): master, accumulator and moments read, master and moments written, the fp32 accumulator written,
// and each log written and read once.
struct NvmeTraffic {
  std::uint64_t read_bytes = 0;
  std::uint64_t write_bytes = 0;
};
NvmeTraffic nvme_optimizer_traffic(const config::Config& config, const Layout& layout, const OffloadOptions& options);

std::unique_ptr<ShardOptimizer> make_nvme_optimizer(const config::Config& config, const Layout& layout, Device& device,
                                                    Stream& stream, OffloadHost& host, Timeline& timeline,
                                                    const OffloadOptions& options, const comm::World& world);

}  // namespace zero3::engine
