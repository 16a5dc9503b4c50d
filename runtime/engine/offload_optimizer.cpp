#include "offload_optimizer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <optional>

#include "nvme_optimizer.hpp"
#include "nvme_params.hpp"
#include "offload_common.hpp"
#include "zero3/core/cpus.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3/core/trace.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::engine {

namespace {

using config::OptimizerType;

// The step's pipeline granularity: the CPU steps this many elements, then their params' host-to-device
// copy is enqueued and overlaps the next slice's step (finer than sub_group_size, whose default of 1e9
// would leave the whole copy after the CPU work).
constexpr std::size_t kPipelineElems = std::size_t{1} << 20;

// One contiguous piece of the host region, inside one sub-group.
struct HostChunk {
  std::size_t offset = 0;  // in the state order
  std::size_t count = 0;
  Buffer master;
  Buffer exp_avg;
  Buffer exp_avg_sq;
  Buffer acc;
  Buffer params;  // compute-dtype copy for the device (only when the param shards are device memory)
};

class OffloadShardOptimizer final : public ShardOptimizer {
 public:
  OffloadShardOptimizer(const config::Config& config, const Layout& layout, Device& device, Stream& stream,
                        OffloadHost& host, Timeline& timeline, const OffloadOptions& options)
      : config_(*config.optimizer),
        device_(device),
        host_(host),
        timeline_(timeline),
        comm_dtype_(options.comm_dtype),
        compute_dtype_(options.compute_dtype),
        params_on_device_(options.params_on_device),
        nvme_params_(options.nvme_params),
        storage_(StateStorage::of(config)),
        count_(layout.state_count),
        sharded_count_(layout.sharded_state_count),
        cut_(offload_cut(config, layout.state_count)) {
    const std::vector<StateSegment> all = state_segments(layout);
    std::vector<StateSegment> device_segments;
    for (const StateSegment& s : all) {
      if (s.offset < cut_) {
        StateSegment d = s;
        d.count = std::min(s.offset + s.count, cut_) - s.offset;
        device_segments.push_back(d);
      }
      if (s.offset + s.count > cut_) {
        StateSegment h = s;
        h.offset = std::max(s.offset, cut_);
        h.count = s.offset + s.count - h.offset;
        segments_.push_back(h);
      }
    }
    if (cut_ > 0) {
      device_part_ = make_device_optimizer(config_, storage_, device, stream, cut_, std::min(sharded_count_, cut_),
                                           std::move(device_segments));
    }
    // Host chunks: sub-group boundaries, then at most kChunkElems each.
    const bool pinned = config.zero.offload_optimizer.pin_memory;
    const bool has_m = config_.type != OptimizerType::adagrad;
    const bool has_v = config_.type != OptimizerType::lion;
    for (const auto& [a, n] : host_chunk_bounds(config, cut_, count_)) {
      HostChunk c;
      c.offset = a;
      c.count = n;
      c.master = host.allocate(device, n, storage_.master, pinned, MemCategory::master);
      if (has_m) c.exp_avg = host.allocate(device, n, storage_.state, pinned, MemCategory::optim_state);
      if (has_v) c.exp_avg_sq = host.allocate(device, n, storage_.state, pinned, MemCategory::optim_state);
      c.acc = host.allocate(device, n, DType::f32, pinned, MemCategory::grad_shard);
      if (params_on_device_) c.params = host.allocate(device, n, compute_dtype_, pinned, MemCategory::staging);
      for (Buffer* b : {&c.exp_avg, &c.exp_avg_sq, &c.acc}) {
        if (!b->empty()) std::memset(b->data(), 0, b->size_bytes());
      }
      chunks_.push_back(std::move(c));
    }
    if (!chunks_.empty()) {
      slots_.emplace(device, staging_slot_elems(layout), comm_dtype_, [&](std::size_t n, DType dtype) {
        return host.allocate(device, n, dtype, pinned, MemCategory::staging);
      });
      host_scalars_ = device.allocate(2, DType::f32, device.caps().host_staging, MemCategory::staging);
      device_scalars_ = device.allocate(2, DType::f32, MemoryKind::device, MemCategory::workspace);
      if (nvme_params_ != nullptr) nvme_staging_.resize(std::min(kPipelineElems, count_) * size_of(compute_dtype_));
    }
    build_pieces(has_m, has_v);
  }

