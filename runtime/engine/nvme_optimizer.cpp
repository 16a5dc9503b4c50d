#include "nvme_optimizer.hpp"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "nvme_params.hpp"
#include "offload_common.hpp"
#include "state_pieces.hpp"
#include "swap_file.hpp"
#include "zero3/comm/fault.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/trace.hpp"
#include "zero3/offload/aio.hpp"

namespace zero3::engine {

namespace {

using config::OptimizerType;
using offload::AioQueue;

// Elements per step slice: sub_group_size (DeepSpeed's unit of swapping) rounded up to whole blocks of the
// narrowest stored dtype, 16-bit params on NVMe included (so every tensor's slice starts a block in its file), at most
// kNvmeSliceElems, and no more than the state rounded up to whole blocks.
std::size_t slice_elems(const config::Config& config, std::size_t count) {
  const StateStorage storage = StateStorage::of(config);
  std::size_t narrowest = std::min({sizeof(float), size_of(storage.master), size_of(storage.state)});
  if (config.zero.offload_param.device == config::OffloadDevice::nvme) narrowest = std::min<std::size_t>(narrowest, 2);
  const std::size_t block = offload::kDirectAlign / narrowest;
  const auto blocks = [block](std::size_t n) { return std::max<std::size_t>(1, (n + block - 1) / block) * block; };
  return std::min({kNvmeSliceElems, blocks(sub_group_elems(config, count)), blocks(count)});
}

// The tensors of a slice: master, accumulator and the optimizer's moments.
int slice_tensors(OptimizerType type) {
  return 2 + state_tensors(type);
}

// Bytes of one element of every tensor of a slice: the master and moments in their stored dtypes, the fp32
// accumulator.
std::size_t slice_elem_bytes(const config::Config& config) {
  return StateStorage::of(config).bytes_per_elem(state_tensors(config.optimizer->type));
}

// Slices in the ring: one being stepped, plus one read ahead and one written behind when those pipelines are
// on, or as many as buffer_count (DeepSpeed counts one buffer per tensor) holds, if more.
std::size_t ring_size(const config::Config& config) {
  const config::OffloadConfig& o = config.zero.offload_optimizer;
  const std::size_t stages = 1 + (o.pipeline_read ? 1 : 0) + (o.pipeline_write ? 1 : 0);
  const auto by_count = static_cast<std::size_t>(std::max<std::int64_t>(o.buffer_count, 0)) /
                        static_cast<std::size_t>(slice_tensors(config.optimizer->type));
  return std::max(stages, by_count);
}

// A gradient piece of the current window, with what the logs and the accumulator file hold of it.
struct Arrival : GradArrival {
  std::size_t logged = 0;  // arrivals written to the logs (log r holds the r-th)
  bool summed = false;     // the accumulator file holds the sum of every arrival so far
};

// One slice's buffers in the step's ring.
struct SliceBuffers {
  Buffer memory;  // the tensors, each in its stored dtype and block-aligned
  void* master = nullptr;
  void* exp_avg = nullptr;
  void* exp_avg_sq = nullptr;
  float* grad = nullptr;
  Buffer params;                        // the new compute-dtype params on their way to the device or the params' file
  std::byte* params_aligned = nullptr;  // in `params`, on a block boundary (for the params' file)
  std::unique_ptr<Event> copied;
  bool copy_pending = false;
  std::optional<AioQueue::Ticket> read;
  std::optional<AioQueue::Ticket> write;
};

class NvmeShardOptimizer final : public ShardOptimizer {
 public:
  NvmeShardOptimizer(const config::Config& config, const Layout& layout, Device& device, Stream& stream,
                     OffloadHost& host, Timeline& timeline, const OffloadOptions& options, const comm::World& world)
      : config_(*config.optimizer),
        device_(device),
        host_(host),
        timeline_(timeline),
        comm_dtype_(options.comm_dtype),
        compute_dtype_(options.compute_dtype),
        params_on_device_(options.params_on_device),
        nvme_params_(options.nvme_params),
        storage_(StateStorage::of(config)),
        pipeline_read_(config.zero.offload_optimizer.pipeline_read),
        pipeline_write_(config.zero.offload_optimizer.pipeline_write),
        count_(layout.state_count),
        sharded_count_(layout.sharded_state_count),
        slice_(slice_elems(config, layout.state_count)),
        has_m_(config_.type != OptimizerType::adagrad),
        has_v_(config_.type != OptimizerType::lion),
        segments_(state_segments(layout)),
        bounds_(host_chunk_bounds(config, 0, layout.state_count)),
        rank_(world.rank),
        dir_(*config.zero.offload_optimizer.nvme_path, world.rank),
        io_(nvme_aio_options(config)),
        worker_io_(nvme_aio_options(config)) {
    (void)stream;
    if (count_ == 0) return;
    const auto file = [&](std::string_view name, DType dtype) {
      return fmt::format("{}/{}.{}", dir_.path(), name, dtype_name(dtype));
    };
    master_.emplace(file("master", storage_.master), count_, storage_.master);
    grad_.emplace(file("grad", DType::f32), count_, DType::f32);
    if (has_m_) exp_avg_.emplace(file("exp_avg", storage_.state), count_, storage_.state);
    if (has_v_) exp_avg_sq_.emplace(file("exp_avg_sq", storage_.state), count_, storage_.state);
    // Every file the configured window needs is reserved now, so a disk that fills up later cannot fail a step.
    for (std::int64_t i = 1; i < config.batch.gradient_accumulation_steps; ++i) log(static_cast<std::size_t>(i - 1));
    const bool pinned = config.zero.offload_optimizer.pin_memory;
    const auto allocate = [&](std::size_t n, DType dtype, MemCategory category) {
      return host.allocate(device, n, dtype, pinned, category);
    };
    // Each tensor's part is slice_ elements of its dtype: whole blocks (slice_elems), so each starts on one.
    const std::size_t bytes = slice_ * slice_elem_bytes(config) + offload::kDirectAlign;
    for (std::size_t i = 0, n = ring_size(config); i < n; ++i) {
      SliceBuffers b;
      b.memory = allocate((bytes + sizeof(float) - 1) / sizeof(float), DType::f32, MemCategory::optim_state);
      // The first block boundary inside the allocation (O_DIRECT transfers start on one).
      const auto address = reinterpret_cast<std::uintptr_t>(b.memory.data());
      std::byte* next = static_cast<std::byte*>(b.memory.data()) + (offload::direct_align_up(address) - address);
      const auto carve = [&](DType dtype) {
        std::byte* at = next;
        next += slice_ * size_of(dtype);
        return at;
      };
      b.master = carve(storage_.master);
      b.grad = reinterpret_cast<float*>(carve(DType::f32));
      if (has_m_) b.exp_avg = carve(storage_.state);
      if (has_v_) b.exp_avg_sq = carve(storage_.state);
      if (params_on_device_) b.params = allocate(slice_, compute_dtype_, MemCategory::staging);
      if (nvme_params_ != nullptr) {
        const std::size_t param_bytes = slice_ * size_of(compute_dtype_) + offload::kDirectAlign;
        b.params = allocate((param_bytes + sizeof(float) - 1) / sizeof(float), DType::f32, MemCategory::staging);
        const auto at = reinterpret_cast<std::uintptr_t>(b.params.data());
        b.params_aligned = static_cast<std::byte*>(b.params.data()) + (offload::direct_align_up(at) - at);
      }
      b.copied = device.create_event();
      ring_.push_back(std::move(b));
    }
    slots_.emplace(device, staging_slot_elems(layout), comm_dtype_,
                   [&](std::size_t n, DType dtype) { return allocate(n, dtype, MemCategory::staging); });
    sum_.resize(slots_->elems());
    log_values_ = offload::AlignedBuffer(slots_->elems() * size_of(comm_dtype_));
    host_scalars_ = device.allocate(2, DType::f32, device.caps().host_staging, MemCategory::staging);
    device_scalars_ = device.allocate(2, DType::f32, MemoryKind::device, MemCategory::workspace);
  }

