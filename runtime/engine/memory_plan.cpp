// plan_memory: each category from the same layout, schedule and sizes the engine uses (layout.hpp,
// gather_schedule.hpp, grad_reducer.hpp, offload_optimizer.hpp, init.hpp), walked over the windows a
// training job runs. Category by category, with the allocation it predicts named in `how`.
#include "zero3/engine/memory_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gather_schedule.hpp"
#include "grad_reducer.hpp"
#include "init.hpp"
#include "layout.hpp"
#include "nvme_optimizer.hpp"
#include "nvme_params.hpp"
#include "offload_common.hpp"
#include "offload_optimizer.hpp"
#include "optimizer_step.hpp"
#include "zero3/core/error.hpp"

namespace zero3 {

std::uint64_t MemoryTable::total(MemoryKind kind) const {
  std::uint64_t sum = 0;
  for (const std::uint64_t b : bytes[static_cast<std::size_t>(kind)]) sum += b;
  return sum;
}

MemoryTable& MemoryTable::operator+=(const MemoryTable& other) {
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c < kNumMemCategories; ++c) bytes[k][c] += other.bytes[k][c];
  }
  return *this;
}

std::string MemoryPlan::describe_kind(MemoryKind kind) const {
  std::vector<std::pair<std::uint64_t, std::size_t>> rows;
  for (std::size_t c = 0; c < kNumMemCategories; ++c) {
    const std::uint64_t b = peak.bytes[static_cast<std::size_t>(kind)][c];
    if (b > 0) rows.emplace_back(b, c);
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::string out;
  for (const auto& [b, c] : rows) {
    out += fmt::format("  {:<15} {:>10.2f} MiB  {}\n", mem_category_name(static_cast<MemCategory>(c)),
                       static_cast<double>(b) / (1 << 20), how[static_cast<std::size_t>(kind)][c]);
  }
  return out;
}

namespace {

using engine::Group;
using engine::Layout;
using engine::UnitLayout;

// The gather schedule's decisions counted in bytes of gathered buffers. A freed buffer goes back once the
// stream that used it has passed the event recorded at its release, which the coordinator polls at each
// gather: the gather right after a release (microseconds later) finds the stream not there yet, the one
// after it (a unit's compute later) finds it done. So a freed buffer is still held through one gather,
// unless the live budget makes the gather wait for the oldest freed buffers first, as the coordinator does.
// With `late` false every freed buffer is back at once instead (the plan's lower bound).
class CountingGathers final : public engine::GatherActions {
 public:
  CountingGathers(const Layout& layout, DType dtype, std::uint64_t max_live, bool late)
      : layout_(layout), elem_(size_of(dtype)), max_live_(max_live), late_(late) {}
  void gather(std::size_t unit, bool /*prefetched*/) override {
    std::erase_if(pending_, [&](Pending& p) {
      if (late_ && !p.polled) {  // the first poll misses it
        p.polled = true;
        return false;
      }
      held_ -= p.elems;
      return true;
    });
    const std::uint64_t count = layout_.units[unit].gathered_count();
    while (held_ + count > max_live_ && !pending_.empty()) {  // reclaim_oldest: waits, then frees
      held_ -= pending_.front().elems;
      pending_.erase(pending_.begin());
    }
    held_ += count;
    peak_ = std::max(peak_, held_ * elem_);
  }
  void join(std::size_t /*unit*/) override {}
  void free(std::size_t unit, bool /*joined*/) override { pending_.push_back({layout_.units[unit].gathered_count()}); }
  std::uint64_t peak() const { return peak_; }

 private:
  struct Pending {
    std::uint64_t elems = 0;
    bool polled = false;
  };
  const Layout& layout_;
  std::uint64_t elem_;
  std::uint64_t max_live_;
  bool late_;
  std::uint64_t held_ = 0;        // elements allocated: in use, kept, in flight, or freed but not yet back
  std::vector<Pending> pending_;  // freed, oldest first
  std::uint64_t peak_ = 0;
};

class Planner {
 public:
  Planner(std::span<const UnitSpec> units, const config::Config& config, const MemoryPlanOptions& options)
      : config_(config),
        options_(options),
        layout_(engine::build_layout(std::vector<UnitSpec>(units.begin(), units.end()), config.batch.world_size, 0,
                                     config.zero)),
        world_(config.batch.world_size),
        dtype_(config.model_dtype()),
        comm_dtype_(config.communication_data_type),
        caps_(device_caps(options.device)),
        offload_params_(config.zero.offload_param.device != config::OffloadDevice::none),
        nvme_params_(config.zero.offload_param.device == config::OffloadDevice::nvme),
        offload_optimizer_(config.zero.offload_optimizer.device != config::OffloadDevice::none),
        single_rank_(config.zero3.single_rank_in_place && world_ == 1),
        staging_kind_(caps_.host_staging) {
    plan_.world_size = world_;
    plan_.ranks_per_node = std::max(options.ranks_per_node, 1);
    plan_.resident_base = options.resident_base_bytes;
    plan_.device_memory_on_host = options.device == DeviceKind::host;
    for (std::size_t u = 0; u < units.size(); ++u) visits_.push_back(visit_units(units, u));
  }

  MemoryPlan run() {
    params();
    optimizer();
    nvme();
    gathered();
    grad_buffers();
    reduction_scratch();
    communicator_scratch();
    staging_and_workspace();
    if (options_.activations.bytes > 0) {
      add(options_.activations.kind, MemCategory::activations, options_.activations.bytes,
          "what the model keeps for backward and its scratch, at the larger of a train micro-batch and the "
          "held-out pass (the model's own count)");
    }
    if (options_.activations.offloaded_bytes > 0) {
      add(staging_kind_, MemCategory::activations, options_.activations.offloaded_bytes,
          "cpu_checkpointing: the inputs full recomputation keeps, in host memory from their unit's forward to its "
          "backward");
    }
    deepspeed_estimate();
    return std::move(plan_);
  }

 private:
  // `bytes` at the category's peak; `low`: the same with every freed buffer back at once (default: equal).
  void add(MemoryKind kind, MemCategory c, std::uint64_t bytes, const std::string& how,
           std::optional<std::uint64_t> low = std::nullopt) {
    if (bytes == 0) return;
    plan_.peak.at(kind, c) += bytes;
    plan_.low.at(kind, c) += low.value_or(bytes);
    std::string& h = plan_.how[static_cast<std::size_t>(kind)][static_cast<std::size_t>(c)];
    h += (h.empty() ? "" : "; ") + how;
  }

  // ---- model states

  void params() {
    const std::uint64_t bytes = std::uint64_t{layout_.param_shard_count} * size_of(dtype_);
    const std::string what = fmt::format("the rank's param shards: {} elements of {} ({} padded params / {} ranks)",
                                         layout_.param_shard_count, dtype_name(dtype_), layout_.total_elems, world_);
    if (!offload_params_) {
      add(MemoryKind::device, MemCategory::param_shard, bytes, what);
      return;
    }
    if (nvme_params_) {
      const MemoryTable t = engine::nvme_params_memory(config_, layout_, dtype_);
      const std::size_t kept = engine::nvme_params_kept_elems(config_, layout_);
      for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
        const auto kind = static_cast<MemoryKind>(k);
        add(kind, MemCategory::param_shard, t.at(kind, MemCategory::param_shard),
            fmt::format("the param shards kept in host memory (offload_param nvme: persistent units, then "
                        "max_in_cpu): {} of {} elements",
                        kept, layout_.param_shard_count));
        add(kind, MemCategory::staging, t.at(kind, MemCategory::staging),
            "offload_param nvme: the read buffers of gathered units' shards and the file's bounce buffer");
      }
    } else {
      add(config_.zero.offload_param.pin_memory ? MemoryKind::pinned_host : MemoryKind::pageable_host,
          MemCategory::param_shard, bytes, what + " (offload_param)");
    }
    std::uint64_t persistent = 0;
    for (const UnitLayout& u : layout_.units) {
      if (u.persistent) persistent += u.gathered_count();
    }
    add(MemoryKind::device, MemCategory::param_shard, persistent * size_of(dtype_),
        fmt::format("device copies of the persistent units ({} elements)", persistent));
  }

  void nvme() {
    const engine::OffloadOptions o{
        .compute_dtype = dtype_, .comm_dtype = comm_dtype_, .params_on_device = !offload_params_};
    plan_.nvme_file_bytes = engine::nvme_optimizer_disk_bytes(config_, layout_, o);
    const engine::NvmeTraffic t = engine::nvme_optimizer_traffic(config_, layout_, o);
    plan_.nvme_read_bytes_per_step = t.read_bytes;
    plan_.nvme_write_bytes_per_step = t.write_bytes;
    if (!nvme_params_) return;
    // Params on NVMe: the shards not kept in host memory are written once per step and read for each
    // gather: at most twice per micro-batch (forward and backward).
    const std::uint64_t on_disk =
        (layout_.param_shard_count - engine::nvme_params_kept_elems(config_, layout_)) * size_of(dtype_);
    plan_.nvme_file_bytes += engine::nvme_params_disk_bytes(config_, layout_, dtype_);
    plan_.nvme_read_bytes_per_step +=
        2 * on_disk * static_cast<std::uint64_t>(std::max<std::int64_t>(config_.batch.gradient_accumulation_steps, 1));
    plan_.nvme_write_bytes_per_step += on_disk;
  }

  void optimizer() {
    const std::uint64_t s = layout_.state_count;
    const int states = engine::state_tensors(config_.optimizer->type);
    const engine::StateStorage storage = engine::StateStorage::of(config_);
    plan_.master_dtype = storage.master;
    plan_.state_dtype = storage.state;
    plan_.optimizer_bytes_per_param = storage.bytes_per_elem(states);
    plan_.optimizer_states = states;
    if (!offload_optimizer_) {
      const std::string of = fmt::format("{} elements (the rank's trainable shard)", s);
      add(MemoryKind::device, MemCategory::master, size_of(storage.master) * s,
          fmt::format("master weights: {} {}", dtype_name(storage.master), of));
      add(MemoryKind::device, MemCategory::grad_shard, 4 * s, "gradient accumulators: fp32 " + of);
      add(MemoryKind::device, MemCategory::optim_state, size_of(storage.state) * states * s,
          fmt::format("{} optimizer states x {} {}", states, dtype_name(storage.state), of));
      return;
    }
    const MemoryTable t = engine::offload_optimizer_memory(
        config_, layout_, {.compute_dtype = dtype_, .comm_dtype = comm_dtype_, .params_on_device = !offload_params_},
        options_.device);
    const std::uint64_t cut = engine::offload_cut(config_, layout_.state_count);
    for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
      const auto kind = static_cast<MemoryKind>(k);
      const bool on_device = kind == MemoryKind::device;
      const std::string where =
          on_device ? fmt::format("the device part, {} of {} elements (offload_optimizer.ratio)", cut, s)
                    : fmt::format("offloaded, {} of {} elements", s - cut, s);
      add(kind, MemCategory::master, t.at(kind, MemCategory::master),
          fmt::format("{} master weights, {}", dtype_name(storage.master), where));
      add(kind, MemCategory::grad_shard, t.at(kind, MemCategory::grad_shard), "fp32 gradient accumulators, " + where);
      add(kind, MemCategory::optim_state, t.at(kind, MemCategory::optim_state),
          fmt::format("{} {} optimizer states, {}", states, dtype_name(storage.state), where));
      const std::uint64_t staging = t.at(kind, MemCategory::staging);
      add(kind, MemCategory::staging, staging,
          staging <= 2 * sizeof(float) ? "the offloaded statistics' scalars"
          : nvme_params_
              ? "the CPU step's new params (written to the params file slice by slice) and the gradient staging "
                "slots"
              : "the CPU step's new params (copied to the device slice by slice) and the gradient staging slots");
      add(kind, MemCategory::workspace, t.at(kind, MemCategory::workspace), "the offloaded statistics' scalars");
    }
  }

  // ---- gathered params: the engine's own schedule over three windows (the first records the trace, the
  // next follow it), with a held-out pass between them

  void gathered() {
    if (single_rank_ && !offload_params_) return;  // every unit used from its shard in place
    EngineStats stats;
    const std::uint64_t late = gathered_peak(true, stats);
    EngineStats unused;
    add(MemoryKind::device, MemCategory::param_gathered, late,
        fmt::format("units gathered at once ({} elements at most; prefetch bucket {}, max live {}, reuse distance {})",
                    stats.gathered_peak_elems, config_.zero.prefetch_bucket_size, config_.zero.max_live_parameters,
                    config_.zero.max_reuse_distance),
        gathered_peak(false, unused));
  }

  // The schedule over the walk, its gathers counted with late or immediate frees.
  std::uint64_t gathered_peak(bool late, EngineStats& stats) const {
    CountingGathers count(
        layout_, dtype_, static_cast<std::uint64_t>(std::max<std::int64_t>(config_.zero.max_live_parameters, 0)), late);
    engine::GatherSchedule schedule(layout_, config_.zero, false, stats, count);
    const std::size_t n = layout_.units.size();
    const std::int64_t gas = std::max<std::int64_t>(config_.batch.gradient_accumulation_steps, 1);
    // A unit's visit: it and the units it borrows, acquired in order and released in reverse (unit_walk).
    const auto visit = [&](std::size_t u) {
      for (const std::size_t v : visits_[u]) schedule.acquire(v);
      for (auto v = visits_[u].rbegin(); v != visits_[u].rend(); ++v) schedule.release(*v);
    };
    for (int window = 0; window < 3; ++window) {
      for (std::int64_t m = 0; m < gas; ++m) {
        for (std::size_t u = 0; u < n; ++u) visit(u);
        for (std::size_t u = n; u-- > 0;) visit(u);
      }
      schedule.end_window();
      schedule.set_traced(false);  // the held-out pass
      for (std::size_t u = 0; u < n; ++u) visit(u);
      schedule.set_traced(true);
    }
    return count.peak();
  }

  // ---- gradient buffers: a visit's buffers (the unit's, then those of the units it borrows) are made
  // while the one before them in the backward walk is still being reduced (unless those waiting exceed
  // reduce_bucket_size elements), as GradReducer::open waits

  void grad_buffers() {
    const bool in_place = single_rank_ && dtype_ == DType::f32 && comm_dtype_ == DType::f32 && !offload_optimizer_;
    const std::int64_t gas = std::max<std::int64_t>(config_.batch.gradient_accumulation_steps, 1);
    // In place, a unit's first GradScope of a window writes its accumulators: from the second micro-batch
    // on, every scope has a buffer of its own.
    const bool first_in_place = in_place && gas == 1;
    const auto bucket = static_cast<std::uint64_t>(std::max<std::int64_t>(config_.zero.reduce_bucket_size, 0));
    std::vector<char> written(layout_.units.size(), 0);
    std::vector<std::uint64_t> pending;  // buffers still being reduced, oldest first
    std::uint64_t peak = 0;
    std::uint64_t single = 0;  // the most one visit holds at once, whatever the reductions' timing
    for (std::size_t u = layout_.units.size(); u-- > 0;) {
      std::vector<std::uint64_t> opened;
      std::uint64_t open_elems = 0;
      for (const std::size_t v : visits_[u]) {
        const std::uint64_t elems = layout_.units[v].group(Group::trainable).padded;
        if (elems == 0 || (first_in_place && std::exchange(written[v], char{1}) == 0)) continue;
        while (pending.size() > 1) pending.erase(pending.begin());
        while (!pending.empty() && sum(pending) > bucket) pending.erase(pending.begin());
        peak = std::max(peak, open_elems + sum(pending) + elems);
        open_elems += elems;
        opened.push_back(elems);
      }
      single = std::max(single, open_elems);
      pending.insert(pending.end(), opened.rbegin(), opened.rend());  // closed in the reverse order
    }
    add(MemoryKind::device, MemCategory::grad_buffer, peak * size_of(dtype_),
        fmt::format("a unit's full gradient ({}) while the previous unit's is still being reduced: {} elements{}",
                    dtype_name(dtype_), peak,
                    in_place && !first_in_place ? ", from the window's second micro-batch on" : ""),
        single * size_of(dtype_));
  }

  static std::uint64_t sum(const std::vector<std::uint64_t>& v) {
    std::uint64_t total = 0;
    for (const std::uint64_t x : v) total += x;
    return total;
  }

  // The units in the order backward reduces them: each visit's GradScopes close in the reverse order of
  // opening, so the units a visit borrows come before the unit itself.
  std::vector<std::size_t> reduction_order() const {
    std::vector<std::size_t> order;
    for (std::size_t u = visits_.size(); u-- > 0;) order.insert(order.end(), visits_[u].rbegin(), visits_[u].rend());
    return order;
  }

  // ---- the reduction's scratch (GradReducer): the pack / cast buffer and the received piece, grown to
  // the largest unit, the buffer it replaces kept until the stream is past it

  void reduction_scratch() {
    const std::size_t piece = engine::reduce_piece_elems(world_, config_.zero.reduce_bucket_size);
    const auto w = static_cast<std::uint64_t>(world_);
    const bool cast = comm_dtype_ != dtype_;
    std::uint64_t send = 0;
    std::uint64_t recv = 0;
    std::uint64_t peak = 0;
    std::uint64_t low = 0;
    for (const std::size_t u : reduction_order()) {
      const engine::GroupLayout& g = layout_.units[u].group(Group::trainable);
      if (g.padded == 0) continue;
      std::uint64_t want_send = 0;
      std::uint64_t want_recv = 0;
      if (single_rank_) {
        if (cast) want_send = std::min<std::uint64_t>(piece, g.shard);
      } else if (layout_.units[u].persistent) {
        if (cast) want_send = std::min<std::uint64_t>(piece * w, g.numel);
      } else if (g.shard <= piece) {
        if (cast) want_send = w * g.shard;
        want_recv = g.shard;
      } else {
        want_send = w * piece;
        want_recv = piece;
      }
      std::uint64_t replaced = 0;  // a grown buffer's predecessor, freed once the stream has passed it
      if (want_send > send) {
        replaced += send;
        send = want_send;
      }
      if (want_recv > recv) {
        replaced += recv;
        recv = want_recv;
      }
      peak = std::max(peak, send + recv + replaced);
      low = std::max(low, send + recv);
    }
    add(MemoryKind::device, MemCategory::comm_buffer, peak * size_of(comm_dtype_),
        fmt::format("the reduction's pack/cast buffer and received piece ({}; pieces of {} elements per rank)",
                    dtype_name(comm_dtype_), piece),
        low * size_of(comm_dtype_));
  }

  // ---- the communicator's own scratch: the MPI backend reduces 16-bit data in fp32, in three slots that
  // grow to the largest call (pageable host memory)

  void communicator_scratch() {
    config::CommBackend backend = config_.zero3.comm.backend;
    if (backend == config::CommBackend::automatic) {
      backend = caps_.device_memory_on_host ? config::CommBackend::mpi : config::CommBackend::nccl;
    }
    if (backend == config::CommBackend::nccl) {
      add(MemoryKind::device, MemCategory::comm_buffer, sizeof(float), "the NCCL communicator's barrier word");
      return;
    }
    std::array<std::uint64_t, 3> slot{};
    const auto grow = [&](std::size_t i, std::uint64_t bytes) { slot[i] = std::max(slot[i], bytes); };
    // The input of each MPI reduce-scatter, fp32: the library's own temporary (MemoryPlan::library_temporary).
    const auto reduce_scatter = [&](std::uint64_t elems) {
      if (world_ > 1) plan_.library_temporary = std::max<std::uint64_t>(plan_.library_temporary, elems * 4);
    };
    const auto all_reduce = [&](std::uint64_t n, DType t) {
      const auto p = static_cast<std::uint64_t>(world_);
      if (p == 1 && t == DType::f32) return;
      const std::uint64_t block = (n + p - 1) / p;
      const std::uint64_t padded = block * p;
      reduce_scatter(padded);
      if (!(t == DType::f32 && n == padded)) grow(0, padded * 4);
      grow(1, block * 4);
      if (t != DType::f32) grow(2, block * size_of(t));
    };
    all_reduce(engine::kStepScalars, DType::f32);  // the step's statistics
    if (!single_rank_) {
      const std::size_t piece = engine::reduce_piece_elems(world_, config_.zero.reduce_bucket_size);
      const auto w = static_cast<std::uint64_t>(world_);
      for (const UnitLayout& u : layout_.units) {
        const engine::GroupLayout& g = u.group(Group::trainable);
        if (g.padded == 0) continue;
        if (u.persistent) {
          for (std::uint64_t a = 0; a < g.numel; a += piece * w)
            all_reduce(std::min<std::uint64_t>(piece * w, g.numel - a), comm_dtype_);
          continue;
        }
        const std::uint64_t recv = std::min<std::uint64_t>(g.shard, piece);
        reduce_scatter(w * recv);
        if (comm_dtype_ != DType::f32) {
          grow(0, w * recv * 4);
          grow(1, recv * 4);
        }
      }
    }
    const std::uint64_t total = slot[0] + slot[1] + slot[2];
    add(MemoryKind::pageable_host, MemCategory::comm_buffer, total,
        "the MPI communicator's fp32 scratch for 16-bit and padded reductions");
  }

  // ---- staging and workspace

  void staging_and_workspace() {
    const std::uint64_t chunk = std::min<std::uint64_t>(engine::kInitChunkElems, layout_.param_shard_count);
    add(staging_kind_, MemCategory::staging, chunk * (4 + size_of(dtype_)),
        fmt::format("start-up: the initial values, {} elements at a time (fp32 and {})", chunk, dtype_name(dtype_)));
    add(staging_kind_, MemCategory::staging, 2 * engine::kStepScalars * sizeof(float),
        "the step's statistics and window marks");
    // A save takes blocks of a quarter of the staging area (at least 1 MiB) as it needs them, up to the area.
    const std::uint64_t ckpt = options_.checkpoint_staging_bytes;
    add(MemoryKind::pageable_host, MemCategory::staging, ckpt, "a checkpoint save's staging area",
        std::min(ckpt, std::max<std::uint64_t>(std::uint64_t{1} << 20, ckpt / 4)));
    add(MemoryKind::device, MemCategory::workspace, engine::kStepScalars * sizeof(float), "the step's statistics");
  }

  // ---- DeepSpeed's estimate for the same model (estimate_zero3_model_states_mem_needs_all_live)

  void deepspeed_estimate() {
    DeepSpeedEstimate& e = plan_.deepspeed;
    std::map<std::string, std::uint64_t> modules;  // a param's module: its name up to the last '.'
    for (const engine::ParamLayout& p : layout_.params) {
      e.total_params += p.numel;
      const std::string& name = p.spec.name;
      const std::size_t dot = name.rfind('.');
      modules[dot == std::string::npos ? std::string() : name.substr(0, dot)] += p.numel;
    }
    for (const auto& [name, n] : modules) e.largest_layer = std::max(e.largest_layer, n);
    const auto g = static_cast<double>(plan_.ranks_per_node);
    const double nodes = std::max(1.0, static_cast<double>(world_) / g);
    const double gpus = static_cast<double>(world_);
    const double p = static_cast<double>(e.total_params);
    const double l = static_cast<double>(e.largest_layer);
    constexpr double kBufferFactor = 1.5;
    const double gpus_factor = 1.0 / nodes;
    const std::uint64_t largest_layer_memory = 4 * e.largest_layer;
    if (offload_optimizer_ && offload_params_) {
      e.gpu_bytes_per_gpu = largest_layer_memory;
      e.cpu_bytes_per_node = static_cast<std::uint64_t>(p * 18 * gpus_factor * kBufferFactor);
    } else if (offload_optimizer_) {
      e.gpu_bytes_per_gpu = largest_layer_memory + static_cast<std::uint64_t>(2 * p / gpus);
      e.cpu_bytes_per_node = static_cast<std::uint64_t>(p * 16 * gpus_factor * kBufferFactor);
    } else if (!offload_params_) {
      e.gpu_bytes_per_gpu = largest_layer_memory + static_cast<std::uint64_t>(18 * p / gpus);
      e.cpu_bytes_per_node = static_cast<std::uint64_t>(l * 4 * g * kBufferFactor);
    } else {
      e.covered = false;  // DeepSpeed's printer skips offload_param without offload_optimizer
    }
  }

  const config::Config& config_;
  const MemoryPlanOptions& options_;
  Layout layout_;
  int world_;
  DType dtype_;
  DType comm_dtype_;
  DeviceCaps caps_;
  bool offload_params_;  // off the device: in host memory or on NVMe
  bool nvme_params_;
  bool offload_optimizer_;
  bool single_rank_;
  MemoryKind staging_kind_;
  std::vector<std::vector<std::size_t>> visits_;  // per unit: itself, then the units it borrows
  MemoryPlan plan_;
};

}  // namespace

MemoryPlan plan_memory(std::span<const UnitSpec> units, const config::Config& config,
                       const MemoryPlanOptions& options) {
  if (!config.optimizer) {
    throw ConfigError("optimizer: the memory plan is of a training job, which needs an optimizer block");
  }
  return Planner(units, config, options).run();
}

}  // namespace zero3