  ~OffloadShardOptimizer() override {
    try {
      worker_.drain();
    } catch (...) {  // reported by the call that failed; nothing more to do while tearing down
    }
  }

  const StatePieces& pieces(TensorKind kind) const override { return tensors_.get(kind); }

  void set_final_micro_step(bool final) override { final_ = final; }

  // Writing the new params to their file (offload_param nvme) may fail on this rank alone.
  bool step_may_fail_locally() const override { return nvme_params_ != nullptr; }

  void prepare_read() override {
    if (chunks_.empty()) return;
    worker_.drain();
    zero_gaps();
  }

  void accumulate(std::size_t offset, ConstBufferView reduced, Stream& stream) override {
    std::size_t done = 0;
    if (offset < cut_) {
      done = std::min(reduced.count, cut_ - offset);
      device_part_->accumulate(offset, reduced.slice(0, done), stream);
    }
    while (done < reduced.count) {
      const std::size_t at = offset + done;
      const HostChunk& chunk = chunk_at(at);
      const std::size_t n = std::min({reduced.count - done, chunk.offset + chunk.count - at, slots_->elems()});
      arrive(at, reduced.slice(done, n), stream);
      done += n;
    }
  }

  BufferView device_accumulator(std::size_t offset, std::size_t count) override {
    if (device_part_ && offset + count <= cut_) return device_part_->device_accumulator(offset, count);
    return {};
  }

  void grad_stats(Stream& stream, BufferView scalars, bool check_overflow, bool include_persistent) override {
    if (device_part_) device_part_->grad_stats(stream, scalars, check_overflow, include_persistent);
    if (chunks_.empty()) return;
    worker_.drain();
    zero_gaps();
    // Sharded and persistent sums apart, added as the device kernels add them (fp32 sharded sum, then the
    // persistent sum in double, rounded once more), so the norm matches the on-device one.
    offload::GradStats sharded;
    offload::GradStats persistent;
    for (const auto& [at, a] : window_) {
      if (at >= sharded_count_ && !include_persistent) continue;
      offload::GradStats& total = at < sharded_count_ ? sharded : persistent;
      if (a.final) {
        total += stats_[a.stats];
        continue;
      }
      // Its last arrival was in an earlier micro-batch: the statistics of the final values are taken now.
      const HostChunk& c = chunk_at(at);
      const float* acc = c.acc.view().as<float>() + (at - c.offset);
      const offload::SimdPath simd = host_.simd();
      total += host_.pool().reduce_tiles(a.count, kGradTileElems, [&](std::size_t b, std::size_t e) {
        return offload::grad_stats_range(simd, acc + b, e - b);
      });
    }
    float sum_sq = static_cast<float>(sharded.sum_sq);
    if (include_persistent) sum_sq = static_cast<float>(static_cast<double>(sum_sq) + persistent.sum_sq);
    const bool nonfinite = sharded.nonfinite || persistent.nonfinite;
    float* h = host_scalars_.view().as<float>();
    h[0] = check_overflow && nonfinite ? 1.0f : 0.0f;
    h[1] = sum_sq;
    device_.copy_async(device_scalars_.view(), host_scalars_.cview(), stream);
    stream.device().kernels().accumulate(stream, scalars, device_scalars_.cview(), 1.0f);
  }

  void clear_grads(Stream& stream) override {
    if (device_part_) device_part_->clear_grads(stream);
    if (chunks_.empty()) return;
    worker_.drain();
    window_.clear();  // the next window's first arrivals overwrite
    stats_.clear();
  }

