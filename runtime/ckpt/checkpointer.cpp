#include "zero3/ckpt/checkpointer.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/ckpt/json_fields.hpp"
#include "zero3/comm/typed_collectives.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"
#include "zero3/core/log.hpp"
#include "zero3/core/trace.hpp"

namespace zero3::ckpt {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

constexpr std::size_t kMinBlockBytes = std::size_t{1} << 20;

// Throws CheckpointError on every rank when any rank reported an error (the first one, naming its rank).
void agree(comm::Bootstrap& b, const std::string& my_error, std::string_view what) {
  const std::vector<std::string> errors = comm::all_gather_strings(b, my_error);
  for (std::size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) throw CheckpointError(fmt::format("{}: rank {}: {}", what, r, errors[r]));
  }
}

std::string_view kind_name(TensorKind k) {
  return tensor_kind_name(k);
}

std::string hex64(std::uint64_t v) {
  return fmt::format("{:016x}", v);
}

Json training_state_json(const TrainingState& s) {
  return {{"global_step", s.global_step},
          {"skipped_steps", s.skipped_steps},
          {"applied_steps", s.applied_steps},
          {"lr_iteration", s.lr_iteration},
          {"loss_scale", s.loss_scale},
          {"scaler_iteration", s.scaler_iteration},
          {"scaler_last_overflow", s.scaler_last_overflow},
          {"scaler_hysteresis_left", s.scaler_hysteresis_left}};
}

// The counters of state.engine, each an integer int64 holds (steps at least 0; the schedule's and the scaler's
// iterations and the scaler's last overflow start at -1, as DeepSpeed's last_batch_iteration does).
TrainingState training_state_from_json(const Json& j, const std::string& source) {
  const JsonFields f(j, "state.engine", source);
  TrainingState s;
  s.global_step = f.i64("global_step", 0);
  s.skipped_steps = f.i64("skipped_steps", 0);
  s.applied_steps = f.i64("applied_steps", 0);
  s.lr_iteration = f.i64("lr_iteration", -1);
  s.scaler_iteration = f.i64("scaler_iteration", -1);
  s.scaler_last_overflow = f.i64("scaler_last_overflow", -1);
  s.scaler_hysteresis_left = f.i64("scaler_hysteresis_left", 0);
  s.loss_scale = f.number("loss_scale");
  return s;
}

// The dtype the checkpoint stores `kind` in: the engine's own storage of it (the model dtype for params,
// Config::master_dtype for the master, Config::optimizer_state_dtype for the moments), so a 16-bit job's
// checkpoint is half the size and its resume exact.
DType stored_dtype(const config::Config& config, TensorKind kind) {
  switch (kind) {
    case TensorKind::param:
      return config.model_dtype();
    case TensorKind::master:
      return config.master_dtype();
    default:
      return config.optimizer_state_dtype();
  }
}

// The first n fp32 values of `bytes` rewritten in place as n values of `dtype` (rounded to nearest even).
// Front to back: element i's narrower result lands at or before where element i was read.
void narrow_in_place(std::byte* bytes, std::size_t n, DType dtype) {
  for (std::size_t i = 0; i < n; ++i) {
    float v = 0.0f;
    std::memcpy(&v, bytes + i * sizeof(float), sizeof v);
    store_from_float(bytes, dtype, i, v);
  }
}

// The kinds a checkpoint of this engine holds, in file order.
std::vector<TensorKind> saved_kinds(const EngineState& state) {
  std::vector<TensorKind> kinds{TensorKind::param, TensorKind::master};
  for (const TensorKind k : {TensorKind::exp_avg, TensorKind::exp_avg_sq}) {
    if (state.keeps_state(k)) kinds.push_back(k);
  }
  return kinds;
}

// One run of one kind, snapshotted into host memory and waiting for the writer.
struct Block {
  std::string param;
  TensorKind kind = TensorKind::param;
  DType dtype = DType::f32;
  std::uint64_t first = 0;
  std::uint64_t count = 0;
  std::unique_ptr<std::byte[]> storage;  // block_bytes() of them, recycled between blocks
  std::size_t bytes = 0;                 // used: count * size_of(dtype)
  std::span<const std::byte> data() const { return {storage.get(), bytes}; }
};

}  // namespace

