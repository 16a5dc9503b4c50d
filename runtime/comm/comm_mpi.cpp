#include "comm_mpi.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pthread.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <csignal>
#include <cstring>
#include <exception>
#include <thread>
#include <utility>

#include "flight_recorder.hpp"
#include "mpi_check.hpp"
#include "zero3/comm/fault.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/log.hpp"

namespace zero3::comm {

// ---------------------------------------------------------------- MpiThread

MpiThread::MpiThread(std::string name) : name_(std::move(name)), thread_([this] { run(); }) {
  pthread_setname_np(thread_.native_handle(), name_.substr(0, 15).c_str());  // visible in gdb/top; best effort
}

MpiThread::~MpiThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

std::deque<MpiThread::Task>::iterator MpiThread::find_runnable() {
  return std::find_if(tasks_.begin(), tasks_.end(),
                      [](const Task& t) { return t.lane == nullptr || t.lane->next == t.seq; });
}

void MpiThread::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    auto it = tasks_.end();
    work_cv_.wait(lock, [&] {
      it = find_runnable();
      return it != tasks_.end() || (stopping_ && tasks_.empty());
    });
    if (it == tasks_.end()) return;  // stopping and drained
    Task task = std::move(*it);
    tasks_.erase(it);
    lock.unlock();
    try {
      task.fn();
    } catch (const std::exception& e) {  // tasks report their own errors; this is a bug, not a failure path
      log::error("uncaught exception on MPI thread '{}': {}", name_, e.what());
    } catch (...) {
      log::error("uncaught exception on MPI thread '{}'", name_);
    }
    task.fn = nullptr;  // release what the task captured before taking the lock again
    lock.lock();
    if (task.lane != nullptr) task.lane->next = task.seq + 1;
    done_cv_.notify_all();
  }
}

void MpiThread::call(const std::function<void()>& fn) {
  if (on_this_thread()) {  // a task that needs MPI from inside a task: it is already on the right thread
    fn();
    return;
  }
  std::exception_ptr error;
  bool done = false;
  std::unique_lock lock(mutex_);
  ZERO3_CHECK(!stopping_, "MpiThread::call on a stopping MPI thread");
  tasks_.push_back({nullptr, 0, [&] {
                      try {
                        fn();
                      } catch (...) {
                        error = std::current_exception();
                      }
                      std::lock_guard done_lock(mutex_);
                      done = true;
                    }});
  work_cv_.notify_one();
  done_cv_.wait(lock, [&] { return done; });
  lock.unlock();
  if (error) std::rethrow_exception(error);
}

void MpiThread::post(Lane& lane, std::uint64_t seq, std::function<void()> fn) {
  std::lock_guard lock(mutex_);
  tasks_.push_back({&lane, seq, std::move(fn)});
  // Notified under the lock: once the task can run, the poster may be gone (and so may this thread's
  // owner, right after the task completes).
  work_cv_.notify_one();
}

void MpiThread::wait_lane(const Lane& lane, std::uint64_t seq) {
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return lane.next > seq; });
}

// ---------------------------------------------------------------- MpiRuntime

namespace {
std::mutex g_runtime_mutex;
std::condition_variable g_runtime_cv;
std::weak_ptr<MpiRuntime> g_runtime;  // guarded by g_runtime_mutex, as are the flags below
bool g_runtime_alive = false;         // an MpiRuntime exists (it may be finalizing right now)
bool g_finalized_here = false;        // MPI_Finalize ran: MPI cannot start again in this process

// MpiRuntime::nan_max(): inout = max(in, inout), NaN if either is.
void nan_max_f32(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const float*>(in);
  auto* b = static_cast<float*>(inout);
  for (int i = 0; i < *len; ++i) {
    if (std::isnan(a[i]) || a[i] > b[i]) b[i] = a[i];
  }
}

std::string_view thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
    default:
      return "unknown";
  }
}
}  // namespace