  void step(Stream& stream, const OptimizerStepArgs& args, BufferView params) override {
    // The device sub-groups first: the accelerator steps them while the CPU steps the rest.
    if (device_part_) device_part_->step(stream, args, params.slice(0, cut_));
    if (chunks_.empty()) return;
    worker_.drain();
    const offload::SimdPath simd = host_.simd();
    std::size_t host_elems = 0;
    for (const HostChunk& c : chunks_) host_elems += c.count;
    const bool stream_params = host_elems * size_of(compute_dtype_) >= offload::kStreamParamMinBytes;
    for (HostChunk& c : chunks_) {
      std::byte* out = nullptr;
      if (params_on_device_) {
        out = static_cast<std::byte*>(c.params.data());
      } else if (nvme_params_ == nullptr) {
        out = static_cast<std::byte*>(params.data) + c.offset * size_of(params.dtype);
      }
      // Slices of at most kPipelineElems: each slice's params go to the device on the comm stream while the
      // CPU steps the next one, so only the last slice's copy is left after the CPU work.
      for (std::size_t s0 = 0; s0 < c.count; s0 += kPipelineElems) {
        const std::size_t n = std::min(kPipelineElems, c.count - s0);
        const trace::Scope span("cpu optimizer", fmt::format("step {} params", n));
        const auto start = Timeline::Clock::now();
        const auto first_segment =
            std::lower_bound(segments_.begin(), segments_.end(), c.offset + s0,
                             [](const StateSegment& seg, std::size_t at) { return seg.offset + seg.count <= at; });
        host_.pool().for_tiles(n, offload::kCpuStepTileElems, [&](std::size_t b, std::size_t e) {
          const std::size_t tb = c.offset + s0 + b;
          const std::size_t te = c.offset + s0 + e;
          for (auto seg = first_segment; seg != segments_.end() && seg->offset < te; ++seg) {
            const std::size_t sb = std::max(tb, seg->offset);
            const std::size_t se = std::min(te, seg->offset + seg->count);
            if (sb >= se) continue;
            // Params on NVMe: the slice's new params are made in the staging buffer, then written to the file.
            void* param = nvme_params_ != nullptr
                              ? nvme_staging_.data() + (sb - c.offset - s0) * size_of(compute_dtype_)
                              : out + (sb - c.offset) * size_of(compute_dtype_);
            step_range(simd, args, *seg, c, sb - c.offset, se - sb, param, stream_params);
          }
        });
        timeline_.host(Timeline::Lane::cpu, start, Timeline::Clock::now());
        if (nvme_params_ != nullptr) nvme_params_->write(c.offset + s0, n, nvme_staging_.data());
        if (params_on_device_) {
          const std::uint64_t copy = timeline_.begin(stream, Timeline::Lane::h2d);
          device_.copy_async(params.slice(c.offset + s0, n), c.params.cview().slice(s0, n), stream);
          timeline_.end(stream, copy);
          timeline_.add_bytes(Timeline::Lane::h2d, n * size_of(compute_dtype_));
        }
      }
    }
  }

 private:
  void build_pieces(bool has_m, bool has_v) {
    const auto collect = [&](TensorKind kind, Buffer HostChunk::*member, bool exists) {
      StatePieces out;
      if (!exists) return out;
      if (device_part_) out = device_part_->pieces(kind);
      for (const HostChunk& c : chunks_) out.push_back({c.offset, (c.*member).view()});
      return out;
    };
    tensors_.master = collect(TensorKind::master, &HostChunk::master, true);
    tensors_.exp_avg = collect(TensorKind::exp_avg, &HostChunk::exp_avg, has_m);
    tensors_.exp_avg_sq = collect(TensorKind::exp_avg_sq, &HostChunk::exp_avg_sq, has_v);
    tensors_.grad = collect(TensorKind::grad, &HostChunk::acc, true);
  }

