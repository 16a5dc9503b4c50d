#!/usr/bin/env bash
# `zero3 train` under Slurm (docs/comm.md "Launchers"): a one-node cluster on this host, its slurm.conf,
# munge key and state in a temporary directory, munged, slurmctld and slurmd started here and stopped on
# exit. Checks, at 2 tasks:
#   1. srun --mpi=pmix: the world is read from srun's variables, and the final checkpoint equals that of
#      the same run under mpirun, bit for bit;
#   2. an sbatch job whose srun step is sent SIGTERM (scancel --signal=TERM) ends with 75 and a
#      checkpoint; a second job with --resume latest finishes, and its final checkpoint equals a straight
#      run's;
#   3. srun --mpi=none (no PMI): the job ends non-zero within seconds, and each task says that zero3 needs
#      srun --mpi=pmix, naming the unset PMI variables.
# Usage: slurm_test.sh ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
# Exit 77 (skipped) when not root: the daemons run as root (SlurmUser=root).
# Check 2 prints a row per preempted job: the step logged when the signal was sent, the step the checkpoint
# holds, the exit status, seconds from the signal to the job's end, core files left. The environment
# repeats and resizes it (tools/slurm-preempt-trials.sh; the defaults are the CI test's):
#   SLURM_PREEMPT_TRIALS=1    preempted jobs; the first is resumed and compared, each one must exit 75
#   SLURM_PREEMPT_AFTER=20    the signal follows the metrics line of this step (or a later one) ...
#   SLURM_PREEMPT_JITTER_MS=1000   ... by a random delay below this
#   SLURM_PREEMPT_STEPS=300   steps of each job
#   SLURM_LOG_INTERVAL=10     steps between metrics lines
#   SLURM_PATIENCE_S=120      longest wait for a step to be logged, or for a job to end after its signal
#   SLURM_JOB_CONFIG=         a config to train instead of configs/gpt-tiny-offload.json at micro batch 8
#   SLURM_STRAIGHT_FIRST=     when set, the run never stopped ends before the preempted job starts
#   SLURM_CHECKS="1 2 3"      which checks to run
set -u
source "$(dirname "$0")/../support/skip.sh"
[[ $# -ge 3 ]] || { echo "usage: $0 ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]" >&2; exit 2; }
[[ "$(id -u)" -eq 0 ]] || skip "the test's Slurm daemons run as root (SlurmUser=root); run it as root"
zero3="$(realpath "$1")"
configs="$(realpath "$2")"
mpiexec="$3"
shift 3
mpi_flags=("$@")
here="$(cd "$(dirname "$0")/../mpi" && pwd)"  # ckpt_tensors.py
for tool in munged mungekey slurmctld slurmd srun sbatch scancel sinfo squeue; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (tools/install-deps.sh installs it)"; exit 1; }
done

tmp="$(mktemp -d)"
chmod 755 "$tmp"  # munged wants every directory above its socket searchable by all
daemons=()
straight=""
stop_cluster() {
  [[ -n "$straight" ]] && kill "$straight" 2>/dev/null
  if [[ ${#daemons[@]} -gt 0 ]]; then
    # Jobs first: their slurmstepd outlive slurmd otherwise.
    squeue -h -o %A 2>/dev/null | xargs -r scancel 2>/dev/null
    for _ in $(seq 1 50); do [[ -z "$(squeue -h -o %A 2>/dev/null)" ]] && break; sleep 0.2; done
    for ((i = ${#daemons[@]} - 1; i >= 0; i--)); do kill "${daemons[i]}" 2>/dev/null; done
    wait "${daemons[@]}" 2>/dev/null
  fi
}
trap 'stop_cluster; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"
t_start=$(date +%s)

# ---------------------------------------------------------------- the cluster
node="$(hostname -s)"
port=$((20000 + RANDOM % 20000))  # a pair of ports of its own, beside any Slurm already on the host
mkdir -p "$tmp/munge" "$tmp/state" "$tmp/spool" "$tmp/run"
mungekey --create --keyfile="$tmp/munge/munge.key" || { echo "FAIL: mungekey"; exit 1; }
munged -F --socket="$tmp/munge/socket" --key-file="$tmp/munge/munge.key" --pid-file="$tmp/munge/pid" \
  --seed-file="$tmp/munge/seed" --log-file="$tmp/munge/log" >"$tmp/munged.out" 2>&1 &
daemons+=($!)
cat >"$tmp/slurm.conf" <<EOF
ClusterName=zero3test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/socket
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/slurmctld.log
SlurmdLogFile=$tmp/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc)
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$tmp/slurm.conf"
for _ in $(seq 1 50); do [[ -S "$tmp/munge/socket" ]] && break; sleep 0.1; done
slurmctld -D -f "$SLURM_CONF" >"$tmp/slurmctld.out" 2>&1 &
daemons+=($!)
slurmd -D -f "$SLURM_CONF" >"$tmp/slurmd.out" 2>&1 &
daemons+=($!)
idle=0
for _ in $(seq 1 300); do
  if [[ "$(sinfo -h -n "$node" -o %t 2>/dev/null)" == idle ]]; then idle=1; break; fi
  sleep 0.1
done
if [[ $idle -ne 1 ]]; then
  echo "FAIL: node $node is not idle after 30 s: $(sinfo 2>&1 | tail -n 2)"
  tail -n 5 "$tmp/munge/log" "$tmp/slurmctld.out" "$tmp/slurmd.out" "$tmp/slurmctld.log" "$tmp/slurmd.log" 2>&1
  exit 1
fi
srun --mpi=list 2>&1 | grep -q pmix || { echo "FAIL: srun has no pmix plugin: $(srun --mpi=list 2>&1)"; exit 1; }
echo "cluster: $node idle after $(($(date +%s) - t_start)) s"

trials="${SLURM_PREEMPT_TRIALS:-1}"
after="${SLURM_PREEMPT_AFTER:-20}"
jitter_ms="${SLURM_PREEMPT_JITTER_MS:-1000}"
steps="${SLURM_PREEMPT_STEPS:-300}"
patience_s="${SLURM_PATIENCE_S:-120}"
checks=" ${SLURM_CHECKS:-1 2 3} "
if [[ -n "${SLURM_JOB_CONFIG:-}" ]]; then
  cp "$SLURM_JOB_CONFIG" "$tmp/job.json" || exit 1
else
  python3 - "$configs/gpt-tiny-offload.json" "$tmp/job.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["train_micro_batch_size_per_gpu"] = 8  # 32 = 8 x 2 micro-batches x 2 ranks
json.dump(c, open(sys.argv[2], "w"))
PY
fi
# srun's tasks do not know that they share the cores; mpirun's get the same flag from ZERO3_MPIEXEC_FLAGS.
export OMPI_MCA_mpi_yield_when_idle=1
train=("$zero3" train --progress off --config "$tmp/job.json" --log-interval "${SLURM_LOG_INTERVAL:-10}")
cd "$tmp/run" || exit 1

# ---------------------------------------------------------------- 1. srun --mpi=pmix vs mpirun
if [[ "$checks" == *" 1 "* ]]; then
  timeout 120 srun -n 2 --mpi=pmix "${train[@]}" --steps 20 --save-dir "$tmp/srun20" >"$tmp/srun20.out" 2>&1 ||
    fail "srun --mpi=pmix: exit $?: $(tail -n 5 "$tmp/srun20.out")"
  timeout 120 "$mpiexec" "${mpi_flags[@]}" -np 2 "${train[@]}" --steps 20 --save-dir "$tmp/mpirun20" \
    >"$tmp/mpirun20.out" 2>&1 || fail "mpirun: exit $?: $(tail -n 5 "$tmp/mpirun20.out")"
  grep -q "^zero3 train: .* 2 ranks on" "$tmp/srun20.out" || fail "srun: no 2-rank start line"
  grep -q "job: 2 rank(s) on 1 node(s), 2 on this node (.*); world from srun (SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, .*SLURM_STEP_ID=" "$tmp/srun20.out" ||
    fail "srun: the world is not srun's: $(grep 'job:' "$tmp/srun20.out")"
  grep -q "job: 2 rank(s) on 1 node(s), 2 on this node (.*); world from mpirun" "$tmp/mpirun20.out" ||
    fail "mpirun: the world is not mpirun's: $(grep 'job:' "$tmp/mpirun20.out")"
  if python3 "$here/ckpt_tensors.py" same "$tmp/srun20/global_step20" "$tmp/mpirun20/global_step20" \
    >"$tmp/same20.txt" 2>&1; then
    echo "srun --mpi=pmix: 20 steps at 2 ranks, final checkpoint bitwise equal to mpirun's"
  else
    fail "srun and mpirun checkpoints differ: $(tail -n 3 "$tmp/same20.txt")"
  fi
fi

# ---------------------------------------------------------------- 2. sbatch, preempted and resumed
# job NAME ARGS...: a batch script that runs the 2-task srun step and writes its exit status to NAME.rc
job() {
  local name="$1"
  shift
  {
    echo "#!/bin/bash"
    echo "srun --mpi=pmix $(printf '%q ' "${train[@]}" --steps "$steps" --metrics "$tmp/$name.jsonl" "$@")"
    echo "echo \$? >$tmp/$name.rc"
  } >"$tmp/$name.sh"
  sbatch --parsable -n 2 -J "$name" -o "$tmp/$name.out" -D "$tmp/run" "$tmp/$name.sh"
}
wait_job() {  # wait_job ID SECONDS: until the job left the queue
  for _ in $(seq 1 $(($2 * 5))); do
    [[ -z "$(squeue -h -j "$1" -o %A 2>/dev/null)" ]] && return 0
    sleep 0.2
  done
  return 1
}
last_step() { [[ -s "$1" ]] && tail -n 1 "$1" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step"])'; }
now() { date +%s.%N; }
# preempt NAME SAVE_DIR: submits a job, sends its steps SIGTERM after step $after (plus a random delay), checks
# that it exits 75 with a checkpoint and says so, and prints the table row; sets `tag` to the checkpoint.
preempt() {
  local name="$1" dir="$2" id signal_step="" reached=0 t0 exit_s rc cores
  tag=""
  id="$(job "$name" --save-dir "$dir")"
  for _ in $(seq 1 $((patience_s * 10))); do
    signal_step="$(last_step "$tmp/$name.jsonl" 2>/dev/null)"
    if [[ -n "$signal_step" && "$signal_step" -ge $after ]]; then reached=1; break; fi
    [[ -n "$(squeue -h -j "$id" -o %A 2>/dev/null)" ]] || break
    sleep 0.1
  done
  if [[ $reached -ne 1 ]]; then
    fail "sbatch: job $id ($name) did not reach step $after: $(tail -n 5 "$tmp/$name.out")"
    scancel "$id" 2>/dev/null
    wait_job "$id" "$patience_s"
    return
  fi
  sleep "$(awk -v r=$RANDOM -v j="$jitter_ms" 'BEGIN { printf "%.3f", r / 32768 * j / 1000 }')"
  signal_step="$(last_step "$tmp/$name.jsonl" 2>/dev/null)"
  t0="$(now)"
  scancel --signal=TERM "$id" || fail "scancel --signal=TERM $id: exit $?"
  wait_job "$id" "$patience_s" || fail "sbatch: job $id ($name) still queued $patience_s s after the signal"
  exit_s="$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')"
  rc="$(cat "$tmp/$name.rc" 2>/dev/null)"
  [[ "$rc" == 75 ]] || fail "sbatch: the preempted step of $name exited '$rc', not 75: $(tail -n 5 "$tmp/$name.out")"
  tag="$(cat "$dir/latest" 2>/dev/null)"
  [[ -n "$tag" && "${tag#global_step}" -ge $after && "${tag#global_step}" -lt $steps ]] ||
    fail "sbatch: latest of $name is '$tag' after the signal"
  grep -q "preempted: stopped on SIGTERM after step ${tag#global_step} of $steps" "$tmp/$name.out" ||
    fail "sbatch: no 'preempted' line from $name: $(tail -n 5 "$tmp/$name.out")"
  cores="$(find "$tmp/run" -maxdepth 1 -name 'core*' | wc -l)"
  [[ "$cores" -eq 0 ]] || fail "sbatch: $name left $cores core file(s) in $tmp/run"
  printf '| %-13s | %10s | %11s | %4s | %13s | %5s |\n' "$name" "$signal_step" "${tag#global_step}" "$rc" "$exit_s" "$cores"
}

if [[ "$checks" == *" 2 "* ]]; then
  "$mpiexec" "${mpi_flags[@]}" -np 2 "${train[@]}" --steps "$steps" --save-dir "$tmp/straight" \
    >"$tmp/straight.out" 2>&1 &
  straight=$!
  if [[ -n "${SLURM_STRAIGHT_FIRST:-}" ]]; then  # one job at a time: a real shape's ranks do not fit twice
    wait "$straight" || fail "straight mpirun run: exit $?: $(tail -n 3 "$tmp/straight.out")"
    straight=""
  fi
  echo "| job           | signalled  | stopped     | exit | signal->end s | cores |"
  echo "|---------------|------------|-------------|------|---------------|-------|"
  preempt preempted "$tmp/ck"
  if [[ -n "$tag" ]]; then
    id="$(job resumed --save-dir "$tmp/ck" --resume latest)"
    wait_job "$id" $((patience_s + 80)) || fail "sbatch: resumed job $id still queued after $((patience_s + 80)) s"
    rc="$(cat "$tmp/resumed.rc" 2>/dev/null)"
    [[ "$rc" == 0 ]] || fail "sbatch: the resumed step exited '$rc': $(tail -n 5 "$tmp/resumed.out")"
    grep -q "resumed from checkpoint '$tag'" "$tmp/resumed.out" || fail "sbatch: no resume line"
  fi
  if [[ -n "$straight" ]]; then
    wait "$straight" || fail "straight mpirun run: exit $?: $(tail -n 3 "$tmp/straight.out")"
    straight=""
  fi
  if python3 "$here/ckpt_tensors.py" same "$tmp/straight/global_step$steps" "$tmp/ck/global_step$steps" \
    >"$tmp/same$steps.txt" 2>&1; then
    echo "sbatch: SIGTERM after step ${tag#global_step} (exit 75), resumed to $steps: bitwise equal to a straight run"
  else
    fail "sbatch: the resumed run's checkpoint differs from the straight run's: $(tail -n 3 "$tmp/same$steps.txt")"
  fi
  rm -rf "$tmp/straight" "$tmp/ck"
  for ((trial = 2; trial <= trials; trial++)); do
    preempt "preempted-$trial" "$tmp/ck-$trial"
    rm -rf "$tmp/ck-$trial"
  done
fi

# ---------------------------------------------------------------- 3. srun --mpi=none
if [[ "$checks" == *" 3 "* ]]; then
  t0=$(date +%s)
  timeout 60 srun -n 2 --mpi=none "${train[@]}" --steps 20 >"$tmp/nopmi.out" 2>&1
  rc=$?
  elapsed=$(($(date +%s) - t0))
  [[ $rc -ne 0 && $rc -ne 124 ]] || fail "srun --mpi=none: exit $rc"
  [[ $elapsed -le 30 ]] || fail "srun --mpi=none: took $elapsed s"
  for r in 0 1; do
    grep -q "srun started this task as rank $r of 2 (SLURM_PROCID=$r, SLURM_STEP_NUM_TASKS=2) without a PMI: PMIX_RANK, PMI_RANK, PMI_FD are unset.*zero3 needs srun --mpi=pmix" "$tmp/nopmi.out" ||
      fail "srun --mpi=none: task $r does not say what is missing: $(head -n 3 "$tmp/nopmi.out")"
  done
  grep -q "^done:" "$tmp/nopmi.out" && fail "srun --mpi=none: a task trained"
  echo "srun --mpi=none: exit $rc after $elapsed s, each task names the missing PMI"
fi

echo "slurm: $(($(date +%s) - t_start)) s"
finish "slurm launchers: all checks passed"
