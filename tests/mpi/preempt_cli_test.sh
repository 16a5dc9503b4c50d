#!/usr/bin/env bash
# Preemption and events through `zero3 train` (docs/train.md "Preemption", "Events"), 2 ranks, bf16, CPU
# offload of the optimizer, 2 micro-batches per step, zero3.alerts.command appending its stdin to a file:
#   1. SIGTERM to every rank (as a scheduler does) at a random step: exit 75, a checkpoint of the step the
#      ranks agreed on, events preempt_requested and preempt_checkpoint in the run directory (--save-dir)
#      and at the alert command; resumed from it, the run ends bitwise equal to a straight run (every
#      tensor, the training state, the logged numbers after the stop);
#   2. SIGUSR1 to mpirun, which forwards it to the ranks: the same;
#   3. no --save-dir: exit 75, "nothing saved" in the event in --run-dir;
#   4. a second signal (rank 1 is stopped, so rank 0 cannot finish its step): rank 0 exits at once with
#      128 + 15 and the job ends within seconds, without a checkpoint;
#   5. a fatal error (a resume from a missing checkpoint): exit 1, a train_failed event in the default run
#      directory (./zero3-run), and the alert command got it;
#   6. SIGTERM to every rank, again and again for 0.8 s (within the repeat window), from the moment the run
#      printed its final report: the ranks still shut down the engine and MPI then, and the run exits 0;
#   7. a full disk (a small tmpfs, where it can be mounted) under the preemption save: exit 1, and the error
#      says the run stopped early with its checkpoint lost, not that training completed.
# In 1 and 2 the stop step's metrics record is the last one written.
# Usage: preempt_cli_test.sh ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -u
zero3="$(realpath "$1")"
configs="$(realpath "$2")"
mpiexec="$3"
shift 3
mpi_flags=("$@")
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
launcher=""
trap '[[ -n "$launcher" ]] && kill -9 "$launcher" 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"
steps=300
cd "$tmp" || exit 1  # the default run directory, ./zero3-run, lands here

python3 - "$configs/gpt-tiny-offload.json" "$tmp" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["train_micro_batch_size_per_gpu"] = 8  # 32 = 8 x 2 micro-batches x 2 ranks
c["zero3"]["alerts"] = {"command": f"cat >> {sys.argv[2]}/alerts.jsonl"}
json.dump(c, open(f"{sys.argv[2]}/job.json", "w"))
PY