  const HostChunk& chunk_at(std::size_t at) const {
    const auto it = std::upper_bound(chunks_.begin(), chunks_.end(), at,
                                     [](std::size_t v, const HostChunk& c) { return v < c.offset; });
    ZERO3_CHECK(it != chunks_.begin(), "offload: state offset below the host region");
    const HostChunk& c = *std::prev(it);
    ZERO3_CHECK(at < c.offset + c.count, "offload: state offset past the host region");
    return c;
  }

  // One piece of gradient for the host region, inside one chunk: device-to-host into a staging slot on
  // the comm stream, then accumulated by the worker once the copy has landed.
  void arrive(std::size_t at, ConstBufferView piece, Stream& stream) {
    StagingSlots::Slot& slot = slots_->stage(device_, timeline_, piece, stream);
    const ArrivalRecord<GradArrival> rec = record_arrival(window_, stats_, at, piece.count, final_);
    offload::GradStats* out = rec.stats;
    const HostChunk& c = chunk_at(at);
    float* acc = c.acc.view().as<float>() + (at - c.offset);
    const bool overwrite = rec.first;
    const bool want_stats = final_;
    const std::size_t n = piece.count;
    const void* src = slot.buffer.data();
    const DType dtype = comm_dtype_;
    worker_.submit([this, &slot, acc, src, dtype, n, overwrite, want_stats, out] {
      slot.copied->synchronize();
      const trace::Scope span("cpu optimizer", fmt::format("accumulate {} gradients", n));
      const auto start = Timeline::Clock::now();
      const offload::SimdPath simd = host_.simd();
      const std::size_t elem = size_of(dtype);
      *out = host_.pool().reduce_tiles(n, kGradTileElems, [&](std::size_t b, std::size_t e) {
        // The window's first arrival overwrites: 0 + 1 * g is what the device's zeroed accumulator gives.
        if (overwrite) std::memset(acc + b, 0, (e - b) * sizeof(float));
        return offload::accumulate_range(simd, acc + b, static_cast<const std::byte*>(src) + b * elem, dtype, 1.0f,
                                         e - b, want_stats);
      });
      timeline_.host(Timeline::Lane::cpu, start, Timeline::Clock::now());
      slots_->release(slot);
    });
  }

  // Host accumulator ranges no gradient reached this window still hold an earlier window's values.
  void zero_gaps() {
    auto it = window_.begin();
    for (const HostChunk& c : chunks_) {
      std::size_t at = c.offset;
      const std::size_t end = c.offset + c.count;
      float* acc = c.acc.view().as<float>();
      while (at < end) {
        while (it != window_.end() && it->first + it->second.count <= at) ++it;
        const std::size_t next = it == window_.end() ? end : std::min(end, it->first);
        if (next > at) {
          std::memset(acc + (at - c.offset), 0, (next - at) * sizeof(float));
          at = next;
        } else {
          at = std::min(end, it->first + it->second.count);
        }
      }
    }
  }

  void step_range(offload::SimdPath simd, const OptimizerStepArgs& args, const StateSegment& seg, HostChunk& c,
                  std::size_t local, std::size_t n, void* param, bool stream_params) {
    const auto at = [local](const Buffer& b) -> void* {
      return b.empty() ? nullptr : static_cast<std::byte*>(b.data()) + local * size_of(b.dtype());
    };
    offload::StepSpan span;
    span.master = at(c.master);
    span.exp_avg = at(c.exp_avg);
    span.exp_avg_sq = at(c.exp_avg_sq);
    span.master_dtype = storage_.master;
    span.state_dtype = storage_.state;
    span.grad = c.acc.view().as<float>() + local;
    span.grad_dtype = DType::f32;
    span.param = param;
    span.param_dtype = compute_dtype_;
    span.count = n;
    span.stream_param = stream_params;
    step_span(simd, config_, args, seg, span);
  }