std::shared_ptr<MpiRuntime> MpiRuntime::acquire() {
  std::unique_lock lock(g_runtime_mutex);
  if (auto runtime = g_runtime.lock()) return runtime;
  g_runtime_cv.wait(lock, [] { return !g_runtime_alive; });  // the last one is finalizing: let it finish
  if (g_finalized_here) {
    throw UsageError(
        "MPI was already finalized in this process (the last zero3 bootstrap and communicator were destroyed) "
        "and cannot be initialized again: keep one bootstrap alive for the whole run");
  }
  std::shared_ptr<MpiRuntime> runtime(new MpiRuntime());
  g_runtime = runtime;
  g_runtime_alive = true;
  return runtime;
}

MpiRuntime::MpiRuntime() : thread_("zero3-mpi") {
  // MPI_Init_thread on our own thread makes it MPI's "main thread", so even MPI_THREAD_FUNNELED works
  // when every call is routed through it.
  thread_.call([this] {
    int initialized = 0;
    ZERO3_MPI_CHECK(MPI_Initialized(&initialized));
    if (initialized == 0) {
      int finalized = 0;
      ZERO3_MPI_CHECK(MPI_Finalized(&finalized));
      if (finalized != 0) throw UsageError("MPI was finalized by the application; zero3 cannot initialize it again");
      ZERO3_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided_));
      initialized_here_ = true;
    } else {
      ZERO3_MPI_CHECK(MPI_Query_thread(&provided_));
      if (provided_ < MPI_THREAD_SERIALIZED) {
        throw UsageError(
            fmt::format("MPI was initialized by the application with {}, but zero3 calls MPI from threads of its own: "
                        "initialize with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let zero3 initialize MPI",
                        thread_level_name(provided_)));
      }
    }
    ZERO3_MPI_CHECK(MPI_Op_create(&nan_max_f32, /*commute=*/1, &nan_max_));
  });
  if (provided_ != MPI_THREAD_MULTIPLE) {
    log::warn("MPI provides {} (not MPI_THREAD_MULTIPLE): every communicator's MPI calls share one thread",
              thread_level_name(provided_));
  }
  // The failure policy's way to end every rank: called from the watchdog's thread, which may be any
  // thread while the MPI threads are blocked in the collective that never completes.
  abort_hook_ = register_abort_hook([] { MPI_Abort(MPI_COMM_WORLD, 1); });
}

MpiRuntime::~MpiRuntime() {
  unregister_abort_hook(abort_hook_);
  try {
    thread_.call([this] {
      ZERO3_MPI_CHECK_NOTHROW(MPI_Op_free(&nan_max_));
      if (initialized_here_) ZERO3_MPI_CHECK_NOTHROW(MPI_Finalize());
    });
  } catch (const std::exception& e) {
    log::error("shutting MPI down: {}", e.what());
  }
  std::lock_guard lock(g_runtime_mutex);
  g_runtime_alive = false;
  if (initialized_here_) g_finalized_here = true;
  g_runtime_cv.notify_all();
}

// ---------------------------------------------------------------- MpiBootstrap

namespace {

// What to do when MPI_COMM_WORLD is not the environment's world.
std::string world_mismatch_hint(const World& world, int mpi_size) {
  if (mpi_size == 1 && world.size > 1) {
    if (world.source.rfind("srun", 0) == 0) {
      return " MPI sees a single process: this MPI library did not join srun's step. Start it through the PMI "
             "that the MPI library was built with (srun --mpi=pmix; `srun --mpi=list` shows the choices), or start "
             "the job with mpirun; to run a single process, unset the launcher variables.";
    }
    return fmt::format(
        " This process was not started by mpirun (MPI sees a single process): start the job with `mpirun -np {}`, "
        "or unset the launcher variables to run a single process.",
        world.size);
  }
  if (world.size == 1 && mpi_size > 1) {
    return " MPI started several processes but the environment describes one: launch with mpirun alone.";
  }
  return " The launcher variables were inherited from another launch or set by hand: start the job with one "
         "launcher and unset the variables of the others.";
}

// "" when every rank's environment (rank, size pairs in `claims`, by MPI rank) matches MPI_COMM_WORLD;
// otherwise the error, which every rank computes alike from the same claims.
std::string world_mismatch(const World& world, int mpi_rank, int mpi_size, const std::vector<int>& claims) {
  constexpr std::size_t kShown = 8;
  std::vector<std::string> wrong;
  int count = 0;
  for (int r = 0; r < mpi_size; ++r) {
    const int rank = claims[2 * static_cast<std::size_t>(r)];
    const int size = claims[2 * static_cast<std::size_t>(r) + 1];
    if (rank == r && size == mpi_size) continue;
    ++count;
    if (wrong.size() < kShown) wrong.push_back(fmt::format("MPI rank {} has environment rank {} of {}", r, rank, size));
  }
  if (count == 0) return "";
  return fmt::format(
      "MPI_COMM_WORLD and the launcher environment disagree on {} of {} ranks ({}{}). On this process the launcher "
      "environment, {}, says rank {} of {}, but MPI_COMM_WORLD has rank {} of {}.{}",
      count, mpi_size, fmt::join(wrong, "; "), static_cast<std::size_t>(count) > kShown ? "; ..." : "", world.source,
      world.rank, world.size, mpi_rank, mpi_size, world_mismatch_hint(world, mpi_size));
}

}  // namespace