struct Checkpointer::Impl {
  Engine& engine;
  std::shared_ptr<comm::Bootstrap> bootstrap;
  CheckpointerOptions options;

  // ---- the save in flight
  struct Flight {
    fs::path root;
    std::string tag;
    std::int64_t step = 0;
    Json trainer_state;
    TrainingState training;
    Clock::time_point started;
    double snapshot_s = 0.0;

    std::mutex mutex;
    std::condition_variable changed;
    std::deque<Block> queue;
    std::vector<std::unique_ptr<std::byte[]>> spare;  // storage the writer is done with
    std::size_t queued_bytes = 0;
    std::size_t allocated = 0;  // staging storage made for this flight
    bool producing = true;      // the snapshot is still being taken
    bool done = false;          // the writer finished (ok or failed)
    std::string error;          // the writer's failure
    FileSummary summary;
    std::thread writer;
  };
  std::unique_ptr<Flight> flight;
  std::vector<SaveReport> pending;  // reports of saves completed inside save(), until poll() or wait()

  Impl(Engine& e, std::shared_ptr<comm::Bootstrap> b, CheckpointerOptions o)
      : engine(e), bootstrap(std::move(b)), options(o) {}

  std::size_t block_bytes() const { return std::max(kMinBlockBytes, options.staging_bytes / 4); }

  void write_loop(Flight& f) {
    std::unique_ptr<RankFileWriter> file;
    try {
      file = std::make_unique<RankFileWriter>(staging_dir(f.root, f.tag), bootstrap->rank());
    } catch (const std::exception& e) {
      std::lock_guard lock(f.mutex);
      f.error = e.what();
    }
    // f.error is shared with the producer (a failed snapshot): read it under the lock only.
    const auto failed = [&] {
      std::lock_guard lock(f.mutex);
      return !f.error.empty();
    };
    for (;;) {
      Block block;
      bool ok = false;
      {
        std::unique_lock lock(f.mutex);
        f.changed.wait(lock, [&] { return !f.queue.empty() || !f.producing; });
        if (f.queue.empty()) break;
        block = std::move(f.queue.front());
        f.queue.pop_front();
        ok = f.error.empty();
      }
      if (file && ok) {
        try {
          const trace::Scope span("checkpoint writer", fmt::format("write {} {}, {} bytes", block.param,
                                                                   kind_name(block.kind), block.bytes));
          file->append(block.param, kind_name(block.kind), block.dtype, block.first, block.count, block.data());
        } catch (const std::exception& e) {
          std::lock_guard lock(f.mutex);
          f.error = e.what();
          file.reset();  // removes the partial file
        }
      }
      std::lock_guard lock(f.mutex);
      f.queued_bytes -= block.bytes;
      f.spare.push_back(std::move(block.storage));
      f.changed.notify_all();
    }
    FileSummary summary;
    if (file && !failed()) {
      try {
        const trace::Scope span("checkpoint writer", "finish (fsync, rename)");
        summary = file->finish();
      } catch (const std::exception& e) {
        std::lock_guard lock(f.mutex);
        f.error = e.what();
      }
    }
    file.reset();
    std::lock_guard lock(f.mutex);
    f.summary = std::move(summary);
    f.done = true;
    f.changed.notify_all();
  }

  // Storage for the next block: a spare one, or a new one while the staging area has room; else waits for
  // the writer to hand one back. Null once the writer failed. New storage is counted in the memory
  // tracker (staging) until the flight ends.
  std::unique_ptr<std::byte[]> take_storage(Flight& f) {
    const std::size_t size = block_bytes();
    std::unique_lock lock(f.mutex);
    f.changed.wait(lock, [&] {
      return !f.error.empty() || !f.spare.empty() || f.allocated + size <= std::max(options.staging_bytes, size);
    });
    if (!f.error.empty()) return nullptr;
    if (!f.spare.empty()) {
      std::unique_ptr<std::byte[]> spare = std::move(f.spare.back());
      f.spare.pop_back();
      return spare;
    }
    f.allocated += size;
    engine.memory().on_alloc(MemoryKind::pageable_host, MemCategory::staging, size);
    return std::unique_ptr<std::byte[]>(new std::byte[size]);  // uninitialized: every used byte is written
  }

