// Where a rank's offloaded state lives: the NUMA node closest to its GPU (or, with no GPU, the node of the
// rank's CPU set), the cores of that node for the optimizer threads, and memory binding for allocations.
// A HostTopology is read from the machine (hwloc) or built from a synthetic description or XML text, so
// the placement logic is tested on multi-node layouts this machine does not have. Any thread may use
// these; a HostTopology is immutable after construction.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace zero3::offload {

class HostTopology {
 public:
  // This machine, with PCI devices (to find a GPU's node).
  static HostTopology from_system();
  // hwloc's synthetic description, e.g. "pack:2 numa:1 core:4 pu:1" (no PCI devices). Throws zero3::Error
  // quoting the description when hwloc rejects it.
  static HostTopology from_synthetic(std::string_view description);
  // An hwloc XML export (which may contain PCI devices), as text. Throws zero3::Error with the start of the
  // text when hwloc cannot read it. Neither a synthetic nor an XML topology is "this system": memory
  // binding is never attempted on them.
  static HostTopology from_xml(std::string_view xml);
  ~HostTopology();
  HostTopology(HostTopology&&) noexcept;
  HostTopology& operator=(HostTopology&&) noexcept;

  int numa_node_count() const;
  // OS processor indices of the NUMA node with this logical index (0-based); UsageError when out of range.
  std::vector<int> node_cpus(int node) const;
  // Logical index of the NUMA node whose locality contains the PCI device with this bus id
  // ("0000:3b:00.0", as cudaDeviceGetPCIBusId writes it; case-insensitive); nullopt when the topology has
  // no such device or it is not attached below a single node.
  std::optional<int> node_of_pci_device(std::string_view bus_id) const;
  // Logical index of the NUMA node holding most of these OS processors (ties: the lower index); nullopt for
  // an empty set or one that meets no node's processors.
  std::optional<int> node_of_cpus(const std::vector<int>& cpus) const;
  // A one-line summary ("2 NUMA nodes: node 0 cpus 0-3, node 1 cpus 4-7").
  std::string describe() const;

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  explicit HostTopology(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct NumaPlacement {
  int node = 0;           // logical NUMA node index
  std::vector<int> cpus;  // the cores for the optimizer threads: the node's, within the process's CPU set
                          // when the two overlap, else all of the node's (else the process's CPU set,
                          // when a cgroup leaves the node none)
  std::string reason;     // "closest to GPU 0000:3b:00.0", "node of the rank's CPU set", ...
};

// The node for a rank: the GPU's when gpu_bus_id is given and found; otherwise the node of `rank_cpus`
// (the process's CPU set, as an MPI launcher binds it) when that set is a binding, i.e. does not cover
// every processor of the topology; otherwise ranks spread round-robin by local_rank over the nodes that
// have processors (all nodes when none has).
// Never fails on a topology with at least one node.
NumaPlacement choose_placement(const HostTopology& topology, std::optional<std::string_view> gpu_bus_id,
                               const std::vector<int>& rank_cpus, int local_rank);

// While alive, memory the calling thread allocates and first touches (malloc + mlock, cudaHostAlloc) is
// bound to `node` of `topology` (hwloc membind, thread policy); the previous policy is restored on
// destruction, which must run on the constructing thread while `topology` is alive. Binding that the OS
// refuses is logged once per process and ignored (placement is a performance matter); on a topology that
// is not this machine (synthetic, XML) nothing is attempted. bound() says whether the policy was set.
// UsageError when `node` is out of range.
class ScopedMemoryBinding {
 public:
  ScopedMemoryBinding(const HostTopology& topology, int node);
  ~ScopedMemoryBinding();
  ScopedMemoryBinding(const ScopedMemoryBinding&) = delete;
  ScopedMemoryBinding& operator=(const ScopedMemoryBinding&) = delete;
  bool bound() const { return bound_; }

 private:
  struct Saved;
  std::unique_ptr<Saved> saved_;
  bool bound_ = false;
};

// NUMA node (logical index) holding the page at `ptr`, or nullopt when the OS cannot say (page not yet
// touched, no move_pages support, a topology that is not this machine).
std::optional<int> node_of_memory(const HostTopology& topology, const void* ptr);

}  // namespace zero3::offload
