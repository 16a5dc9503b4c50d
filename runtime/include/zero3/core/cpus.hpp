// The CPUs this process may run on, and how many compute threads a rank should start from them. A launcher
// that binds ranks (mpirun binds each rank to a core or a package by default, Slurm's --cpu-bind, taskset,
// a container's cpuset) gives each process a CPU mask smaller than the machine; thread pools sized from
// std::thread::hardware_concurrency() then oversubscribe the mask (and oneTBB warns that it limits the
// workers). Sizes come from the mask instead.
//
//   models::set_blas_threads(zero3::compute_threads(world.local_size));
#pragma once

#include <vector>

namespace zero3 {

// The OS processor indices this process may run on (sched_getaffinity), ascending; never empty. Throws
// zero3::Error when the kernel refuses.
std::vector<int> process_cpus();

// The compute threads for one of `ranks_on_node` ranks of this node (>= 1): the process's CPUs divided
// among the node's ranks, as if they all share this mask (the unbound case: every rank sees every CPU).
// Under a per-rank binding each mask is small already, and the division gives at least one thread; where
// ranks share a mask it never puts more threads on it than it has CPUs. `ranks_on_node` < 1 counts as 1.
int compute_threads(int ranks_on_node);

}  // namespace zero3