  // Hands a block to the writer. False once the writer failed.
  bool push(Flight& f, Block block) {
    std::lock_guard lock(f.mutex);
    if (!f.error.empty()) return false;
    f.queued_bytes += block.bytes;
    f.queue.push_back(std::move(block));
    f.changed.notify_all();
    return true;
  }

  // The destructor's end of a save no poll() or wait() completed: rank-local, never a collective (it may
  // run on this rank only, while an exception unwinds). Waits for this rank's writer and logs that the save
  // is not committed; ROOT/latest still names the previous checkpoint, and ROOT/.tmp.TAG stays until the
  // next save of the tag removes it.
  void abandon_flight() noexcept {
    Flight& f = *flight;
    if (f.writer.joinable()) f.writer.join();
    release_storage(f);
    try {
      std::string latest = "none";
      try {
        if (const std::optional<std::string> l = read_latest(f.root)) latest = *l;
      } catch (const std::exception& e) {
        latest = fmt::format("unreadable: {}", e.what());
      }
      log::error(
          "checkpoint {} in {} was not committed: call wait() before destroying the Checkpointer; the previous "
          "checkpoint is intact (latest: {}){}",
          f.tag, f.root.string(), latest,
          f.error.empty() ? "" : fmt::format("; this rank's writer had failed: {}", f.error));
    } catch (...) {  // a destructor never throws
    }
    flight.reset();
  }

  // The flight's staging storage goes back to the system (and out of the memory tracker).
  void release_storage(Flight& f) {
    std::lock_guard lock(f.mutex);
    f.spare.clear();
    engine.memory().on_free(MemoryKind::pageable_host, MemCategory::staging, f.allocated);
    f.allocated = 0;
  }

  void snapshot(Flight& f) {
    const std::vector<ParamSlice> slices = engine.state().local_slices(/*owned=*/true);
    const DType param_dtype = engine.config().model_dtype();
    const std::size_t max_block = block_bytes();
    for (const TensorKind kind : saved_kinds(engine.state())) {
      // read_state speaks fp32 for the optimizer's tensors; they are stored as the optimizer stores them.
      const DType read_dtype = kind == TensorKind::param ? param_dtype : DType::f32;
      const DType dtype = stored_dtype(engine.config(), kind);
      const std::size_t elem = size_of(read_dtype);
      const std::uint64_t per_block = std::max<std::uint64_t>(1, max_block / elem);
      for (const ParamSlice& s : slices) {
        if (kind != TensorKind::param && !s.trainable) continue;
        std::uint64_t done = 0;
        do {  // zero-size params still get one (empty) record
          const std::uint64_t n = std::min(per_block, s.count - done);
          Block b{s.param, kind, dtype, s.first + done, n, take_storage(f), n * size_of(dtype)};
          if (!b.storage) return;
          const ParamSlice part{s.param, s.first + done, n, s.trainable};
          engine.state().read_state(kind, std::span<const ParamSlice>(&part, 1),
                                    std::span<std::byte>(b.storage.get(), n * elem));
          if (dtype != read_dtype) narrow_in_place(b.storage.get(), n, dtype);  // exact: the values are dtype's
          if (!push(f, std::move(b))) return;
          done += n;
        } while (done < s.count);
      }
    }
  }

