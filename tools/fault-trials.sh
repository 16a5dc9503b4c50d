#!/usr/bin/env bash
# The fault-injection cases of tests/mpi/fault_test.sh, 10 trials each at zero3.comm.timeout_s = 20, with a
# table: trials, exits all non-zero, time to exit (median / max), what `zero3 debug flight` named.
# Usage: tools/fault-trials.sh [BUILD_DIR]   (default build; needs bin/zero3 and mpirun)
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
FAULT_TRIALS="${FAULT_TRIALS:-10}" FAULT_TIMEOUT_S="${FAULT_TIMEOUT_S:-20}" FAULT_TABLE=1 \
  exec bash "$root/tests/mpi/fault_test.sh" "$build/bin/zero3" "$root/configs" mpirun \
  --allow-run-as-root --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