  ~NvmeShardOptimizer() override {
    try {
      worker_.drain();
      io_.wait_all();
    } catch (...) {  // reported by the call that failed; nothing more to do while tearing down
    }
  }

  const StatePieces& pieces(TensorKind kind) const override {
    (void)kind;
    static const StatePieces kNone;
    return kNone;
  }

  bool keeps(TensorKind kind) const override { return file_of(kind) != nullptr; }

  bool step_may_fail_locally() const override { return true; }

  void set_final_micro_step(bool final) override { final_ = final; }

  void prepare_read() override {
    if (count_ == 0) return;
    on_worker([&] { finish_window(); });
  }

  void accumulate(std::size_t offset, ConstBufferView reduced, Stream& stream) override {
    std::size_t done = 0;
    while (done < reduced.count) {
      const std::size_t at = offset + done;
      const auto chunk =
          std::prev(std::upper_bound(bounds_.begin(), bounds_.end(), std::make_pair(at, ~std::size_t{0})));
      const std::size_t n = std::min({reduced.count - done, chunk->first + chunk->second - at, slots_->elems()});
      arrive(at, reduced.slice(done, n), stream);
      done += n;
    }
  }

  void grad_stats(Stream& stream, BufferView scalars, bool check_overflow, bool include_persistent) override {
    if (count_ == 0) return;
    on_worker([&] { finish_window(); });
    // Summed as CPU offload sums them (offload_optimizer.cpp), so the norm is the same.
    offload::GradStats sharded;
    offload::GradStats persistent;
    for (const auto& [at, a] : window_) {
      if (at >= sharded_count_ && !include_persistent) continue;
      (at < sharded_count_ ? sharded : persistent) += stats_[a.stats];
    }
    float sum_sq = static_cast<float>(sharded.sum_sq);
    if (include_persistent) sum_sq = static_cast<float>(static_cast<double>(sum_sq) + persistent.sum_sq);
    float* h = host_scalars_.view().as<float>();
    h[0] = check_overflow && (sharded.nonfinite || persistent.nonfinite) ? 1.0f : 0.0f;
    h[1] = sum_sq;
    device_.copy_async(device_scalars_.view(), host_scalars_.cview(), stream);
    stream.device().kernels().accumulate(stream, scalars, device_scalars_.cview(), 1.0f);
  }