MpiBootstrap::MpiBootstrap(std::shared_ptr<MpiRuntime> runtime, const World& world) : runtime_(std::move(runtime)) {
  int mpi_rank = 0;
  int mpi_size = 0;
  std::vector<int> claims;
  runtime_->thread().call([&] {
    ZERO3_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank));
    ZERO3_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size));
    // Every rank's view, so that a world wrong on one rank is the same ConfigError on all of them
    // rather than an error there and a hang in the next collective everywhere else.
    const std::array<int, 2> mine{world.rank, world.size};
    claims.resize(2 * static_cast<std::size_t>(mpi_size));
    ZERO3_MPI_CHECK(MPI_Allgather(mine.data(), 2, MPI_INT, claims.data(), 2, MPI_INT, MPI_COMM_WORLD));
  });
  if (std::string error = world_mismatch(world, mpi_rank, mpi_size, claims); !error.empty()) {
    throw ConfigError(error);
  }
  rank_ = world.rank;
  size_ = world.size;
  flight_lane_ = flight::Recorder::instance().register_lane("bootstrap");
  runtime_->thread().call([&] {
    ZERO3_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm_));
    ZERO3_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  });
}

MpiBootstrap::~MpiBootstrap() {
  try {
    runtime_->thread().call([this] { ZERO3_MPI_CHECK_NOTHROW(MPI_Comm_free(&comm_)); });
  } catch (const std::exception& e) {
    log::error("MpiBootstrap: {}", e.what());
  }
}

std::vector<std::uint64_t> MpiBootstrap::gather_sizes(std::uint64_t v) {
  std::vector<std::uint64_t> all(static_cast<std::size_t>(size_));
  ZERO3_MPI_CHECK(MPI_Allgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm_));
  return all;
}

void MpiBootstrap::broadcast(std::vector<std::byte>& bytes, int root) {
  if (root < 0 || root >= size_) {
    throw UsageError(
        fmt::format("Bootstrap::broadcast on rank {}: root {} is not a rank in [0, {})", rank_, root, size_));
  }
  run_recorded("broadcast", bytes.size(), [&] {
    // Sizes first, so a mismatch is an error on every rank rather than a truncation on some.
    const auto sizes = gather_sizes(bytes.size());
    if (std::any_of(sizes.begin(), sizes.end(), [&](std::uint64_t s) { return s != sizes.front(); })) {
      throw UsageError(fmt::format("Bootstrap::broadcast on rank {}: ranks passed different sizes ({} bytes by rank)",
                                   rank_, fmt::join(sizes, ", ")));
    }
    for (std::size_t offset = 0; offset < bytes.size();) {
      const int n = static_cast<int>(std::min<std::size_t>(bytes.size() - offset, INT_MAX));
      ZERO3_MPI_CHECK(MPI_Bcast(bytes.data() + offset, n, MPI_BYTE, root, comm_));
      offset += static_cast<std::size_t>(n);
    }
  });
}