  config::OptimizerConfig config_;
  Device& device_;
  OffloadHost& host_;
  Timeline& timeline_;
  DType comm_dtype_;
  DType compute_dtype_;
  bool params_on_device_;
  NvmeParams* nvme_params_;
  std::vector<std::byte> nvme_staging_;  // params on NVMe: one slice's new params (kPipelineElems)
  StateStorage storage_;
  std::size_t count_;
  std::size_t sharded_count_;
  std::size_t cut_;
  std::vector<StateSegment> segments_;  // of the host region
  std::unique_ptr<ShardOptimizer> device_part_;
  std::vector<HostChunk> chunks_;
  std::optional<StagingSlots> slots_;
  Buffer host_scalars_;
  Buffer device_scalars_;
  bool final_ = false;
  std::map<std::size_t, GradArrival> window_;
  std::deque<offload::GradStats> stats_;
  StateTensors tensors_;
  HostWorker worker_;  // last: joined first, while everything its tasks touch still exists
};

}  // namespace

OffloadHost::OffloadHost(const Device& device, const comm::World& world) {
  const std::vector<int> rank_cpus = process_cpus();
  try {
    topology_.emplace(offload::HostTopology::from_system());
    const std::optional<std::string> bus = device.pci_bus_id();
    placement_ = offload::choose_placement(*topology_, bus ? std::optional<std::string_view>(*bus) : std::nullopt,
                                           rank_cpus, world.local_rank);
  } catch (const Error& e) {
    log::warn("CPU offload: cannot read the host topology ({}); offloaded memory is not NUMA-bound", e.what());
    topology_.reset();
    placement_.cpus = rank_cpus;
    placement_.reason = "no topology";
  }
  // Ranks of this node that share the node's cores split them, unless the launcher bound each rank to
  // its own set already (then the placement's cores are already within it).
  std::vector<int> cpus = placement_.cpus;
  if (topology_) {
    const int nodes = std::max(1, topology_->numa_node_count());
    const int sharing = std::max(1, (world.local_size + nodes - 1) / nodes);
    const std::vector<int> node = topology_->node_cpus(placement_.node);
    if (sharing > 1 && cpus.size() == node.size() && cpus.size() >= static_cast<std::size_t>(sharing)) {
      const std::size_t per = cpus.size() / static_cast<std::size_t>(sharing);
      const std::size_t first = static_cast<std::size_t>(world.local_rank / nodes % sharing) * per;
      cpus = std::vector<int>(cpus.begin() + static_cast<std::ptrdiff_t>(first),
                              cpus.begin() + static_cast<std::ptrdiff_t>(first + per));
    } else if (sharing > 1) {
      cpus.clear();  // fewer cores than ranks: leave the threads unbound
    }
  }
  pool_ = std::make_unique<offload::CpuThreadPool>(cpus.empty() ? 1 : static_cast<int>(cpus.size()), cpus);
  simd_ = offload::best_simd_path();
}

OffloadHost::~OffloadHost() = default;

Buffer OffloadHost::allocate(Device& device, std::size_t count, DType dtype, bool pinned, MemCategory category) {
  std::optional<offload::ScopedMemoryBinding> bind;
  if (topology_) bind.emplace(*topology_, placement_.node);
  return device.allocate(count, dtype, pinned ? MemoryKind::pinned_host : MemoryKind::pageable_host, category);
}

std::string OffloadHost::describe() const {
  std::string cpus;
  for (std::size_t i = 0; i < placement_.cpus.size(); ++i)
    cpus += fmt::format("{}{}", i ? "," : "", placement_.cpus[i]);
  return fmt::format("NUMA node {} ({}), {} CPU optimizer thread(s), cpus [{}], {} path", placement_.node,
                     placement_.reason, pool_->threads(), cpus, offload::simd_path_name(simd_));
}

