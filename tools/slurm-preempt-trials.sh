#!/usr/bin/env bash
# Preemption under Slurm, repeated: tests/launchers/slurm_test.sh's sbatch check (a 2-task `srun --mpi=pmix
# zero3 train` step sent SIGTERM by `scancel --signal=TERM` at a random moment after a given step), TRIALS
# times, core dumps enabled, with its table: for each job the step logged at the signal, the step the
# checkpoint holds, the exit status (75 expected), seconds from the signal to the job's end, core files.
# The first job is also resumed and compared bit for bit with a run never stopped. As root (the test's
# one-node cluster runs its daemons as root).
# Usage: tools/slurm-preempt-trials.sh [BUILD_DIR] [TRIALS] [CONFIG]
#   default: build, 20 trials of the test's tiny GPT (300 steps, the signal after step 20 plus up to 1 s).
#   With CONFIG (a real shape, say configs/smollm-135m.json) each job runs SLURM_PREEMPT_STEPS (default 3)
#   steps, logs every step and is signalled after step SLURM_PREEMPT_AFTER (default 1) plus up to
#   SLURM_PREEMPT_JITTER_MS (default: 30000) ms, so the signal falls inside a step; the run never stopped
#   goes first, alone (two 2-rank jobs of a real shape need twice the memory).
set -u
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
export SLURM_PREEMPT_TRIALS="${2:-20}"
if [[ -n "${3:-}" ]]; then
  export SLURM_JOB_CONFIG="$(realpath "$3")"
  export SLURM_PREEMPT_STEPS="${SLURM_PREEMPT_STEPS:-3}" SLURM_PREEMPT_AFTER="${SLURM_PREEMPT_AFTER:-1}"
  export SLURM_PREEMPT_JITTER_MS="${SLURM_PREEMPT_JITTER_MS:-30000}" SLURM_LOG_INTERVAL=1
  export SLURM_PATIENCE_S="${SLURM_PATIENCE_S:-900}" SLURM_STRAIGHT_FIRST=1
fi
export SLURM_CHECKS=2
ulimit -c unlimited
exec bash "$root/tests/launchers/slurm_test.sh" "$build/bin/zero3" "$root/configs" mpirun \
  --allow-run-as-root --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