std::vector<std::byte> MpiBootstrap::all_gather(const std::vector<std::byte>& mine) {
  std::vector<std::byte> all;
  run_recorded("all_gather", mine.size() * static_cast<std::size_t>(size_), [&] {
    const auto sizes = gather_sizes(mine.size());
    if (std::any_of(sizes.begin(), sizes.end(), [&](std::uint64_t s) { return s != sizes.front(); })) {
      throw UsageError(fmt::format("Bootstrap::all_gather on rank {}: ranks passed different sizes ({} bytes by rank)",
                                   rank_, fmt::join(sizes, ", ")));
    }
    if (mine.size() > static_cast<std::size_t>(INT_MAX)) {
      throw UsageError(fmt::format("Bootstrap::all_gather on rank {}: {} bytes per rank is more than the {} it takes",
                                   rank_, mine.size(), INT_MAX));
    }
    all.resize(mine.size() * static_cast<std::size_t>(size_));
    const int n = static_cast<int>(mine.size());
    ZERO3_MPI_CHECK(MPI_Allgather(mine.data(), n, MPI_BYTE, all.data(), n, MPI_BYTE, comm_));
  });
  return all;
}

void MpiBootstrap::barrier() {
  run_recorded("barrier", 0, [&] { ZERO3_MPI_CHECK(MPI_Barrier(comm_)); });
}

void MpiBootstrap::run_recorded(std::string_view op, std::size_t size_bytes, const std::function<void()>& exchange) {
  flight::Recorder& recorder = flight::Recorder::instance();
  CollectiveInfo info;
  info.seq = ++last_seq_;
  info.op = op;
  info.count = size_bytes;
  recorder.issued(flight_lane_, info, size_bytes, "bootstrap");
  runtime_->thread().call([&] {
    recorder.started(flight_lane_, info.seq);
    try {
      exchange();
    } catch (const CommError& e) {
      recorder.completed(flight_lane_, info.seq, /*failed=*/true);
      flight::report_collective_failure(
          "collective_failed", flight_lane_, info.seq,
          fmt::format("bootstrap {} #{} failed on rank {}: {}", op, info.seq, rank_, e.what()));
      throw;
    } catch (...) {
      recorder.completed(flight_lane_, info.seq, /*failed=*/true);
      throw;
    }
    recorder.completed(flight_lane_, info.seq, /*failed=*/false);
  });
}

std::shared_ptr<Bootstrap> make_mpi_bootstrap(const World& world) {
  // Before MPI_Init: an MPI that cannot join the launch may abort there, with its own words only.
  if (!world.warning.empty()) log::warn("{}", world.warning);
  return std::make_shared<MpiBootstrap>(MpiRuntime::acquire(), world);
}

// ---------------------------------------------------------------- collectives: completion state

struct MpiOp {
  explicit MpiOp(CollectiveInfo i) : info(std::move(i)) {}
  const CollectiveInfo info;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;  // guarded by mutex, as is error
  std::string error;  // the CommError message; empty on success

  void finish(std::string failure) {
    {
      std::lock_guard lock(mutex);
      error = std::move(failure);
      done = true;
    }
    cv.notify_all();
  }
  // Blocks until finished; returns the failure message (empty on success).
  std::string wait() {
    std::unique_lock lock(mutex);
    cv.wait(lock, [&] { return done; });
    return error;
  }
};

namespace {

class MpiWork final : public Work {
 public:
  explicit MpiWork(std::shared_ptr<MpiOp> op) : op_(std::move(op)) {}
  void wait() override {
    const std::string failure = op_->wait();
    if (!failure.empty()) throw CommError(failure);
  }
  bool is_completed() override {
    std::lock_guard lock(op_->mutex);
    return op_->done;
  }
  const CollectiveInfo& info() const override { return op_->info; }