std::size_t offload_cut(const config::Config& config, std::size_t state_count) {
  if (config.zero.offload_optimizer.device == config::OffloadDevice::nvme) return 0;  // all of it, in files
  if (config.zero.offload_optimizer.device != config::OffloadDevice::cpu || state_count == 0) return state_count;
  const std::size_t sub = sub_group_elems(config, state_count);
  const std::size_t groups = (state_count + sub - 1) / sub;
  // DeepSpeed: sub-group i is stepped on the CPU when i >= int((1 - ratio) * n).
  const auto on_device =
      static_cast<std::size_t>((1.0 - config.zero.offload_optimizer.ratio) * static_cast<double>(groups));
  return std::min(state_count, on_device * sub);
}

MemoryTable offload_optimizer_memory(const config::Config& config, const Layout& layout, const OffloadOptions& options,
                                     DeviceKind device) {
  MemoryTable t;
  const config::OffloadConfig& off = config.zero.offload_optimizer;
  if (off.device == config::OffloadDevice::nvme) return nvme_optimizer_memory(config, layout, options, device);
  if (off.device != config::OffloadDevice::cpu || !config.optimizer) return t;
  const std::uint64_t states = static_cast<std::uint64_t>(state_tensors(config.optimizer->type));
  const std::uint64_t cut = offload_cut(config, layout.state_count);
  const std::uint64_t host = layout.state_count - cut;
  const StateStorage storage = StateStorage::of(config);
  const std::uint64_t master_bytes = size_of(storage.master);
  const std::uint64_t state_bytes = size_of(storage.state);
  // The device part: a device optimizer over [0, cut).
  t.at(MemoryKind::device, MemCategory::master) += master_bytes * cut;
  t.at(MemoryKind::device, MemCategory::grad_shard) += 4 * cut;
  t.at(MemoryKind::device, MemCategory::optim_state) += state_bytes * states * cut;
  if (host == 0) return t;
  const MemoryKind kind = off.pin_memory ? MemoryKind::pinned_host : MemoryKind::pageable_host;
  t.at(kind, MemCategory::master) += master_bytes * host;
  t.at(kind, MemCategory::grad_shard) += 4 * host;
  t.at(kind, MemCategory::optim_state) += state_bytes * states * host;
  if (options.params_on_device) t.at(kind, MemCategory::staging) += host * size_of(options.compute_dtype);
  if (config.zero.offload_param.device == config::OffloadDevice::nvme) {
    t.at(MemoryKind::pageable_host, MemCategory::staging) +=
        std::min<std::uint64_t>(kPipelineElems, host) * size_of(options.compute_dtype);
  }
  t.at(kind, MemCategory::staging) += kSlots * staging_slot_elems(layout) * size_of(options.comm_dtype);
  t.at(device_caps(device).host_staging, MemCategory::staging) += 2 * sizeof(float);
  t.at(MemoryKind::device, MemCategory::workspace) += 2 * sizeof(float);
  return t;
}

HostFootprint offload_footprint(const config::Config& config, const Layout& layout, const OffloadOptions& options,
                                DeviceKind device) {
  MemoryTable t = offload_optimizer_memory(config, layout, options, device);
  const config::OffloadConfig& param = config.zero.offload_param;
  if (param.device == config::OffloadDevice::cpu) {
    t.at(param.pin_memory ? MemoryKind::pinned_host : MemoryKind::pageable_host, MemCategory::param_shard) +=
        std::uint64_t{layout.param_shard_count} * size_of(options.compute_dtype);
  }
  t += nvme_params_memory(config, layout, options.compute_dtype);
  return {.pinned_bytes = t.total(MemoryKind::pinned_host), .pageable_bytes = t.total(MemoryKind::pageable_host)};
}

std::unique_ptr<ShardOptimizer> make_offload_optimizer(const config::Config& config, const Layout& layout,
                                                       Device& device, Stream& stream, OffloadHost& host,
                                                       Timeline& timeline, const OffloadOptions& options) {
  return std::make_unique<OffloadShardOptimizer>(config, layout, device, stream, host, timeline, options);
}

}  // namespace zero3::engine
