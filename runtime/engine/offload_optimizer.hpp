// CPU offload of the optimizer (zero_optimization.offload_optimizer.device = cpu): the master and the moments
// (fp32, or 16-bit as StateStorage says) and the fp32 gradient accumulators of this rank's shard live in host
// memory (pinned when pin_memory is set), on the NUMA node closest to the rank's GPU, stepped by the SIMD CPU
// optimizers (zero3/offload/cpu_optimizer.hpp) on threads bound to that node's cores.
//
// Pipeline: each reduced gradient piece is copied device-to-host into a ring of staging slots on the comm
// stream as soon as it is reduced (during backward), and a host worker accumulates it into the fp32
// accumulators (the first arrival of a window overwrites, so no zeroing pass), taking the norm and
// overflow statistics in the same pass in the window's last micro-batch. At the boundary the CPU steps
// the host region in slices of at most 1 Mi elements (chunks never cross a sub_group_size boundary), and
// each slice's new low-precision params are copied host-to-device on the comm stream while the CPU steps
// the next.
// offload_optimizer.ratio < 1 keeps the first sub-groups on the device (DeepSpeed: sub-group i goes to the
// CPU when i >= int((1 - ratio) * n)), stepped by the device kernels concurrently with the CPU.
// Engine thread only (plus the worker and the CPU pool, internal).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "layout.hpp"
#include "optimizer_step.hpp"
#include "timeline.hpp"
#include "zero3/comm/world.hpp"
#include "zero3/config/config.hpp"
#include "zero3/device/device.hpp"
#include "zero3/engine/memory_plan.hpp"
#include "zero3/offload/cpu_optimizer.hpp"
#include "zero3/offload/numa.hpp"
#include "zero3/offload/pinned_budget.hpp"

namespace zero3::engine {

// Where a rank's offloaded host memory and optimizer threads go, decided once per engine (NUMA node of
// the GPU, or of the rank's CPU set), with the CPU pool and the SIMD path.
class OffloadHost {
 public:
  OffloadHost(const Device& device, const comm::World& world);
  ~OffloadHost();
  // A host buffer (pinned or pageable) allocated with its pages bound to the chosen NUMA node.
  Buffer allocate(Device& device, std::size_t count, DType dtype, bool pinned, MemCategory category);
  offload::CpuThreadPool& pool() { return *pool_; }
  offload::SimdPath simd() const { return simd_; }
  const offload::NumaPlacement& placement() const { return placement_; }
  std::string describe() const;

 private:
  std::optional<offload::HostTopology> topology_;
  offload::NumaPlacement placement_;
  std::unique_ptr<offload::CpuThreadPool> pool_;
  offload::SimdPath simd_ = offload::SimdPath::scalar;
};

class NvmeParams;  // nvme_params.hpp

// The host region of the state order: [cut, state_count) goes to the CPU.
std::size_t offload_cut(const config::Config& config, std::size_t state_count);

// What the offloaded optimizer exchanges with the rest of the engine; set them by name:
// {.compute_dtype = ..., .comm_dtype = ..., .params_on_device = ...}.
struct OffloadOptions {
  DType compute_dtype = DType::f32;  // the param shards the step writes
  DType comm_dtype = DType::f32;     // the reduced gradient pieces that arrive for accumulation
  // Whether the param shards are device memory (new params copied host-to-device per chunk) or host memory
  // (offload_param cpu: written in place).
  bool params_on_device = true;
  // offload_param nvme: the file the new params are written to, per slice (params_on_device is false).
  NvmeParams* nvme_params = nullptr;
};

// What the offloaded optimizer allocates, per memory kind and category: the host chunks (master,
// accumulators, moments, and the new params' host copy when the params are on the device), the gradient
// staging slots, the statistics' scalars, and the device part below the cut (offload_optimizer.ratio < 1).
// Empty without offload_optimizer. `device`: the staging kind of the scalars (host backend: pageable).
MemoryTable offload_optimizer_memory(const config::Config& config, const Layout& layout, const OffloadOptions& options,
                                     DeviceKind device);

// Bytes of host memory a rank's offload will allocate, for the budget check made before any allocation:
// the offloaded optimizer's host memory and the offloaded param shards.
struct HostFootprint {
  std::uint64_t pinned_bytes = 0;
  std::uint64_t pageable_bytes = 0;
};
HostFootprint offload_footprint(const config::Config& config, const Layout& layout, const OffloadOptions& options,
                                DeviceKind device);

// The offloaded ShardOptimizer.
std::unique_ptr<ShardOptimizer> make_offload_optimizer(const config::Config& config, const Layout& layout,
                                                       Device& device, Stream& stream, OffloadHost& host,
                                                       Timeline& timeline, const OffloadOptions& options);

}  // namespace zero3::engine