  void clear_grads(Stream& stream) override {
    (void)stream;
    if (count_ == 0) return;
    worker_.drain();
    report_grad_traffic();
    window_.clear();  // the next window's first arrivals overwrite
    stats_.clear();
    gaps_zeroed_ = false;
  }

  void step(Stream& stream, const OptimizerStepArgs& args, BufferView params) override {
    if (count_ == 0) return;
    on_worker([&] { finish_window(); });
    const AioQueue::Counters before = io_.counters();
    const auto started = Timeline::Clock::now();
    const std::size_t slices = (count_ + slice_ - 1) / slice_;
    const std::size_t ring = ring_.size();
    const std::size_t ahead = pipeline_read_ ? ring - 1 - (pipeline_write_ && ring > 1 ? 1 : 0) : 0;
    const bool stream_params = count_ * size_of(compute_dtype_) >= offload::kStreamParamMinBytes;
    std::size_t next_read = 0;
    for (std::size_t k = 0; k < slices; ++k) {
      while (next_read < slices && next_read <= k + ahead) read_slice(next_read++);
      SliceBuffers& b = ring_[k % ring];
      const std::size_t first = k * slice_;
      const std::size_t n = std::min(slice_, count_ - first);
      {
        const trace::Scope span("nvme", fmt::format("wait read {} elements", n));
        io_.wait(*b.read);
        b.read.reset();
      }
      void* out = nvme_params_ != nullptr ? b.params_aligned
                  : params_on_device_     ? b.params.data()
                                          : static_cast<std::byte*>(params.data) + first * size_of(params.dtype);
      step_slice(args, b, first, n, out, stream_params);
      if (nvme_params_ != nullptr) {
        if (const auto written = nvme_params_->write_blocks(io_, first, n, b.params_aligned)) b.write = written;
      }
      b.write = master_->write_blocks(io_, first, n, b.master);
      if (has_m_) b.write = exp_avg_->write_blocks(io_, first, n, b.exp_avg);
      if (has_v_) b.write = exp_avg_sq_->write_blocks(io_, first, n, b.exp_avg_sq);
      if (k == 0 && comm::fault::fire(comm::fault::Kind::kill_in_update, rank_, args.step - 1)) {
        ::raise(SIGKILL);  // a test's fault: the state files now hold a half-written update
      }
      if (!pipeline_write_) {
        io_.wait(*b.write);
        b.write.reset();
      }
      if (params_on_device_) {
        const std::uint64_t copy = timeline_.begin(stream, Timeline::Lane::h2d);
        device_.copy_async(params.slice(first, n), b.params.cview().slice(0, n), stream);
        timeline_.end(stream, copy);
        timeline_.add_bytes(Timeline::Lane::h2d, n * size_of(compute_dtype_));
        stream.record(*b.copied);
        b.copy_pending = true;
      }
    }
    io_.wait_all();  // the state on disk is the new one when step() returns
    for (SliceBuffers& b : ring_) b.write.reset();
    const AioQueue::Counters after = io_.counters();
    DiskTimes disk;
    disk.step_read_bytes = after.read_bytes - before.read_bytes;
    disk.step_write_bytes = after.write_bytes - before.write_bytes;
    disk.step_ms = std::chrono::duration<double, std::milli>(Timeline::Clock::now() - started).count();
    disk.step_wait_ms = (after.wait_s - before.wait_s) * 1e3;
    timeline_.add_disk(disk);
  }