# start NAME ARGS...: the 2-rank job in the background ($launcher), output in $tmp/NAME.out
start() {
  local name="$1"
  shift
  "$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off --config "$tmp/job.json" --steps "$steps" \
    --log-interval 10 --heldout-samples 16 "$@" >"$tmp/$name.out" 2>&1 &
  launcher=$!
}
job_status() {  # the job's exit status
  wait "$launcher"
  local code=$?
  launcher=""
  return $code
}
ranks() { pgrep -P "$launcher" -f "zero3 train"; }
wait_for_step() {  # wait_for_step METRICS STEP: until the job logged STEP (at most 120 s, while it runs)
  for _ in $(seq 1 1200); do
    kill -0 "$launcher" 2>/dev/null || return 1
    if [[ -s "$1" ]] && (($(tail -n 1 "$1" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step"])') >= $2)); then
      return 0
    fi
    sleep 0.1
  done
  return 1
}
curve() {  # the logged numbers of steps > $2 in metrics file $1
  python3 - "$1" "$2" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["step"] > int(sys.argv[2]):
        print(r["step"], repr(r["loss"]), repr(r["heldout_loss"]), repr(r["grad_norm"]), repr(r["lr"]))
PY
}
has_event() {  # has_event FILE KIND TEXT: a line of FILE is an event of KIND whose message contains TEXT
  python3 - "$@" <<'PY'
import json, sys
path, kind, text = sys.argv[1:4]
try:
    lines = [json.loads(l) for l in open(path)]
except (OSError, ValueError) as e:
    print(f"{path}: {e}")
    sys.exit(1)
sys.exit(0 if any(e["kind"] == kind and text in e["message"] for e in lines) else 1)
PY
}

start straight --save-dir "$tmp/straight" --metrics "$tmp/straight.jsonl"
job_status || fail "straight run: $(tail -n 3 "$tmp/straight.out")"

# preempt NAME HOW: a job stopped at a random step by HOW (ranks: SIGTERM to each rank; mpirun: SIGUSR1 to
# mpirun), checked, then resumed and compared with the straight run.
preempt() {
  local name="$1" how="$2" d="$tmp/$1"
  local at=$((RANDOM % 180 + 20))
  : >"$tmp/alerts.jsonl"
  start "$name" --save-dir "$d" --metrics "$tmp/$name.jsonl"
  wait_for_step "$tmp/$name.jsonl" "$at" ||
    { fail "$name: step $at not reached: $(tail -n 3 "$tmp/$name.out")"; job_status; return; }
  if [[ "$how" == ranks ]]; then
    for pid in $(ranks); do kill -TERM "$pid"; done
  else
    kill -USR1 "$launcher"
  fi
  job_status
  local code=$?
  [[ $code -eq 75 ]] || { fail "$name: exit $code, not 75: $(tail -n 5 "$tmp/$name.out")"; return; }
  local tag
  tag="$(cat "$d/latest" 2>/dev/null)"
  local stop="${tag#global_step}"
  [[ -n "$tag" && "$stop" -ge "$at" && "$stop" -lt "$steps" ]] || { fail "$name: latest '$tag' after step $at"; return; }
  local logged
  logged="$(tail -n 1 "$tmp/$name.jsonl" | python3 -c 'import json,sys; print(json.loads(sys.stdin.read())["step"])')"
  [[ "$logged" == "$stop" ]] || fail "$name: the last metrics record is step $logged, not the stop step $stop"
  grep -q "preempted: stopped on .* after step $stop of $steps; checkpoint" "$tmp/$name.out" ||
    fail "$name: no 'preempted' line"
  has_event "$d/events.jsonl" preempt_requested "stops after step $stop" || fail "$name: no preempt_requested event"
  has_event "$d/events.jsonl" preempt_checkpoint "$d/$tag" || fail "$name: no preempt_checkpoint event naming $d/$tag"
  has_event "$tmp/alerts.jsonl" preempt_checkpoint "$d/$tag" || fail "$name: the alert command did not get the event"
  "$zero3" ckpt info "$d" >/dev/null 2>&1 || fail "$name: the checkpoint does not verify"
  start "$name-resumed" --save-dir "$d" --resume latest --metrics "$tmp/$name-resumed.jsonl"
  job_status || { fail "$name: resumed run: $(tail -n 3 "$tmp/$name-resumed.out")"; return; }
  grep -q "resumed from checkpoint '$tag'" "$tmp/$name-resumed.out" || fail "$name: no resume line"
  python3 "$here/ckpt_tensors.py" same "$tmp/straight/global_step$steps" "$d/global_step$steps" >"$tmp/$name.same" ||
    fail "$name: final checkpoints differ: $(cat "$tmp/$name.same")"
  [[ "$(python3 "$here/ckpt_tensors.py" state "$tmp/straight/global_step$steps" | sed 's/"data":[^,]*,//')" == \
     "$(python3 "$here/ckpt_tensors.py" state "$d/global_step$steps" | sed 's/"data":[^,]*,//')" ]] ||
    fail "$name: final training state differs"
  [[ "$(curve "$tmp/straight.jsonl" "$stop")" == "$(curve "$tmp/$name-resumed.jsonl" "$stop")" ]] ||
    fail "$name: logged numbers differ after the resume"
  echo "$name: signalled after step $at, stopped after step $stop (exit 75), resumed to $steps: bitwise equal"
}
preempt sigterm-ranks ranks
preempt sigusr1-mpirun mpirun

# 3. No --save-dir.
start nosave --run-dir "$tmp/nosave-run" --metrics "$tmp/nosave.jsonl"
wait_for_step "$tmp/nosave.jsonl" 20 || fail "nosave: step 20 not reached"
for pid in $(ranks); do kill -TERM "$pid"; done
job_status
code=$?
[[ $code -eq 75 ]] || fail "nosave: exit $code, not 75"
has_event "$tmp/nosave-run/events.jsonl" preempt_nothing_saved "nothing saved (no --save-dir)" ||
  fail "nosave: no preempt_nothing_saved event: $(cat "$tmp/nosave-run/events.jsonl" 2>&1 | head -c 600)"
grep -q "nothing saved" "$tmp/nosave.out" || fail "nosave: the output does not say that nothing was saved"
[[ ! -e zero3-run ]] || fail "nosave: ./zero3-run was created although --run-dir was given"

# 4. A second signal exits at once: rank 1 is stopped, so rank 0 cannot finish its step.
start second --save-dir "$tmp/second" --metrics "$tmp/second.jsonl"
wait_for_step "$tmp/second.jsonl" 20 || fail "second: step 20 not reached"
mapfile -t pids < <(ranks)
rank0=""
rank1=""
for pid in "${pids[@]}"; do
  if tr '\0' '\n' <"/proc/$pid/environ" | grep -qx "OMPI_COMM_WORLD_RANK=0"; then rank0=$pid; else rank1=$pid; fi
done
kill -STOP "$rank1"
kill -TERM "$rank0"
sleep 1.5  # past the repeat window (1 s): the next one is a second request
t0=$(date +%s.%N)
kill -TERM "$rank0"
for _ in $(seq 1 100); do kill -0 "$rank0" 2>/dev/null || break; sleep 0.1; done
elapsed=$(python3 -c "import sys; print(round($(date +%s.%N) - $t0, 2))")
kill -0 "$rank0" 2>/dev/null && fail "second: rank 0 still runs 10 s after the second signal"
kill -CONT "$rank1" 2>/dev/null
job_status
code=$?
[[ $code -ne 0 && $code -ne 75 ]] || fail "second: exit $code (0 or 75 claim a clean stop)"
grep -q "zero3 rank 0: SIGTERM received again: exiting at once" "$tmp/second.out" || fail "second: no 'exiting at once' notice"
[[ ! -e "$tmp/second/latest" ]] || fail "second: a checkpoint was written"
echo "second signal: rank 0 exited $elapsed s after it; the job's exit status $code"

# 5. A fatal error is an event, and the alert command gets it.
: >"$tmp/alerts.jsonl"
"$zero3" train --progress off --config "$tmp/job.json" --steps 2 --resume "$tmp/missing" >"$tmp/fatal.out" 2>&1
code=$?
[[ $code -eq 1 ]] || fail "fatal: exit $code, not 1"
has_event "$tmp/zero3-run/events.jsonl" train_failed "no checkpoint at" || fail "fatal: no train_failed event"
has_event "$tmp/alerts.jsonl" train_failed "no checkpoint at" || fail "fatal: the alert command did not get it"
[[ "$(grep -c "no checkpoint at" "$tmp/fatal.out")" -eq 1 ]] || fail "fatal: the error is not printed exactly once"

# 6. Stop signals during the shut-down after the final report change nothing.
steps=20
start finished --metrics "$tmp/finished.jsonl"
for _ in $(seq 1 1200); do
  grep -q "^done: " "$tmp/finished.out" 2>/dev/null && break
  kill -0 "$launcher" 2>/dev/null || break
  sleep 0.01
done
mapfile -t pids < <(ranks)
t0=$(date +%s%N)
while (($(date +%s%N) - t0 < 800000000)); do
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  sleep 0.02
done
job_status
code=$?
[[ $code -eq 0 ]] || fail "finished: SIGTERM after the final report gave exit $code, not 0: $(tail -n 3 "$tmp/finished.out")"
echo "signals after the final report: exit $code"

# 7. The preemption save on a full disk.
steps=300
mkdir -p "$tmp/full"
if mount -t tmpfs -o size=64k tmpfs "$tmp/full" 2>/dev/null; then
  start fullsave --save-dir "$tmp/full/ckpt" --run-dir "$tmp/full-run" --metrics "$tmp/fullsave.jsonl"
  wait_for_step "$tmp/fullsave.jsonl" 20 || fail "fullsave: step 20 not reached"
  for pid in $(ranks); do kill -TERM "$pid"; done
  job_status
  code=$?
  [[ $code -eq 1 ]] || fail "fullsave: exit $code, not 1"
  grep -q "stopped on SIGTERM after step [0-9]* of $steps, but its checkpoint could not be saved" "$tmp/fullsave.out" ||
    fail "fullsave: no error saying the stop's checkpoint was lost: $(tail -n 3 "$tmp/fullsave.out")"
  if grep -q "training itself completed" "$tmp/fullsave.out"; then fail "fullsave: claims training completed"; fi
  umount "$tmp/full"
  echo "preemption save on a full disk: exit $code, the lost checkpoint named"
else
  echo "preemption save on a full disk: skipped (cannot mount a tmpfs here)"
fi

finish "preemption CLI: all checks passed"
