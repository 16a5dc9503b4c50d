// The MPI backend: process-wide MPI start-up and shut-down (MpiRuntime), the start-up Bootstrap and the
// host-buffer Communicator. Every MPI call of zero3 runs on an MpiThread: the runtime's thread (which
// initializes and finalizes MPI and runs bootstrap exchanges) or a communicator's own thread (with
// MPI_THREAD_MULTIPLE). Stream workers never call MPI: they hand a collective to the MPI thread and
// sleep until it is done. Private to comm/.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "communicator_base.hpp"
#include "flight_recorder.hpp"
#include "zero3/comm/communicator.hpp"

namespace zero3::comm {

struct MpiOp;  // one issued collective's completion state (comm_mpi.cpp)

// One thread that runs MPI work. Tasks of a Lane run strictly in their sequence order (1, 2, 3, ...),
// whatever order they arrive in: collectives issued on different streams reach the thread in any
// order, but every rank must call MPI in issue order. Tasks without a lane run in arrival order.
class MpiThread {
 public:
  // A communicator's ordering state; `next` is guarded by the MpiThread's mutex.
  struct Lane {
    std::uint64_t next = 1;  // the sequence number allowed to run next
  };

  explicit MpiThread(std::string name);
  ~MpiThread();  // runs everything queued, then joins
  MpiThread(const MpiThread&) = delete;
  MpiThread& operator=(const MpiThread&) = delete;

  // Blocking: runs `fn` on this thread and rethrows its exception.
  void call(const std::function<void()>& fn);
  // Non-blocking: `fn` (which must not throw) runs once every task of `lane` numbered below `seq` has.
  void post(Lane& lane, std::uint64_t seq, std::function<void()> fn);
  // Blocks until the lane's tasks up to and including `seq` have run.
  void wait_lane(const Lane& lane, std::uint64_t seq);
  bool on_this_thread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  struct Task {
    Lane* lane;  // null: run in arrival order
    std::uint64_t seq;
    std::function<void()> fn;
  };
  void run();
  std::deque<Task>::iterator find_runnable();  // requires mutex_

  std::string name_;
  std::mutex mutex_;
  std::condition_variable work_cv_;  // the thread waits for a runnable task
  std::condition_variable done_cv_;  // call() and wait_lane() wait for progress
  std::deque<Task> tasks_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts after every member it uses exists
};

// MPI itself, once per process. Held (shared) by every bootstrap and communicator; MPI_Finalize runs
// when the last holder goes, on the thread that ran MPI_Init_thread.
class MpiRuntime {
 public:
  static std::shared_ptr<MpiRuntime> acquire();
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  MpiThread& thread() { return thread_; }
  // False when MPI gave less than MPI_THREAD_MULTIPLE: then every MPI call runs on thread().
  bool thread_multiple() const { return provided_ == MPI_THREAD_MULTIPLE; }
  // fp32 max that propagates NaN (MPI_MAX keeps whichever operand it compares first), so an overflow
  // on one rank cannot be lost. One per process: Open MPI leaks a little per MPI_Op_create.
  MPI_Op nan_max() const { return nan_max_; }

 private:
  MpiRuntime();
  MpiThread thread_;
  int provided_ = MPI_THREAD_SINGLE;
  bool initialized_here_ = false;  // false when the application had initialized MPI itself
  MPI_Op nan_max_ = MPI_OP_NULL;
  std::uint64_t abort_hook_ = 0;
};

class MpiBootstrap final : public Bootstrap {
 public:
  MpiBootstrap(std::shared_ptr<MpiRuntime> runtime, const World& world);
  ~MpiBootstrap() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void broadcast(std::vector<std::byte>& bytes, int root) override;
  std::vector<std::byte> all_gather(const std::vector<std::byte>& mine) override;
  void barrier() override;

  MpiRuntime& runtime() { return *runtime_; }
  MPI_Comm comm() const { return comm_; }  // use on the runtime thread only

