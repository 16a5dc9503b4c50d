// Collectives over the ranks of a World, enqueued on a device stream and returning Work handles.
// Stream semantics (as c10d/NCCL): a collective starts after the work already enqueued on `stream`,
// and work enqueued on `stream` afterwards sees its result. Work::wait() blocks the host until the
// collective has completed. Buffers must stay alive until then. Every collective carries a sequence
// number and a fingerprint (op, dtype, count) for the flight recorder and desync checks.
// Backends: mpi (host-memory buffers; all MPI calls from one dedicated thread) and nccl (device buffers).
// Collectives must be issued in the same order on every rank. A Communicator may be called from several
// host threads (calls are serialized), but the order across ranks is then the caller's to guarantee.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zero3/comm/world.hpp"
#include "zero3/core/buffer_view.hpp"
#include "zero3/device/device.hpp"

namespace zero3::comm {

enum class ReduceOp { sum, avg, max };
constexpr std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
  }
  return "?";
}

struct CollectiveInfo {
  std::uint64_t seq = 0;  // per communicator, starting at 1, identical across ranks for the same call
  std::string op;         // "all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier"
  DType dtype = DType::f32;
  // Elements: all_gather send.count, reduce_scatter recv.count (each rank's share), all_reduce and
  // broadcast the buffer's count, barrier 0.
  std::size_t count = 0;
  std::optional<ReduceOp> reduce_op;  // reductions only
  int root = -1;                      // broadcast only
};
// "all_reduce #7 (fp16 x 1001, sum)", "barrier #8": for messages and the flight recorder.
std::string describe(const CollectiveInfo& info);
// A hash of every field (seq included): equal on all ranks exactly when they issued the same collective
// as their seq-th call. For desync guards that all-gather it.
std::uint64_t fingerprint(const CollectiveInfo& info);

class Work {
 public:
  virtual ~Work() = default;
  // Blocks the host until the collective has completed; rethrows its error (CommError naming op,
  // seq, dtype, count and rank).
  virtual void wait() = 0;
  // Non-blocking.
  virtual bool is_completed() = 0;
  virtual const CollectiveInfo& info() const = 0;
};

// Arguments are checked when a collective is issued (count relations, equal dtypes, root in range,
// memory kinds and stream device usable by the backend); a violation throws UsageError naming the op
// and the mismatch, and consumes no sequence number. Errors while the collective runs are reported by
// Work::wait() and make `stream` failed; after one, the communicator is unusable (later collectives
// fail with a CommError naming the first failure), since the ranks can no longer be trusted to agree.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend_name() const = 0;

  // recv.count == size() * send.count; rank r's block lands at recv[r * send.count]. In place when send
  // is exactly recv's block of this rank.
  virtual std::shared_ptr<Work> all_gather(ConstBufferView send, BufferView recv, Stream& stream) = 0;
  // send.count == size() * recv.count; rank r receives the reduction of block r. avg divides by size().
  // mpi: fp16/bf16 are reduced in fp32 and rounded once. nccl: reduced by NCCL in the dtype itself.
  virtual std::shared_ptr<Work> reduce_scatter(ConstBufferView send, BufferView recv, ReduceOp op, Stream& stream) = 0;
  // In place; every rank gets bitwise the same result.
  virtual std::shared_ptr<Work> all_reduce(BufferView data, ReduceOp op, Stream& stream) = 0;
  virtual std::shared_ptr<Work> broadcast(BufferView data, int root, Stream& stream) = 0;
  // Work enqueued on `stream` afterwards starts only after every rank has reached the barrier.
  virtual std::shared_ptr<Work> barrier(Stream& stream) = 0;
};

// Blocking host-side exchanges of raw bytes among all ranks, for start-up work (NCCL unique ids,
// cross-rank checksums). Call from one thread at a time, on every rank in the same order.
class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank passes `bytes.size()` equal (UsageError on every rank when not); root's bytes end up on
  // every rank.
  virtual void broadcast(std::vector<std::byte>& bytes, int root) = 0;
  // Every rank contributes `mine` (same size on every rank, UsageError on every rank when not); returns
  // size() * mine.size() bytes, rank r's at offset r * mine.size().
  virtual std::vector<std::byte> all_gather(const std::vector<std::byte>& mine) = 0;
  virtual void barrier() = 0;
};

// Initializes MPI (once per process, thread level MULTIPLE requested), checks that MPI's world agrees
// with `world` (ConfigError naming both when not), and finalizes MPI when the last user goes away:
// every communicator holds its bootstrap, so MPI outlives them. MPI cannot be initialized twice, so a
// bootstrap made after MPI was finalized throws. Collective over all ranks.
std::shared_ptr<Bootstrap> make_mpi_bootstrap(const World& world);

struct MpiCommunicatorOptions {
  // Run this communicator's MPI calls on the process-wide MPI thread (shared with the bootstrap and
  // other such communicators) instead of a thread of its own. Forced when MPI provides less than
  // MPI_THREAD_MULTIPLE; then blocking collectives of different communicators are serialized, so every
  // rank must issue them in the same order across communicators.
  bool shared_mpi_thread = false;
  // The desync guard (zero3.comm.desync_check): before each collective the ranks compare its
  // fingerprint (op, dtype, count, seq; unit, step and micro-batch) with one 16-byte all-reduce; ranks that
  // issued different collectives fail with a CommError naming what each one issued.
  bool desync_check = false;
};

// Host buffers (any host-accessible memory). Requires the MPI bootstrap. Collective over all ranks.
// Destruction waits until every collective issued on it has completed.
std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<Bootstrap> bootstrap, Device& device,
                                                    const MpiCommunicatorOptions& options = {});
// CUDA device buffers; the NCCL unique id travels through `bootstrap`. Throws Error without CUDA.
// Collective over all ranks.
std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<Bootstrap> bootstrap, Device& device);
bool built_with_nccl();

}  // namespace zero3::comm