  void copy_out(Device& device, TensorKind kind, std::size_t offset, BufferView dst, Stream& stream) override {
    stream.synchronize();
    transfer(device, require(kind), offset, dst, /*to_file=*/false, stream);
  }

  void copy_in(Device& device, TensorKind kind, std::size_t offset, ConstBufferView src, Stream& stream) override {
    stream.synchronize();
    const BufferView view{const_cast<void*>(src.data), src.count, src.dtype, src.kind};
    transfer(device, require(kind), offset, view, /*to_file=*/true, stream);
  }

  void zero_moments(Stream& stream) override {
    stream.synchronize();
    for (std::optional<SwapFile>* f : {&exp_avg_, &exp_avg_sq_}) {
      if (f->has_value()) (*f)->zero(io_, bounce_, 0, count_);
    }
  }

 private:
  const SwapFile* file_of(TensorKind kind) const {
    switch (kind) {
      case TensorKind::master:
        return master_ ? &*master_ : nullptr;
      case TensorKind::exp_avg:
        return exp_avg_ ? &*exp_avg_ : nullptr;
      case TensorKind::exp_avg_sq:
        return exp_avg_sq_ ? &*exp_avg_sq_ : nullptr;
      case TensorKind::grad:
        return grad_ ? &*grad_ : nullptr;
      case TensorKind::param:
        break;
    }
    return nullptr;
  }

  SwapFile& require(TensorKind kind) {
    const SwapFile* f = file_of(kind);
    ZERO3_CHECK(f != nullptr, "NVMe offload: no such state tensor");
    return const_cast<SwapFile&>(*f);
  }

