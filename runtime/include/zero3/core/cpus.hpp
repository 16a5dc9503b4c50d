// The CPUs this process may run on: the mask a launcher's binding (mpirun binds each rank to a core or a
// package by default, Slurm's --cpu-bind, taskset, a container's cpuset) leaves it.
//
//   const std::vector<int> cpus = zero3::process_cpus();   // {0, 1} unbound on a 2-CPU machine
#pragma once

#include <vector>

namespace zero3 {

// The OS processor indices this process may run on (sched_getaffinity), ascending; never empty. Throws
// zero3::Error when the kernel refuses.
std::vector<int> process_cpus();

}  // namespace zero3