 private:
  // All ranks' values of `v` (one collective on the runtime thread; call from inside thread().call).
  std::vector<std::uint64_t> gather_sizes(std::uint64_t v);

  // Runs `exchange` on the runtime thread as bootstrap collective `op`, recorded in the flight recorder
  // (its own lane and numbers: the bootstrap is called from one thread at a time, on every rank in order).
  void run_recorded(std::string_view op, std::size_t size_bytes, const std::function<void()>& exchange);

  std::shared_ptr<MpiRuntime> runtime_;
  std::uint32_t flight_lane_ = 0;
  std::uint64_t last_seq_ = 0;     // bootstrap exchanges so far
  MPI_Comm comm_ = MPI_COMM_NULL;  // a dup of MPI_COMM_WORLD, so our traffic never meets the application's
  int rank_ = 0;
  int size_ = 1;
};

class MpiCommunicator final : public CommunicatorBase {
 public:
  MpiCommunicator(std::shared_ptr<Bootstrap> bootstrap, Device& device, const MpiCommunicatorOptions& options);
  ~MpiCommunicator() override;  // waits for every issued collective, then frees the MPI communicator

  std::string_view backend_name() const override { return "mpi"; }

 protected:
  std::shared_ptr<Work> enqueue_all_gather(const CollectiveInfo& info, ConstBufferView send, BufferView recv,
                                           Stream& stream) override;
  std::shared_ptr<Work> enqueue_reduce_scatter(const CollectiveInfo& info, ConstBufferView send, BufferView recv,
                                               Stream& stream) override;
  std::shared_ptr<Work> enqueue_all_reduce(const CollectiveInfo& info, BufferView data, Stream& stream) override;
  std::shared_ptr<Work> enqueue_broadcast(const CollectiveInfo& info, BufferView data, Stream& stream) override;
  std::shared_ptr<Work> enqueue_barrier(const CollectiveInfo& info, Stream& stream) override;

  void check_memory(std::string_view op, std::string_view what, MemoryKind kind) const override;
  void check_stream(std::string_view op, Stream& stream) const override;
  std::size_t max_count() const override;

 private:
  class Launch;
  // Enqueues on `stream` a host function that runs `body` on the MPI thread in seq order and blocks
  // the stream until it is done.
  std::shared_ptr<Work> enqueue(const CollectiveInfo& info, Stream& stream, std::function<void()> body);
  // On the MPI thread: runs `op`'s body unless the communicator is broken, and completes the op.
  void execute(MpiOp& op, const std::function<void()>& body);
  void abandon(MpiOp& op, std::string_view reason);  // on the MPI thread, for ops whose stream skipped them
  // The desync guard (MpiCommunicatorOptions::desync_check), on the MPI thread before `info`'s body:
  // throws a CommError naming each rank's collective when the ranks' fingerprints differ.
  void check_in_step(const CollectiveInfo& info, const std::optional<flight::Record>& record);

  // Bodies, run on the MPI thread.
  void run_all_gather(ConstBufferView send, BufferView recv);
  void run_reduce_scatter(ConstBufferView send, BufferView recv, ReduceOp op);
  void run_all_reduce(BufferView data, ReduceOp op);
  MPI_Op mpi_op(ReduceOp op) const;
  // Scratch host memory reused across collectives (slot 0..2), grown on demand; MPI thread only.
  void* scratch(int slot, std::size_t size_bytes);

  std::shared_ptr<Bootstrap> bootstrap_;   // keeps MPI initialized while this communicator exists
  MpiBootstrap& mpi_bootstrap_;            // the same object, typed
  std::unique_ptr<MpiThread> own_thread_;  // null when running on the runtime's shared thread
  MpiThread* thread_ = nullptr;
  MpiThread::Lane lane_;
  MPI_Comm comm_ = MPI_COMM_NULL;  // MPI thread only (after construction)
  Buffer scratch_[3];              // MPI thread only
  std::string broken_;             // the first failure; later collectives fail with it. MPI thread only
  const bool desync_check_;
};

}  // namespace zero3::comm