  // Runs fn on the worker after everything queued before it, and waits (the worker's queue and buffers are
  // then used by one thread only).
  template <typename Fn>
  void on_worker(Fn&& fn) {
    worker_.submit([&fn] { fn(); });
    worker_.drain();
  }

  // Between the file and `view` (host or device memory, any dtype), in bounce-sized pieces: device memory
  // through host staging, and another dtype than the file's converted on the host (rounding to nearest even
  // when narrowing).
  void transfer(Device& device, SwapFile& file, std::size_t offset, BufferView view, bool to_file, Stream& stream) {
    if (view.count == 0) return;
    const bool direct = view.kind != MemoryKind::device || device.caps().device_memory_on_host;
    if (direct && view.dtype == file.dtype()) {
      if (to_file) {
        file.write(io_, bounce_, offset, view.count, view.data);
      } else {
        file.read(io_, bounce_, offset, view.count, view.data);
      }
      return;
    }
    const std::size_t per = std::min(view.count, SwapFile::kBounceBytes / sizeof(float));
    Buffer in_file = device.allocate(per, file.dtype(), device.caps().host_staging, MemCategory::staging);
    Buffer in_view;  // the view's dtype in host memory, where the view is device memory the host cannot address
    if (!direct) in_view = device.allocate(per, view.dtype, device.caps().host_staging, MemCategory::staging);
    for (std::size_t done = 0; done < view.count; done += per) {
      const std::size_t n = std::min(per, view.count - done);
      const BufferView part = view.slice(done, n);
      const BufferView host = direct ? part : in_view.view().slice(0, n);
      const BufferView staged = in_file.view().slice(0, n);
      if (to_file) {
        if (!direct) {
          device.copy_async(host, part, stream);
          stream.synchronize();
        }
        convert_on_host(staged, host);
        file.write(io_, bounce_, offset + done, n, staged.data);
      } else {
        file.read(io_, bounce_, offset + done, n, staged.data);
        convert_on_host(host, staged);
        if (!direct) {
          device.copy_async(part, host, stream);
          stream.synchronize();
        }
      }
    }
  }

  // Log r: the comm-dtype values of the r-th arrival of each piece in the window (made at start-up for the
  // configured window, later for a longer one).
  SwapFile& log(std::size_t r) {
    while (logs_.size() <= r) {
      logs_.push_back(std::make_unique<SwapFile>(
          fmt::format("{}/grad-log{}.{}", dir_.path(), logs_.size(), dtype_name(comm_dtype_)), count_, comm_dtype_));
    }
    return *logs_[r];
  }

  // Worker: sum_[0, n) = the piece's logged arrivals added in order (0 + g1 + ...), then `fresh` (comm dtype)
  // when given, with the statistics of the result taken in that last pass (as CPU offload takes them for a
  // piece that arrives in the window's last micro-batch); without `fresh`, the statistics in a pass of their
  // own (as CPU offload takes them for a piece whose last arrival was earlier).
  offload::GradStats sum_arrivals(std::size_t at, std::size_t n, std::size_t logged, const void* fresh) {
    const offload::SimdPath simd = host_.simd();
    const std::size_t elem = size_of(comm_dtype_);
    float* acc = sum_.data();
    const auto add = [&](const void* src, bool first, bool want_stats) {
      return host_.pool().reduce_tiles(n, kGradTileElems, [&](std::size_t b, std::size_t e) {
        if (first) std::memset(acc + b, 0, (e - b) * sizeof(float));
        return offload::accumulate_range(simd, acc + b, static_cast<const std::byte*>(src) + b * elem, comm_dtype_,
                                         1.0f, e - b, want_stats);
      });
    };
    for (std::size_t r = 0; r < logged; ++r) {
      log(r).read(worker_io_, worker_bounce_, at, n, log_values_.data());
      add(log_values_.data(), r == 0, false);
    }
    if (fresh != nullptr) return add(fresh, logged == 0, true);
    if (logged == 0) std::memset(acc, 0, n * sizeof(float));
    return host_.pool().reduce_tiles(n, kGradTileElems, [&](std::size_t b, std::size_t e) {
      return offload::grad_stats_range(simd, acc + b, e - b);
    });
  }