 private:
  std::shared_ptr<MpiOp> op_;
};

// Data moves as raw bits (no conversion, NaN payloads intact); reductions go through fp32.
MPI_Datatype bits_type(DType t) {
  return t == DType::f32 ? MPI_UINT32_T : MPI_UINT16_T;
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

void to_f32(ConstBufferView src, float* out) {
  switch (src.dtype) {
    case DType::f32:
      std::memcpy(out, src.data, src.count * sizeof(float));
      break;
    case DType::f16: {
      const auto* p = src.as<fp16_t>();
      for (std::size_t i = 0; i < src.count; ++i) out[i] = fp16_to_float(p[i]);
      break;
    }
    case DType::bf16: {
      const auto* p = src.as<bf16_t>();
      for (std::size_t i = 0; i < src.count; ++i) out[i] = bf16_to_float(p[i]);
      break;
    }
  }
}

// The one rounding of a 16-bit reduction: fp32 result to dst's dtype, round to nearest even.
void from_f32(const float* in, BufferView dst) {
  switch (dst.dtype) {
    case DType::f32:
      std::memcpy(dst.data, in, dst.count * sizeof(float));
      break;
    case DType::f16: {
      auto* p = dst.as<fp16_t>();
      for (std::size_t i = 0; i < dst.count; ++i) p[i] = float_to_fp16(in[i]);
      break;
    }
    case DType::bf16: {
      auto* p = dst.as<bf16_t>();
      for (std::size_t i = 0; i < dst.count; ++i) p[i] = float_to_bf16(in[i]);
      break;
    }
  }
}

// avg = sum / size in fp32, the sum being exact or MPI's fp32 sum: one division, one rounding.
void divide(float* x, std::size_t n, int size) {
  const auto d = static_cast<float>(size);
  for (std::size_t i = 0; i < n; ++i) x[i] /= d;
}

}  // namespace

// ---------------------------------------------------------------- MpiCommunicator

namespace {
// The desync guard's finding: reported as kind "desync" instead of a plain collective failure.
class DesyncError : public CommError {
 public:
  using CommError::CommError;
};
}  // namespace

// The stream's half of a collective. run() executes on the stream's host thread: it hands the body to
// the MPI thread and sleeps until it is done, so later work on the stream sees the result. When the
// stream drops the function without running it (the stream failed earlier), the destructor tells the
// MPI thread, so the sequence moves on and the Work fails instead of hanging.
class MpiCommunicator::Launch {
 public:
  Launch(MpiCommunicator& comm, std::shared_ptr<MpiOp> op, std::function<void()> body, std::string stream_name)
      : comm_(comm), op_(std::move(op)), body_(std::move(body)), stream_name_(std::move(stream_name)) {}
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

  ~Launch() {
    if (state_ != State::pending) return;
    try {
      std::string reason = fmt::format("not executed: stream '{}' had failed before reaching it", stream_name_);
      comm_.thread_->post(comm_.lane_, op_->info.seq, [&comm = comm_, op = op_, reason] { comm.abandon(*op, reason); });
    } catch (const std::exception& e) {
      log::error("{}: could not report an unexecuted collective: {}", describe(op_->info), e.what());
    }
  }

  void run() {
    state_ = State::started;
    comm_.thread_->post(comm_.lane_, op_->info.seq,
                        [&comm = comm_, op = op_, body = std::move(body_)] { comm.execute(*op, body); });
    const std::string failure = op_->wait();
    if (!failure.empty()) throw CommError(failure);  // marks the stream failed, as a failed kernel would
  }

  // launch_host threw: nothing was enqueued and the sequence number is given back.
  void cancel() { state_ = State::cancelled; }

