#!/usr/bin/env bash
# Two jobs with one --save-dir (docs/checkpoints.md, "One job per save directory"), 2 ranks each:
#   1. while job A trains and saves into DIR, job B given the same DIR exits 2 within seconds on every rank,
#      naming DIR and A's rank 0 (its pid), without writing into DIR (A's events.jsonl gets no event of B);
#      A goes on and its checkpoints verify;
#   2. A is killed with kill -9: the lock died with it, and job C resumes from A's latest and saves into DIR.
# Usage: save_dir_lock_test.sh ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -u
zero3="$(realpath "$1")"
configs="$(realpath "$2")"
mpiexec="$3"
shift 3
mpi_flags=("$@")
tmp="$(mktemp -d)"
job_a=""
ranks_a() { pgrep -f "zero3 train .*--steps 100000"; }  # job A's mpirun and ranks (mpirun runs in a subshell)
trap '[[ -n "$job_a" ]] && pkill -9 -f "zero3 train .*--steps 100000"; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"
dir="$tmp/ckpt"
train() {  # train NAME ARGS...: a 2-rank job, output in $tmp/NAME.out
  local name="$1"
  shift
  "$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off --config "$configs/gpt-tiny-offload.json" \
    --save-dir "$dir" --save-interval 10 --log-interval 5 "$@" >"$tmp/$name.out" 2>&1
}

train a --steps 100000 --metrics "$tmp/a.jsonl" &
job_a=$!
for _ in $(seq 1 600); do
  [[ -s "$dir/latest" ]] && break
  kill -0 "$job_a" 2>/dev/null || break
  sleep 0.1
done
[[ -s "$dir/latest" ]] || fail "job A saved nothing: $(tail -n 3 "$tmp/a.out")"
rank0=""
for pid in $(ranks_a); do
  tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=0" && rank0=$pid
done
[[ -n "$rank0" ]] || fail "job A's rank 0 not found"

t0=$(date +%s)
timeout 120 bash -c "$(declare -f train); $(declare -p mpiexec mpi_flags zero3 configs tmp dir); train b --steps 5"
code=$?
elapsed=$(($(date +%s) - t0))
[[ $code -eq 2 ]] || fail "job B: exit $code, not 2: $(tail -n 3 "$tmp/b.out")"
grep -q "save-dir $dir: another job is using this checkpoint directory (pid $rank0 on host" "$tmp/b.out" ||
  fail "job B: the refusal does not name $dir and A's rank 0 (pid $rank0): $(tail -n 3 "$tmp/b.out")"
kill -0 "$job_a" 2>/dev/null || fail "job A ended when B was refused: $(tail -n 3 "$tmp/a.out")"
if grep -q '"kind": *"train_failed"' "$dir/events.jsonl" 2>/dev/null; then fail "B wrote an event into A's run directory"; fi
echo "job B refused after $elapsed s (exit $code); A (rank 0 pid $rank0) goes on"
sleep 1
"$zero3" ckpt info "$dir" >/dev/null 2>&1 || fail "A's latest checkpoint does not verify"

for pid in $(ranks_a); do tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=" && kill -9 "$pid"; done
wait "$job_a" 2>/dev/null
job_a=""
last="$(cat "$dir/latest")"
end=$((${last#global_step} + 3))
train c --resume latest --steps "$end" || fail "job C after A was killed: $(tail -n 3 "$tmp/c.out")"
[[ "$(cat "$dir/latest" 2>/dev/null)" == "global_step$end" ]] || fail "job C did not save into $dir"
echo "job A killed at $last; job C resumed in $dir and saved global_step$end"

finish "save directory lock: all checks passed"