  void arrive(std::size_t at, ConstBufferView piece, Stream& stream) {
    StagingSlots::Slot& slot = slots_->stage(device_, timeline_, piece, stream);
    const ArrivalRecord<Arrival> rec = record_arrival(window_, stats_, at, piece.count, final_);
    offload::GradStats* out = rec.stats;
    Arrival* arrival = &rec.arrival;  // read and written by the worker only now
    const bool final = final_;
    const std::size_t n = piece.count;
    worker_.submit([this, &slot, at, n, arrival, final, out] {
      slot.copied->synchronize();
      const trace::Scope span("nvme", fmt::format("gradients {} elements", n));
      const auto start = Timeline::Clock::now();
      if (final) {
        *out = sum_arrivals(at, n, arrival->logged, slot.buffer.data());
        grad_->write(worker_io_, worker_bounce_, at, n, sum_.data());
        arrival->summed = true;
      } else {
        log(arrival->logged).write(worker_io_, worker_bounce_, at, n, slot.buffer.data());
        ++arrival->logged;
        arrival->summed = false;
      }
      timeline_.host(Timeline::Lane::cpu, start, Timeline::Clock::now());
      slots_->release(slot);
    });
  }

  // The gradient worker's disk traffic since the last report (the worker is drained).
  void report_grad_traffic() {
    const AioQueue::Counters now = worker_io_.counters();
    DiskTimes disk;
    disk.grad_read_bytes = now.read_bytes - grad_reported_.read_bytes;
    disk.grad_write_bytes = now.write_bytes - grad_reported_.write_bytes;
    disk.grad_wait_ms = (now.wait_s - grad_reported_.wait_s) * 1e3;
    grad_reported_ = now;
    timeline_.add_disk(disk);
  }

  // Worker: the accumulator file holds this window's sums everywhere (pieces whose last arrival was not in
  // the last micro-batch summed now, with their statistics; ranges no gradient reached zeroed).
  void finish_window() {
    for (auto& [at, a] : window_) {
      if (a.summed) continue;
      stats_[a.stats] = sum_arrivals(at, a.count, a.logged, nullptr);
      grad_->write(worker_io_, worker_bounce_, at, a.count, sum_.data());
      a.summed = true;
    }
    if (gaps_zeroed_) return;
    std::size_t done = 0;
    for (const auto& [at, a] : window_) {
      if (at > done) grad_->zero(worker_io_, worker_bounce_, done, at - done);
      done = std::max(done, at + a.count);
    }
    if (done < count_) grad_->zero(worker_io_, worker_bounce_, done, count_ - done);
    gaps_zeroed_ = true;
  }

  void read_slice(std::size_t k) {
    SliceBuffers& b = ring_[k % ring_.size()];
    if (b.write) {  // the slice it held last is on its way to the disk
      io_.wait(*b.write);
      b.write.reset();
    }
    if (b.copy_pending) {  // and its params on their way to the device
      b.copied->synchronize();
      b.copy_pending = false;
    }
    const std::size_t first = k * slice_;
    const std::size_t n = std::min(slice_, count_ - first);
    b.read = master_->read_blocks(io_, first, n, b.master);
    b.read = grad_->read_blocks(io_, first, n, b.grad);
    if (has_m_) b.read = exp_avg_->read_blocks(io_, first, n, b.exp_avg);
    if (has_v_) b.read = exp_avg_sq_->read_blocks(io_, first, n, b.exp_avg_sq);
  }