 private:
  enum class State { pending, started, cancelled };
  MpiCommunicator& comm_;
  std::shared_ptr<MpiOp> op_;
  std::function<void()> body_;
  std::string stream_name_;
  State state_ = State::pending;
};

MpiCommunicator::MpiCommunicator(std::shared_ptr<Bootstrap> bootstrap, Device& device,
                                 const MpiCommunicatorOptions& options)
    : CommunicatorBase(bootstrap->rank(), bootstrap->size(), device),
      bootstrap_(std::move(bootstrap)),
      mpi_bootstrap_(dynamic_cast<MpiBootstrap&>(*bootstrap_)),
      desync_check_(options.desync_check) {
  MpiRuntime& runtime = mpi_bootstrap_.runtime();
  if (options.shared_mpi_thread || !runtime.thread_multiple()) {
    thread_ = &runtime.thread();
  } else {
    own_thread_ = std::make_unique<MpiThread>("zero3-mpi-comm");
    thread_ = own_thread_.get();
  }
  // Collective over all ranks: it runs on the runtime thread, in order with the bootstrap's exchanges.
  runtime.thread().call([&] {
    ZERO3_MPI_CHECK(MPI_Comm_dup(mpi_bootstrap_.comm(), &comm_));
    ZERO3_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  });
}

MpiCommunicator::~MpiCommunicator() {
  // Collectives still queued on streams reference this object: let every issued one finish first.
  thread_->wait_lane(lane_, last_seq());
  try {
    thread_->call([this] { ZERO3_MPI_CHECK_NOTHROW(MPI_Comm_free(&comm_)); });
  } catch (const std::exception& e) {
    log::error("MpiCommunicator: {}", e.what());
  }
  own_thread_.reset();
}

void MpiCommunicator::check_memory(std::string_view op, std::string_view what, MemoryKind kind) const {
  if (kind == MemoryKind::device && !device().caps().device_memory_on_host) {
    usage_error(op, fmt::format("{} is {} device memory, which MPI cannot access: the mpi backend takes host memory "
                                "(pinned or pageable); use the nccl communicator for device buffers",
                                what, device_kind_name(device().kind())));
  }
}

void MpiCommunicator::check_stream(std::string_view /*op*/, Stream& /*stream*/) const {}

std::size_t MpiCommunicator::max_count() const {
  return static_cast<std::size_t>(INT_MAX);
}

MPI_Op MpiCommunicator::mpi_op(ReduceOp op) const {
  return op == ReduceOp::max ? mpi_bootstrap_.runtime().nan_max() : MPI_SUM;
}

void* MpiCommunicator::scratch(int slot, std::size_t size_bytes) {
  Buffer& b = scratch_[slot];
  if (b.size_bytes() < size_bytes) {
    b.reset();  // free first: the peak stays one buffer per slot
    b = device().allocate((size_bytes + sizeof(float) - 1) / sizeof(float), DType::f32, MemoryKind::pageable_host,
                          MemCategory::comm_buffer);
  }
  return b.data();
}

std::shared_ptr<Work> MpiCommunicator::enqueue(const CollectiveInfo& info, Stream& stream, std::function<void()> body) {
  auto op = std::make_shared<MpiOp>(info);
  auto launch = std::make_shared<Launch>(*this, op, std::move(body), std::string(stream.name()));
  try {
    stream.launch_host([launch] { launch->run(); });
  } catch (...) {
    launch->cancel();
    throw;
  }
  return std::make_shared<MpiWork>(std::move(op));
}

void MpiCommunicator::execute(MpiOp& op, const std::function<void()>& body) {
  if (!broken_.empty()) {
    op.finish(failure_message(op.info, "the communicator is unusable after an earlier failure: " + broken_));
    flight::Recorder::instance().completed(flight_lane(), op.info.seq, /*failed=*/true);
    return;
  }
  flight::Recorder& recorder = flight::Recorder::instance();
  const std::optional<flight::Record> record = recorder.find(flight_lane(), op.info.seq);
  recorder.started(flight_lane(), op.info.seq);
  std::string_view kind = "collective_failed";
  std::string error;
  try {
    if (desync_check_) check_in_step(op.info, record);
    if (record && fault::fire(fault::Kind::stall_in_collective, rank(), record->step)) {
      // Long enough for the watchdog to publish that this rank entered (it publishes every poll interval).
      std::this_thread::sleep_for(std::chrono::seconds(2));
      ::raise(SIGSTOP);
    }
    if (record && fault::fire(fault::Kind::mpi_error, rank(), record->step)) {
      throw CommError(
          fmt::format("MPI_ERR_OTHER: known error not in list (MPI error 16), injected by ZERO3_FAULT "
                      "into {}",
                      describe(op.info)));
    }
    body();
  } catch (const DesyncError& e) {
    kind = "desync";
    error = e.what();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (error.empty()) {
    recorder.completed(flight_lane(), op.info.seq, /*failed=*/false);
    op.finish({});
    return;
  }
  broken_ = failure_message(op.info, error);
  recorder.completed(flight_lane(), op.info.seq, /*failed=*/true);
  flight::report_collective_failure(kind, flight_lane(), op.info.seq, broken_);
  op.finish(broken_);
}

// The desync guard: before the collective, every rank contributes (fp, ~fp) to a max all-reduce on the
// same communicator and thread, so it pairs with the other ranks' guards; equal fingerprints give back
// exactly (fp, ~fp). On a mismatch every rank sees it (the max differs from its own in one of the two)
// and the ranks all-gather their descriptions to name what each one issued.
void MpiCommunicator::check_in_step(const CollectiveInfo& info, const std::optional<flight::Record>& record) {
  const std::uint64_t fp = record ? record->fingerprint : fingerprint(info);
  std::uint64_t both[2] = {fp, ~fp};
  ZERO3_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, both, 2, MPI_UINT64_T, MPI_MAX, comm_));
  if (both[0] == fp && both[1] == ~fp) return;
  constexpr std::size_t kText = 224;
  char mine[kText] = {};
  const std::string text =
      record ? flight::describe_record(*record, flight::Recorder::instance().lanes()) : describe(info);
  std::memcpy(mine, text.data(), std::min(text.size(), kText - 1));
  std::vector<char> all(kText * static_cast<std::size_t>(size()));
  ZERO3_MPI_CHECK(MPI_Allgather(mine, kText, MPI_CHAR, all.data(), kText, MPI_CHAR, comm_));
  std::string ranks;
  for (int r = 0; r < size(); ++r) {
    const char* t = all.data() + kText * static_cast<std::size_t>(r);
    ranks += fmt::format("{}rank {}: {}", r ? "; " : "", r, std::string_view(t, ::strnlen(t, kText)));
  }
  throw DesyncError(fmt::format("desync guard: the ranks issued different collectives as #{}: {}", info.seq, ranks));
}