  // Throws on every rank when any rank's engine refuses its state methods now (inside an accumulation
  // window, a scope open, before finalize(), or an error a scope's destructor kept): UsageError for misuse,
  // naming the first such rank and `fix`. Checked by every rank before any other collective of the call,
  // so the ranks never part ways. Collective.
  void require_boundary(std::string_view call, std::string_view fix) {
    std::string mine;
    try {
      engine.state().read_state(TensorKind::param, {}, {});  // reads nothing: only the engine's own boundary check
    } catch (const UsageError& e) {
      mine = std::string("U") + e.what();
    } catch (const std::exception& e) {
      mine = std::string("E") + e.what();
    }
    const std::vector<std::string> all = comm::all_gather_strings(*bootstrap, mine);
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (all[r].empty()) continue;
      const std::string message = fmt::format("{}: rank {}: {}; {}", call, r, all[r].substr(1), fix);
      if (all[r][0] == 'U') throw UsageError(message);
      throw Error(message);
    }
  }

  void save(const fs::path& root, const std::string& tag, std::int64_t step, const Json& trainer_state) {
    require_boundary(fmt::format("Checkpointer::save('{}')", tag),
                     "save after the accumulation window's last step() (the one whose StepResult::boundary is "
                     "true), at an accumulation boundary, with every scope closed");
    if (flight) {  // a second save waits for the first
      std::optional<SaveReport> previous = complete(/*block=*/true);
      if (previous) pending.push_back(std::move(*previous));
    }
    std::string error;
    try {
      check_tag(tag);
      if (bootstrap->rank() == 0) prepare_staging(root, tag);
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree(*bootstrap, error, fmt::format("checkpoint save of '{}' in {}", tag, root.string()));
    auto f = std::make_unique<Flight>();
    f->root = root;
    f->tag = tag;
    f->step = step;
    f->trainer_state = trainer_state;
    f->training = engine.state().training_state();
    f->started = Clock::now();
    Flight& fr = *f;
    flight = std::move(f);
    fr.writer = std::thread([this, &fr] { write_loop(fr); });
    try {
      snapshot(fr);
    } catch (const std::exception& e) {
      std::lock_guard lock(fr.mutex);
      if (fr.error.empty()) fr.error = fmt::format("snapshot: {}", e.what());
    }
    {
      std::lock_guard lock(fr.mutex);
      fr.producing = false;
      fr.changed.notify_all();
    }
    fr.snapshot_s = std::chrono::duration<double>(Clock::now() - fr.started).count();
    if (!options.async) {
      std::optional<SaveReport> report = complete(/*block=*/true);
      if (report) pending.push_back(std::move(*report));
    }
  }

  Manifest build_manifest(const Flight& f, std::vector<FileSummary> files) const {
    Manifest m;
    m.tag = f.tag;
    m.step = f.step;
    m.world_size = bootstrap->size();
    const std::string config_text = config::to_json(engine.config(), 0);
    m.config = Json::parse(config_text);
    m.config_hash = hex64(XXH64(config_text.data(), config_text.size(), 0));
    const DType dtype = engine.config().model_dtype();
    for (const std::string& unit : engine.unit_names()) {
      for (const ParamSpec& p : engine.unit_params(unit)) {
        m.params.push_back({p.name, unit, p.shape, dtype, p.trainable});
      }
    }
    m.master_dtype = engine.config().master_dtype();
    m.state_dtype = engine.config().optimizer_state_dtype();
    m.files = std::move(files);
    m.state = {{"engine", training_state_json(f.training)},
               {"optimizer", config::to_string(engine.config().optimizer->type)},
               {"trainer", f.trainer_state}};
    return m;
  }

  // Collective. block: wait for this rank's writer; else return nullopt while any rank's writer runs.
  std::optional<SaveReport> complete(bool block) {
    if (!flight) return std::nullopt;
    Flight& f = *flight;
    if (block && f.writer.joinable()) f.writer.join();
    bool done = false;
    {
      std::lock_guard lock(f.mutex);
      done = f.done;
    }
    const std::vector<std::string> states = comm::all_gather_strings(*bootstrap, done ? "1" : "0");
    if (std::any_of(states.begin(), states.end(), [](const std::string& s) { return s != "1"; })) {
      return std::nullopt;
    }
    if (f.writer.joinable()) f.writer.join();
    release_storage(f);
    SaveReport report;
    report.tag = f.tag;
    report.dir = checkpoint_dir(f.root, f.tag);
    report.snapshot_s = f.snapshot_s;
    const std::vector<std::string> errors = comm::all_gather_strings(*bootstrap, f.error);
    for (std::size_t r = 0; r < errors.size() && report.error.empty(); ++r) {
      if (!errors[r].empty()) report.error = fmt::format("rank {}: {}", r, errors[r]);
    }
    const std::vector<std::string> summaries =
        comm::all_gather_strings(*bootstrap, report.error.empty() ? to_json(f.summary).dump() : std::string());
    std::string commit_error;
    if (bootstrap->rank() == 0) {
      try {
        if (report.error.empty()) {
          std::vector<FileSummary> files;
          for (const std::string& s : summaries) {
            files.push_back(file_summary_from_json(Json::parse(s)));
            report.bytes += files.back().bytes;
          }
          commit(f.root, build_manifest(f, std::move(files)));
        } else {
          std::error_code ec;  // the failed save's files; the previous checkpoint is untouched
          fs::remove_all(staging_dir(f.root, f.tag), ec);
        }
      } catch (const std::exception& e) {
        commit_error = e.what();
      }
    }
    const std::vector<std::string> commit_errors = comm::all_gather_strings(*bootstrap, commit_error);
    if (report.error.empty() && !commit_errors[0].empty()) report.error = "rank 0: commit: " + commit_errors[0];
    const std::vector<std::string> totals = comm::all_gather_strings(*bootstrap, std::to_string(report.bytes));
    report.bytes = std::stoull(totals[0]);
    report.ok = report.error.empty();
    report.total_s = std::chrono::duration<double>(Clock::now() - f.started).count();
    flight.reset();
    return report;
  }

  LoadResult load(const fs::path& path, std::string_view tag) {
    require_boundary(fmt::format("Checkpointer::load({})", path.string()),
                     "load before the first micro-batch or after an accumulation window's last step(), with every "
                     "scope closed");
    std::string error;
    std::optional<CheckpointReader> reader;
    try {
      reader.emplace(path, tag);
      check_compatible(*reader);
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree(*bootstrap, error, fmt::format("checkpoint load from {}", path.string()));
    const Manifest& m = reader->manifest();
    LoadResult result;
    result.tag = m.tag;
    result.step = m.step;
    result.saved_world_size = m.world_size;
    result.manifest = (reader->dir() / "manifest.json").string();
    if (std::optional<std::string> note = storage_note(m)) result.notes.push_back(std::move(*note));
    try {
      result.trainer_state = JsonFields(m.state, "state", result.manifest).object_or_empty("trainer").get_object();
      const std::vector<ParamSlice> slices = engine.state().local_slices(/*owned=*/false);
      const DType param_dtype = engine.config().model_dtype();
      const std::size_t max_block = block_bytes();
      // One block of storage for the whole load (uninitialized: reads fill what is used).
      const std::unique_ptr<std::byte[]> block(new std::byte[max_block]);
      engine.memory().on_alloc(MemoryKind::pageable_host, MemCategory::staging, max_block);
      const std::shared_ptr<void> untrack(nullptr, [this, max_block](void*) {
        engine.memory().on_free(MemoryKind::pageable_host, MemCategory::staging, max_block);
      });
      // The reads in order, and a prefetch cursor kept up to two blocks ahead of them: the disk reads the
      // next runs while this rank verifies and stores the current ones.
      struct Run {
        TensorKind kind;
        const ParamSlice* slice;
      };
      std::vector<Run> order;
      for (const TensorKind kind : saved_kinds(engine.state())) {
        for (const ParamSlice& s : slices) {
          if (kind == TensorKind::param || s.trainable) order.push_back({kind, &s});
        }
      }
      std::size_t prefetched = 0;     // runs of `order` prefetched
      std::uint64_t ahead_bytes = 0;  // bytes prefetched and not read yet
      const auto prefetch_to = [&](std::uint64_t limit) {
        for (; prefetched < order.size() && ahead_bytes < limit; ++prefetched) {
          const Run& r = order[prefetched];
          reader->prefetch(r.slice->param, kind_name(r.kind), r.slice->first, r.slice->count);
          ahead_bytes += r.slice->count * (r.kind == TensorKind::param ? size_of(param_dtype) : sizeof(float));
        }
      };
      for (const TensorKind kind : saved_kinds(engine.state())) {
        const DType dtype = kind == TensorKind::param ? param_dtype : DType::f32;
        const std::size_t elem = size_of(dtype);
        std::vector<ParamSlice> batch;
        std::size_t used = 0;
        const auto flush = [&] {
          if (batch.empty()) return;
          engine.state().write_state(kind, batch, std::span<const std::byte>(block.get(), used));
          batch.clear();
          used = 0;
        };
        for (const ParamSlice& s : slices) {
          if (kind != TensorKind::param && !s.trainable) continue;
          const std::uint64_t per_block = std::max<std::uint64_t>(1, max_block / elem);
          for (std::uint64_t done = 0; done < s.count;) {
            const std::uint64_t n = std::min(per_block, s.count - done);
            if (used + n * elem > max_block) flush();
            prefetch_to(2 * max_block);
            reader->read(s.param, kind_name(kind), s.first + done, n, dtype,
                         std::span<std::byte>(block.get() + used, n * elem));
            used += n * elem;
            ahead_bytes -= std::min<std::uint64_t>(ahead_bytes, n * elem);
            result.bytes_read += n * elem;
            batch.push_back({s.param, s.first + done, n, s.trainable});
            done += n;
          }
        }
        flush();
      }
      engine.state().restore_training_state(
          training_state_from_json(JsonFields(m.state, "state", result.manifest).get("engine"), result.manifest));
    } catch (const std::exception& e) {
      error = e.what();
    }
    agree(*bootstrap, error, fmt::format("checkpoint load from {}", reader->dir().string()));
    return result;
  }

  // A checkpoint whose optimizer storage differs from the job's loads converted (write_state narrows by
  // rounding to nearest even; widening is exact): said once, by rank 0 as an event, and returned on every rank.
  std::optional<std::string> storage_note(const Manifest& m) const {
    const config::Config& c = engine.config();
    if (m.master_dtype == c.master_dtype() && m.state_dtype == c.optimizer_state_dtype()) return std::nullopt;
    const bool narrows = size_of(c.master_dtype()) < size_of(m.master_dtype) ||
                         size_of(c.optimizer_state_dtype()) < size_of(m.state_dtype);
    std::string note = fmt::format(
        "checkpoint {}: optimizer storage converted from the checkpoint's master {} / states {} to the job's master "
        "{} / states {}{}",
        m.tag, dtype_name(m.master_dtype), dtype_name(m.state_dtype), dtype_name(c.master_dtype()),
        dtype_name(c.optimizer_state_dtype()),
        narrows ? " (rounded to nearest even: the narrowed values lose their low bits)" : " (widened exactly)");
    if (bootstrap->rank() == 0) {
      events::emit({.level = narrows ? log::Level::warning : log::Level::info,
                    .kind = "checkpoint_storage_converted",
                    .message = note,
                    .fields = {{"checkpoint_master_dtype", std::string(dtype_name(m.master_dtype))},
                               {"checkpoint_state_dtype", std::string(dtype_name(m.state_dtype))},
                               {"job_master_dtype", std::string(dtype_name(c.master_dtype()))},
                               {"job_state_dtype", std::string(dtype_name(c.optimizer_state_dtype()))}}});
    }
    return note;
  }

  // Refuses a checkpoint whose params or optimizer conflict with the engine, naming the conflict.
  void check_compatible(const CheckpointReader& reader) const {
    const Manifest& m = reader.manifest();
    const std::string where = (reader.dir() / "manifest.json").string();
    const std::string job_optimizer(config::to_string(engine.config().optimizer->type));
    const JsonFields state(m.state, "state", where);
    const std::string saved_optimizer = state.has("optimizer") ? state.string("optimizer") : std::string();
    if (saved_optimizer != job_optimizer) {
      throw CheckpointError(
          fmt::format("{}: the checkpoint's optimizer is {}, the job's is {} (optimizer.type): their states differ",
                      where, saved_optimizer.empty() ? "unknown" : saved_optimizer, job_optimizer));
    }
    std::size_t job_params = 0;
    for (const std::string& unit : engine.unit_names()) {
      for (const ParamSpec& p : engine.unit_params(unit)) {
        ++job_params;
        const ParamInfo* saved = reader.find_param(p.name);
        if (saved == nullptr) {
          throw CheckpointError(
              fmt::format("{}: the job's param '{}' (unit '{}') is not in the checkpoint", where, p.name, unit));
        }
        if (saved->shape != p.shape) {
          throw CheckpointError(fmt::format("{}: param '{}' has shape [{}] in the checkpoint, [{}] in the job", where,
                                            p.name, fmt::join(saved->shape, ", "), fmt::join(p.shape, ", ")));
        }
        if (saved->trainable != p.trainable) {
          throw CheckpointError(fmt::format("{}: param '{}' is {} in the checkpoint, {} in the job", where, p.name,
                                            saved->trainable ? "trainable" : "frozen",
                                            p.trainable ? "trainable" : "frozen"));
        }
      }
    }
    if (m.params.size() != job_params) {
      for (const ParamInfo& saved : m.params) {
        bool found = false;
        for (const std::string& unit : engine.unit_names()) {
          for (const ParamSpec& p : engine.unit_params(unit)) found = found || p.name == saved.name;
        }
        if (!found) {
          throw CheckpointError(fmt::format("{}: the checkpoint's param '{}' (unit '{}') is not in the job", where,
                                            saved.name, saved.unit));
        }
      }
    }
  }
};

namespace {
std::shared_ptr<comm::Bootstrap> non_null(std::shared_ptr<comm::Bootstrap> bootstrap) {
  if (!bootstrap) {
    throw UsageError(
        "Checkpointer: the bootstrap is null: pass the engine's (Engine::bootstrap()), or construct the "
        "Checkpointer from the engine alone: Checkpointer(engine, options)");
  }
  return bootstrap;
}
}  // namespace

Checkpointer::Checkpointer(Engine& engine, CheckpointerOptions options)
    : Checkpointer(engine, engine.bootstrap(), options) {}

Checkpointer::Checkpointer(Engine& engine, std::shared_ptr<comm::Bootstrap> bootstrap, CheckpointerOptions options)
    : impl_(std::make_unique<Impl>(engine, non_null(std::move(bootstrap)), options)) {
  if (options.staging_bytes == 0) throw UsageError("Checkpointer: staging_bytes must be > 0");
}

Checkpointer::~Checkpointer() {
  if (impl_->flight) impl_->abandon_flight();
}

// The checkpoint's exchanges wait for the slowest rank's writes: they get the longer deadline.
void Checkpointer::save(const fs::path& root, const std::string& tag, std::int64_t step, const Json& trainer_state) {
  const comm::ScopedOpAnnotation note("checkpoint", tag);
  impl_->save(root, tag, step, trainer_state);
}

std::vector<SaveReport> Checkpointer::poll() {
  const comm::ScopedOpAnnotation note("checkpoint");
  std::vector<SaveReport> out = std::exchange(impl_->pending, {});
  if (std::optional<SaveReport> r = impl_->complete(/*block=*/false)) out.push_back(std::move(*r));
  return out;
}

std::vector<SaveReport> Checkpointer::wait() {
  const comm::ScopedOpAnnotation note("checkpoint");
  std::vector<SaveReport> out = std::exchange(impl_->pending, {});
  if (std::optional<SaveReport> r = impl_->complete(/*block=*/true)) out.push_back(std::move(*r));
  return out;
}

bool Checkpointer::in_flight() const {
  return impl_->flight != nullptr;
}

LoadResult Checkpointer::load(const fs::path& path, std::string_view tag) {
  const comm::ScopedOpAnnotation note("checkpoint", tag);
  return impl_->load(path, tag);
}

}  // namespace zero3::ckpt