  void step_slice(const OptimizerStepArgs& args, SliceBuffers& b, std::size_t first, std::size_t n, void* out,
                  bool stream_params) {
    const trace::Scope span("cpu optimizer", fmt::format("step {} params", n));
    const auto start = Timeline::Clock::now();
    const offload::SimdPath simd = host_.simd();
    const auto first_segment =
        std::lower_bound(segments_.begin(), segments_.end(), first,
                         [](const StateSegment& seg, std::size_t at) { return seg.offset + seg.count <= at; });
    host_.pool().for_tiles(n, offload::kCpuStepTileElems, [&](std::size_t tb, std::size_t te) {
      for (auto seg = first_segment; seg != segments_.end() && seg->offset < first + te; ++seg) {
        const std::size_t sb = std::max(first + tb, seg->offset) - first;
        const std::size_t se = std::min(first + te, seg->offset + seg->count) - first;
        if (sb >= se) continue;
        const auto at = [sb](void* base, DType dtype) -> void* {
          return base == nullptr ? nullptr : static_cast<std::byte*>(base) + sb * size_of(dtype);
        };
        offload::StepSpan s;
        s.master = at(b.master, storage_.master);
        s.exp_avg = at(b.exp_avg, storage_.state);
        s.exp_avg_sq = at(b.exp_avg_sq, storage_.state);
        s.master_dtype = storage_.master;
        s.state_dtype = storage_.state;
        s.grad = b.grad + sb;
        s.grad_dtype = DType::f32;
        s.param = static_cast<std::byte*>(out) + sb * size_of(compute_dtype_);
        s.param_dtype = compute_dtype_;
        s.count = se - sb;
        s.stream_param = stream_params;
        step_span(simd, config_, args, *seg, s);
      }
    });
    timeline_.host(Timeline::Lane::cpu, start, Timeline::Clock::now());
  }

