#!/usr/bin/env bash
# NVMe offload of the optimizer and the params under kill -9 (docs/offload.md, "When a rank dies"):
#   1. mid-update: a 2-rank job saving at every step; rank 1 kills itself (SIGKILL) in the middle of step 4's
#      update, once the first slice's new state is on its way to the files (ZERO3_FAULT=kill_in_update). The
#      job ends, non-zero, within the time limit; the dead rank's directory is left under nvme_path (and the
#      other rank's, when the launcher's SIGKILL ends it); the next job there removes each exactly once (its
#      ranks race for them) with a warning naming it, resumes from the last committed checkpoint and ends with
#      the params, master and moments of an uninterrupted run, bit for bit; nothing of zero3's is left after;
#   2. at random moments: kill -9 of a random rank of a running job, 3 trials; each time the next job removes
#      what the dead ranks left and resumes.
# Usage: nvme_kill_test.sh ZERO3_BINARY CONFIGS_DIR MPIEXEC [MPIEXEC_FLAGS...]
set -u
zero3="$1"
configs="$2"
mpiexec="$3"
shift 3
mpi_flags=("$@")
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/checks.sh"
run() {  # run ARGS...: zero3 train at 2 ranks, quiet, at most 300 s
  timeout 300 "$mpiexec" "${mpi_flags[@]}" -np 2 "$zero3" train --progress off "$@"
}
leftovers() {  # the zero3 directories under $1
  find "$1" -mindepth 1 -maxdepth 1 -name 'zero3-*' -printf '%f\n' | sort
}
ranks() {  # the pids of the ranks of jobs on the test's config
  pgrep -f "^$zero3 train --progress off --config $tmp/nvme.json"
}
wait_ranks_gone() {  # the launcher may return while the ranks it killed are still exiting
  for _ in $(seq 1 60); do
    [[ -z "$(ranks)" ]] && return 0
    sleep 0.5
  done
  fail "ranks still running 30 s after their launcher ended: $(ranks | tr '\n' ' ')"
}

nvme="$tmp/nvme"
mkdir -p "$nvme"
python3 - "$configs/gpt-tiny-ondevice.json" "$tmp/nvme.json" "$nvme" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["train_batch_size"] = 8
c["train_micro_batch_size_per_gpu"] = 2  # 2 micro-batches per window: gradient logs are in play too
c.pop("gradient_accumulation_steps", None)
c["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": sys.argv[3], "pipeline_read": True,
                                               "pipeline_write": True}
c["zero_optimization"]["sub_group_size"] = 4096  # many slices: the kill lands with most of the update to do
# The params on NVMe too, every sharded unit in the file: the update writes them as well.
c["zero_optimization"]["offload_param"] = {"device": "nvme", "nvme_path": sys.argv[3], "max_in_cpu": 0,
                                           "buffer_count": 2}
json.dump(c, open(sys.argv[2], "w"))
PY

# 1. Killed in the middle of an update.
d="$tmp/mid"
mkdir -p "$d"
run --config "$tmp/nvme.json" --steps 8 --save-dir "$d/straight" >"$d/straight.out" 2>&1 ||
  fail "uninterrupted run: $(tail -n 3 "$d/straight.out")"
[[ -z "$(leftovers "$nvme")" ]] || fail "an uninterrupted run left $(leftovers "$nvme")"
started=$(date +%s)
ZERO3_FAULT=kill_in_update:rank=1:step=3 run --config "$tmp/nvme.json" --steps 8 --save-dir "$d/split" \
  --save-interval 1 >"$d/killed.out" 2>&1
code=$?
elapsed=$(($(date +%s) - started))
wait_ranks_gone
[[ $code -ne 0 ]] || fail "killed run: exit 0"
[[ $code -ne 124 ]] || fail "killed run: still running after 300 s"
# Saves commit asynchronously: the last one committed before the kill is step 3's or an earlier one.
latest="$(cat "$d/split/latest" 2>/dev/null)"
[[ "$latest" =~ ^global_step[123]$ ]] || fail "killed run: latest is '$latest', not a save of steps 1 to 3"
orphans=$(leftovers "$nvme" | grep -c 'rank1$')
[[ "$orphans" -eq 2 ]] ||
  fail "killed run: expected the dead rank 1's two directories (optimizer, params) under nvme_path, found: $(leftovers "$nvme")"
echo "killed in step 4's update: exit $code after ${elapsed} s; left under nvme_path: $(leftovers "$nvme" | tr '\n' ' ')"
left="$(leftovers "$nvme")"
run --config "$tmp/nvme.json" --steps 8 --save-dir "$d/split" --resume latest >"$d/resumed.out" 2>&1 ||
  fail "resume after the kill: $(tail -n 3 "$d/resumed.out")"
for name in $left; do
  grep -q "NVMe offload: removed .*/$name (.* files) of a job on this host whose process [0-9]* is gone" \
    "$d/resumed.out" || fail "resume: no warning naming the removed $name"
done
[[ -z "$(leftovers "$nvme")" ]] || fail "after the resumed run: $(leftovers "$nvme") left under nvme_path"
python3 "$here/ckpt_tensors.py" same "$d/straight/global_step8" "$d/split/global_step8" >"$d/same.out" ||
  fail "resumed after the kill: final checkpoint differs from the uninterrupted run's: $(cat "$d/same.out")"
echo "resumed: orphans removed with a warning; final params, master and moments equal the uninterrupted run's"

# 2. kill -9 of a random rank at a random moment.
for trial in 1 2 3; do
  d="$tmp/random$trial"
  mkdir -p "$d"
  run --config "$tmp/nvme.json" --steps 200 --save-dir "$d/ckpt" --save-interval 1 --log-interval 1000 \
    >"$d/run.out" 2>&1 &
  launcher=$!
  sleep "$(python3 -c "import random; print(round(random.uniform(2.0, 5.0), 2))")"
  victim=$(ranks | shuf -n 1)
  [[ -n "$victim" ]] && kill -9 "$victim"
  wait "$launcher" 2>/dev/null
  wait_ranks_gone
  left="$(leftovers "$nvme")"
  [[ -n "$left" ]] || fail "random trial $trial: the dead rank left no directory (was it killed?)"
  run --config "$tmp/nvme.json" --steps 1 --save-dir "$d/ckpt2" \
    $([[ -f "$d/ckpt/latest" ]] && echo "--resume $d/ckpt") >"$d/next.out" 2>&1 ||
    fail "random trial $trial: the next job failed: $(tail -n 3 "$d/next.out")"
  [[ -z "$(leftovers "$nvme")" ]] || fail "random trial $trial: $(leftovers "$nvme") left after the next job"
  echo "random trial $trial: killed pid $victim; the next job removed: $(echo $left | tr '\n' ' ')"
done

finish "nvme kill: all checks passed"