void MpiCommunicator::abandon(MpiOp& op, std::string_view reason) {
  std::string failure = failure_message(op.info, reason);
  flight::Recorder::instance().completed(flight_lane(), op.info.seq, /*failed=*/true);
  if (broken_.empty()) {  // the other ranks ran it: from here on the ranks disagree
    broken_ = failure;
    flight::report_collective_failure("collective_failed", flight_lane(), op.info.seq, failure);
  }
  op.finish(std::move(failure));
}

std::shared_ptr<Work> MpiCommunicator::enqueue_all_gather(const CollectiveInfo& info, ConstBufferView send,
                                                          BufferView recv, Stream& stream) {
  return enqueue(info, stream, [this, send, recv] { run_all_gather(send, recv); });
}

std::shared_ptr<Work> MpiCommunicator::enqueue_reduce_scatter(const CollectiveInfo& info, ConstBufferView send,
                                                              BufferView recv, Stream& stream) {
  const ReduceOp op = *info.reduce_op;
  return enqueue(info, stream, [this, send, recv, op] { run_reduce_scatter(send, recv, op); });
}

std::shared_ptr<Work> MpiCommunicator::enqueue_all_reduce(const CollectiveInfo& info, BufferView data, Stream& stream) {
  const ReduceOp op = *info.reduce_op;
  return enqueue(info, stream, [this, data, op] { run_all_reduce(data, op); });
}

std::shared_ptr<Work> MpiCommunicator::enqueue_broadcast(const CollectiveInfo& info, BufferView data, Stream& stream) {
  const int root = info.root;
  return enqueue(info, stream, [this, data, root] {
    ZERO3_MPI_CHECK(MPI_Bcast(data.data, static_cast<int>(data.count), bits_type(data.dtype), root, comm_));
  });
}

std::shared_ptr<Work> MpiCommunicator::enqueue_barrier(const CollectiveInfo& info, Stream& stream) {
  return enqueue(info, stream, [this] { ZERO3_MPI_CHECK(MPI_Barrier(comm_)); });
}

void MpiCommunicator::run_all_gather(ConstBufferView send, BufferView recv) {
  const int count = static_cast<int>(send.count);
  const MPI_Datatype type = bits_type(send.dtype);
  const void* src = send.data;
  if (send.count > 0 && src == recv.slice(static_cast<std::size_t>(rank()) * send.count, send.count).data) {
    src = MPI_IN_PLACE;
  }
  // One rank: the gather is a copy. Open MPI's own path allocates and faults in a temporary every call.
  if (size() == 1) {
    if (src != MPI_IN_PLACE && send.count > 0) std::memmove(recv.data, send.data, send.size_bytes());
    return;
  }
  ZERO3_MPI_CHECK(MPI_Allgather(src, count, type, recv.data, count, type, comm_));
}