  config::OptimizerConfig config_;
  Device& device_;
  OffloadHost& host_;
  Timeline& timeline_;
  DType comm_dtype_;
  DType compute_dtype_;
  bool params_on_device_;
  NvmeParams* nvme_params_;
  StateStorage storage_;
  bool pipeline_read_;
  bool pipeline_write_;
  std::size_t count_;
  std::size_t sharded_count_;
  std::size_t slice_;
  bool has_m_;
  bool has_v_;
  std::vector<StateSegment> segments_;
  std::vector<std::pair<std::size_t, std::size_t>> bounds_;
  int rank_;
  RankDirectory dir_;  // before the files: removed after them
  std::optional<SwapFile> master_;
  std::optional<SwapFile> grad_;
  std::optional<SwapFile> exp_avg_;
  std::optional<SwapFile> exp_avg_sq_;
  std::vector<std::unique_ptr<SwapFile>> logs_;
  AioQueue io_;  // the engine thread's: the step's slices, copy_out/copy_in
  offload::AlignedBuffer bounce_;
  AioQueue worker_io_;                // the worker's: gradients
  AioQueue::Counters grad_reported_;  // worker_io_'s counters at the last report_grad_traffic()
  offload::AlignedBuffer worker_bounce_;
  std::vector<float> sum_;
  offload::AlignedBuffer log_values_;
  std::vector<SliceBuffers> ring_;
  std::optional<StagingSlots> slots_;
  Buffer host_scalars_;
  Buffer device_scalars_;
  bool final_ = false;
  bool gaps_zeroed_ = false;
  std::map<std::size_t, Arrival> window_;
  std::deque<offload::GradStats> stats_;
  HostWorker worker_;  // last: joined first, while everything its tasks touch still exists
};

}  // namespace

offload::AioOptions nvme_aio_options(const config::Config& config) {
  const config::AioConfig& a = config.aio;
  offload::AioOptions o;
  o.block_size = static_cast<std::size_t>(a.block_size);
  o.queue_depth = static_cast<int>(a.queue_depth);
  o.intra_op_parallelism = static_cast<int>(a.intra_op_parallelism);
  o.single_submit = a.single_submit;
  o.overlap_events = a.overlap_events;
  return o;
}

MemoryTable nvme_optimizer_memory(const config::Config& config, const Layout& layout, const OffloadOptions& options,
                                  DeviceKind device) {
  MemoryTable t;
  const config::OffloadConfig& off = config.zero.offload_optimizer;
  if (off.device != config::OffloadDevice::nvme || !config.optimizer || layout.state_count == 0) return t;
  const MemoryKind kind = off.pin_memory ? MemoryKind::pinned_host : MemoryKind::pageable_host;
  const std::uint64_t slice = slice_elems(config, layout.state_count);
  const std::uint64_t ring = ring_size(config);
  const std::uint64_t bytes = slice * slice_elem_bytes(config) + offload::kDirectAlign;
  t.at(kind, MemCategory::optim_state) += ring * ((bytes + sizeof(float) - 1) / sizeof(float) * sizeof(float));
  if (options.params_on_device) t.at(kind, MemCategory::staging) += ring * slice * size_of(options.compute_dtype);
  if (config.zero.offload_param.device == config::OffloadDevice::nvme) {
    t.at(kind, MemCategory::staging) += ring * (slice * size_of(options.compute_dtype) + offload::kDirectAlign);
  }
  const std::uint64_t slot = staging_slot_elems(layout);
  t.at(kind, MemCategory::staging) += kSlots * slot * size_of(options.comm_dtype);
  // The worker's sum and log buffers, and two bounce buffers (pageable).
  t.at(MemoryKind::pageable_host, MemCategory::staging) +=
      slot * (4 + size_of(options.comm_dtype)) + 2 * (SwapFile::kBounceBytes + 2 * offload::kDirectAlign);
  t.at(device_caps(device).host_staging, MemCategory::staging) += 2 * sizeof(float);
  t.at(MemoryKind::device, MemCategory::workspace) += 2 * sizeof(float);
  return t;
}

std::uint64_t nvme_optimizer_disk_bytes(const config::Config& config, const Layout& layout,
                                        const OffloadOptions& options) {
  if (config.zero.offload_optimizer.device != config::OffloadDevice::nvme || !config.optimizer) return 0;
  const std::uint64_t n = layout.state_count;
  const StateStorage storage = StateStorage::of(config);
  const auto states = static_cast<std::uint64_t>(state_tensors(config.optimizer->type));
  const auto logs = static_cast<std::uint64_t>(std::max<std::int64_t>(config.batch.gradient_accumulation_steps - 1, 0));
  return offload::direct_align_up(n * size_of(storage.master)) + offload::direct_align_up(4 * n) +
         states * offload::direct_align_up(n * size_of(storage.state)) +
         logs * offload::direct_align_up(n * size_of(options.comm_dtype));
}

NvmeTraffic nvme_optimizer_traffic(const config::Config& config, const Layout& layout, const OffloadOptions& options) {
  if (config.zero.offload_optimizer.device != config::OffloadDevice::nvme || !config.optimizer) return {};
  const std::uint64_t n = layout.state_count;
  const std::uint64_t state_bytes = n * slice_elem_bytes(config);  // master, moments, accumulator
  const auto logs = static_cast<std::uint64_t>(std::max<std::int64_t>(config.batch.gradient_accumulation_steps - 1, 0));
  const std::uint64_t log_bytes = logs * n * size_of(options.comm_dtype);
  return {.read_bytes = state_bytes + log_bytes, .write_bytes = state_bytes + log_bytes};
}

std::unique_ptr<ShardOptimizer> make_nvme_optimizer(const config::Config& config, const Layout& layout, Device& device,
                                                    Stream& stream, OffloadHost& host, Timeline& timeline,
                                                    const OffloadOptions& options, const comm::World& world) {
  return std::make_unique<NvmeShardOptimizer>(config, layout, device, stream, host, timeline, options, world);
}

}  // namespace zero3::engine