void MpiCommunicator::run_reduce_scatter(ConstBufferView send, BufferView recv, ReduceOp op) {
  const std::size_t block = recv.count;
  const float* in32 = nullptr;
  if (send.dtype == DType::f32) {
    in32 = send.as<float>();
  } else {
    auto* s = static_cast<float*>(scratch(0, send.count * sizeof(float)));
    to_f32(send, s);
    in32 = s;
  }
  // fp32 results land in recv directly unless recv is part of send (in place).
  const bool direct = recv.dtype == DType::f32 && !overlaps(send.data, send.size_bytes(), recv.data, recv.size_bytes());
  // One rank: the reduction of one contribution is that contribution, and avg divides by 1 exactly, so
  // the result is the fp32 input as MPI would give it, without MPI's temporary.
  if (size() == 1) {
    if (direct) {
      std::memmove(recv.data, in32, block * sizeof(float));
    } else if (!(recv.dtype == DType::f32 && recv.data == static_cast<const void*>(in32))) {
      float* copy = static_cast<float*>(scratch(1, block * sizeof(float)));
      std::memcpy(copy, in32, block * sizeof(float));
      from_f32(copy, recv);
    }
    return;
  }
  float* out32 = direct ? recv.as<float>() : static_cast<float*>(scratch(1, block * sizeof(float)));
  ZERO3_MPI_CHECK(MPI_Reduce_scatter_block(in32, out32, static_cast<int>(block), MPI_FLOAT, mpi_op(op), comm_));
  if (op == ReduceOp::avg) divide(out32, block, size());
  if (!direct) from_f32(out32, recv);
}

// reduce_scatter + all_gather over size() equal blocks (the last padded): each block is reduced once, by
// MPI on its owning rank, and every rank then receives those same bits, so all ranks agree bitwise even
// where MPI's own allreduce might not. Bandwidth as a ring all-reduce.
void MpiCommunicator::run_all_reduce(BufferView data, ReduceOp op) {
  const auto p = static_cast<std::size_t>(size());
  if (p == 1 && data.dtype == DType::f32) return;  // one contribution, avg by 1: the data as they are
  const std::size_t n = data.count;
  const std::size_t block = (n + p - 1) / p;
  const std::size_t padded = block * p;
  const std::size_t elem = size_of(data.dtype);

  const float* in32 = nullptr;
  if (data.dtype == DType::f32 && n == padded) {
    in32 = data.as<float>();
  } else {
    auto* s = static_cast<float*>(scratch(0, padded * sizeof(float)));
    to_f32(data, s);
    std::fill(s + n, s + padded, 0.0f);  // padding is reduced but never read back
    in32 = s;
  }
  auto* block32 = static_cast<float*>(scratch(1, block * sizeof(float)));
  ZERO3_MPI_CHECK(MPI_Reduce_scatter_block(in32, block32, static_cast<int>(block), MPI_FLOAT, mpi_op(op), comm_));
  if (op == ReduceOp::avg) divide(block32, block, size());

  const void* mine = block32;
  if (data.dtype != DType::f32) {
    void* rounded = scratch(2, block * elem);
    from_f32(block32, BufferView{rounded, block, data.dtype, MemoryKind::pageable_host});
    mine = rounded;
  }
  // Slot 0 held the fp32 input, which MPI no longer reads; reuse it for the padded gather.
  void* gathered = n == padded ? data.data : scratch(0, padded * elem);
  const MPI_Datatype type = bits_type(data.dtype);
  ZERO3_MPI_CHECK(MPI_Allgather(mine, static_cast<int>(block), type, gathered, static_cast<int>(block), type, comm_));
  if (gathered != data.data && n > 0) std::memcpy(data.data, gathered, n * elem);
}

std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<Bootstrap> bootstrap, Device& device,
                                                    const MpiCommunicatorOptions& options) {
  if (bootstrap == nullptr || dynamic_cast<MpiBootstrap*>(bootstrap.get()) == nullptr) {
    throw UsageError("make_mpi_communicator needs the bootstrap returned by make_mpi_bootstrap");
  }
  return std::make_unique<MpiCommunicator>(std::move(bootstrap), device, options);
}

}  // namespace zero3::comm
